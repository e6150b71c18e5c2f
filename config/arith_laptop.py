"""The laptop experiment (docs/laptop_experiment.md): config/arith.py's model at 8 layers, 6-8
minutes of one CPU core a run. All runs, then the tables and the figure: bash lab/laptop.sh
"""
out_dir = 'out/laptop_arith/static_s1'
data_dir = 'data/arith'
device = 'cpu'
eval_interval = 500
eval_iters = 10
log_interval = 100
n_layer = 8  # where static LIMe gained most at 3,000 steps in docs/results.md (commit c1b8e95)
n_head = 4
n_embd = 32
vocab_size = 18
block_size = 256
batch_size = 8
gradient_accumulation_steps = 1
learning_rate = 1e-2
router_lr = 1e-1
max_iters = 3000  # at 1,500 neither static seed learnt the tables (docs/laptop_experiment.md)
warmup_iters = 100
min_lr = 1e-3
