"""The paper's 1.2B model and recipe (--n_kv_head=8 for its GQA variant), ~42B tokens: days on one
GPU, so spread it with torchrun or shorten it with --max_iters.
    torchrun --standalone --nproc_per_node=8 train.py config/paper_1b.py --router=static
"""
out_dir = 'out/paper_1b'
n_layer = 16
n_head = 32
n_embd = 2048
mlp_hidden = 8192
block_size = 2048
batch_size = 4
gradient_accumulation_steps = 256  # 4 x 256 = 1024 sequences = 2.1M tokens per step
eval_interval = 500
