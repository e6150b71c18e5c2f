"""The depth experiment on text (docs/results.md): a narrow model on Python's docs at byte level
(python prepare.py --tokenizer=bytes), 300 steps of 16 x 128 bytes, one CPU thread a run, at the
depth --n_layer gives it:
    python train.py config/depth_text.py --n_layer=8 --out_dir=out/depth_text/L8_static_s1
It is also lab/text.py's model, which sets the depth, rates, steps and start itself.
"""
out_dir = 'out/depth_text/L32_static_s1'
data_dir = 'data/pydoc_bytes'
device = 'cpu'
eval_interval = 50
eval_iters = 10
log_interval = 25
n_layer = 32
n_head = 4
n_embd = 64
vocab_size = 257
block_size = 128
router = 'static'
router_init = 'identity'  # not the authors' start: the better at depth (config/deep.py says why)
batch_size = 16
gradient_accumulation_steps = 1
learning_rate = 3e-3
router_lr = 3e-3  # 1x the base rate: the text grid's choice for static (docs/results.md)
max_iters = 300
warmup_iters = 30
min_lr = 3e-4
