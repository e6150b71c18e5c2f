"""The paper's tiny model for the Arithmetic Expression Task (4 layers, 4 heads, width 32; Sec. 5.3.2) on
the data of `python -m lab.arith --mode=prepare`. About 10 minutes on one CPU core (OMP_NUM_THREADS=1 is
faster than two threads on a busy machine):
    python train.py config/arith.py --router=none --out_dir=out/arith_none
    python train.py config/arith.py --router=static --out_dir=out/arith_static
    python -m lab.arith --mode=eval --ckpt_dir=out/arith_static
The paper trains far longer (200 epochs of 50,000 examples per tier, lr 1e-3 decaying linearly).
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
router = 'static'
batch_size = 8  # small batches, many steps: the model learns the mod-11 tables after ~1500-2500 steps
gradient_accumulation_steps = 1
learning_rate = 1e-2  # a model this small, trained this briefly, learns faster than with the paper's 1e-3
router_lr = 1e-1  # 10x the base rate, as in the paper
weight_decay = 0.1
max_iters = 3000
warmup_iters = 100
min_lr = 1e-3
