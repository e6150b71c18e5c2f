"""An 8-layer static LIMe model on Python's docs in GPT-2 tokens (python prepare.py), about five
minutes on two CPU cores (docs/results.md's CPU-demo scale):  python train.py config/pydoc_bpe.py
"""
out_dir = 'out/pydoc_bpe'
data_dir = 'data/pydoc'
device = 'cpu'
eval_interval = 50
eval_iters = 6  # the whole validation split: 6 x 1,024 of its 6,173 tokens
log_interval = 10
n_layer = 8
n_head = 4
n_embd = 128
block_size = 128
batch_size = 8
gradient_accumulation_steps = 1
learning_rate = 3e-3  # a model this small trains well with a higher rate than the paper's 1e-3
router_lr = 3e-2
max_iters = 250
warmup_iters = 25
min_lr = 3e-4
