"""GPT-2-small shape (12 layers, 768 wide, 12 heads, 1024 tokens) on FineWeb-Edu, about 1B tokens:
    python prepare.py --source fineweb --max_tokens 1B
    python train.py config/gpt2.py --router=none     # then static, dynamic
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py
"""
out_dir = 'out/gpt2'
batch_size = 32
gradient_accumulation_steps = 16  # 32 x 1024 x 16 = 524,288 tokens per step
max_iters = 2000  # about 1.05B tokens
eval_interval = 200
