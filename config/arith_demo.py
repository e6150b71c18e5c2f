"""The class demonstration (lab/demo.py): config/arith.py's tiny model (4 layers, 4 heads, width
32), 3,000 steps of 8 x 256 characters on the data of `python -m lab.arith --mode=prepare`, with a
validation loss every 250 steps to draw. About 5 minutes of one CPU core per run; the baseline and
static LIMe train side by side, one core each:
    python -m lab.demo
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
router = 'static'
batch_size = 8
gradient_accumulation_steps = 1
learning_rate = 1e-2
router_lr = 1e-1
weight_decay = 0.1
max_iters = 3000
warmup_iters = 100
min_lr = 1e-3
