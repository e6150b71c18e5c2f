"""The paper's 1.2B model and recipe: 16 layers, 2048 wide, 32 heads (8 KV heads for its GQA variant:
--n_kv_head=8), SwiGLU 8192, 2048 tokens, batches of 1024 sequences, 20,000 steps (~42B tokens).
That is days on one GPU: spread it with torchrun, or shorten it with --max_iters.
    torchrun --standalone --nproc_per_node=8 train.py config/paper_1b.py --router=static
"""
out_dir = 'out/paper_1b'
data_dir = 'data/fineweb_edu'
n_layer = 16
n_head = 32
n_embd = 2048
mlp_hidden = 8192
block_size = 2048
batch_size = 4
gradient_accumulation_steps = 256  # 4 x 256 = 1024 sequences = 2.1M tokens per step
max_iters = 20000
warmup_iters = 200
eval_interval = 500
