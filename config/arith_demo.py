"""The class demonstration: config/arith.py's model, a validation loss every 250 steps to draw;
about 5 minutes of one CPU core a run (`python -m lab.demo` trains none and static side by side).
"""
out_dir = 'out/demo/static_s1'
data_dir = 'data/arith'
device = 'cpu'
eval_interval = 250  # twelve points on each curve
eval_iters = 10
log_interval = 100
n_layer = 4
n_head = 4
n_embd = 32
vocab_size = 18
block_size = 256
batch_size = 8
gradient_accumulation_steps = 1
learning_rate = 1e-2
router_lr = 1e-1
max_iters = 3000
warmup_iters = 100
min_lr = 1e-3
