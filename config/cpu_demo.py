"""The quick start: a small static LIMe model on Python's documentation at byte level (train.py
prepares data/pydoc_bytes if it is missing), under three minutes on two CPU cores:
    python train.py config/cpu_demo.py && python sample.py --out_dir=out/cpu_demo
The log's bits per byte are over its first 20,480 validation targets; `python -m lab.evaluate`
scores every whole window of 128 (22,016 targets, the last 1,536 easier text), so it reports less:
2.2069 against the log's 2.2200 (two threads, 2026-11-27).
"""
out_dir = 'out/cpu_demo'
data_dir = 'data/pydoc_bytes'
device = 'cpu'
eval_interval = 100
eval_iters = 10  # 10 x 2,048: all but the last 1,657 of the validation split's 22,137 tokens
log_interval = 50
n_layer = 6
n_head = 4
n_embd = 128
vocab_size = 257  # 256 bytes and the document start
block_size = 128
batch_size = 16
gradient_accumulation_steps = 1
learning_rate = 3e-3  # a model this small trains well with a higher rate than the paper's 1e-3
router_lr = 3e-3  # 1x the base rate: the text grid's choice for static (docs/results.md)
max_iters = 900  # ~2.3 passes over the 415K training bytes
warmup_iters = 50
min_lr = 3e-4
