"""About 4M GPT-2 tokens of your own text on one GPU: the three routers side by side in minutes.
    python prepare.py --input a.jsonl.gz b.jsonl.gz --out_dir=data/small_text
    bash lab/compare.sh config/small_text.py          # none, static, dynamic, then their loss curves
Why this size: data is the limit, not compute. 700 steps x 16K tokens is about 3 epochs, few
enough repeats that the model still learns (Muennighoff et al. 2023); 12 layers, not fewer and
wider, since LIMe's claims are about depth.
"""
out_dir = 'out/small_text'
data_dir = 'data/small_text'
eval_interval = 50
eval_iters = 12  # 12 x 16K tokens: about the whole validation split of 4M tokens of text
log_interval = 10
n_layer = 12
n_head = 6
n_embd = 384
block_size = 512
batch_size = 32
gradient_accumulation_steps = 1
router_lr = 1e-3  # 1x the base rate: the text grid's choice for static (docs/results.md)
max_iters = 700
warmup_iters = 50
min_lr = 1e-4
