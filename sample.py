"""
sample.py: generate text from a checkpoint written by train.py, with the model's KV cache.

    python sample.py --out_dir=out/cpu_demo
    python sample.py --out_dir=out/cpu_demo --start="The for statement" --temperature=0
    python sample.py --out_dir=out/cpu_demo --start=FILE:prompt.txt --max_new_tokens=500
"""
import os

import torch

from configurator import configure, fail, or_fail, read_text
from lime import load_model, use_fused_kernels
from prepare import gpt2_encoding

# -----------------------------------------------------------------------------
out_dir = 'out'  # the directory holding ckpt.pt
start = '<|endoftext|>'  # the prompt: text, or FILE:path to read it; the default starts a document
num_samples = 3
max_new_tokens = 200
temperature = 0.8  # < 1 sharpens the distribution, > 1 flattens it; 0 takes the likeliest token
top_k = 200  # sample only among the top_k likeliest tokens; 0 means all of them
seed = 1337
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16'  # 'bfloat16' (autocast) or 'float32'; on a CPU the default becomes float32
fused = None  # LIMe's mix: None = the fastest tested (kernels/cpu.py on a CPU), True = Triton
# -----------------------------------------------------------------------------
config, given, autocast = configure(globals(), {
    'path': ['out_dir'], 'text': ['start'], 'positive': ['num_samples', 'max_new_tokens'],
    'non-negative': ['temperature', 'top_k'], 'seed': ['seed'], 'device': ['device'],
    ('bfloat16', 'float32'): ['dtype']})
globals().update(config)
torch.manual_seed(seed)

if start.startswith('FILE:'):
    start = read_text(start[len('FILE:'):], 'prompt file')
enc = or_fail(gpt2_encoding)
start_ids = enc.encode(start, allowed_special={'<|endoftext|>'})
if not start_ids:
    fail("the prompt is empty: give some text with --start (the default starts a new document)")

or_fail(use_fused_kernels, fused, device)
model, checkpoint = or_fail(load_model, os.path.join(out_dir, 'ckpt.pt'), device)
if model.config.vocab_size != 50257:
    fail(f"the model in {out_dir} has a vocabulary of {model.config.vocab_size} tokens, not "
         "GPT-2's 50257: sample.py can't decode it")
idx = torch.tensor([start_ids] * num_samples, dtype=torch.long, device=device)  # (num_samples, T)

with autocast:
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k or None)
for row in out.tolist():
    print(enc.decode(row))
    print('---------------')
