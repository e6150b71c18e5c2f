"""The paper's tiny model for the Arithmetic Expression Task (Sec. 5.3.2) on the data of
`python -m lab.arith --mode=prepare`; about 10 minutes on one CPU core (the paper trains longer):
    python train.py config/arith.py --router=static --out_dir=out/arith_static
    python -m lab.arith --mode=eval --ckpt_dir=out/arith_static
"""
out_dir = 'out/arith'
data_dir = 'data/arith'
device = 'cpu'  # the model is too small to keep a GPU busy; --device=cuda works too
eval_interval = 500
eval_iters = 10
log_interval = 100
n_layer = 4
n_head = 4
n_embd = 32
vocab_size = 18  # len(arith.VOCAB); the model pads its embedding to 64 rows and never predicts those
block_size = 256  # about 7 examples; the longest (6 operators, ~105 tokens) fits with room to spare
batch_size = 8  # small batches, many steps: the model learns the mod-11 tables after ~1500-2500 steps
gradient_accumulation_steps = 1
learning_rate = 1e-2  # a model this small, trained this briefly, learns faster than with the paper's 1e-3
router_lr = 1e-1  # 10x the base rate, as in the paper
max_iters = 3000
warmup_iters = 100
min_lr = 1e-3
