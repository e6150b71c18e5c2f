"""A few million tokens of your own text on one GPU: the three routers side by side in minutes.
Sized for about 4M GPT-2 tokens (e.g. 3.9M of English: Shakespeare, Milton and 8,000 short
paragraphs), tokenized into data/small_text:
    python prepare.py --input a.jsonl.gz b.jsonl.gz --out_dir=data/small_text
    bash lab/compare.sh config/small_text.py          # none, static, dynamic, then their loss curves
Why this size: with ~3.7M training tokens, data is the limit, not compute. 12 layers of 384 (28M
parameters besides the 19M of the embedding) see 700 steps x 16K tokens = 11.5M tokens, about 3
epochs (3.6 PFLOP: under a minute of an H100 even at 10% MFU, plus compiling). Few enough repeats
that the model still learns (repeated data is worth nearly as much as fresh for the first ~4
epochs, Muennighoff et al. 2023), and the validation loss on held-out documents shows it if the
model starts to memorise instead (train loss falling away from it). Twelve layers rather than
fewer, wider ones: LIMe's claims are about depth.
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
learning_rate = 1e-3  # the paper's
router_lr = 1e-3  # 1x the base rate: the text grid's choice for static (docs/results.md)
max_iters = 700
warmup_iters = 50
min_lr = 1e-4
