"""
sample.py: generate text from a checkpoint written by train.py, with the model's KV cache.

    python sample.py --out_dir=out/cpu_demo
    python sample.py --out_dir=out/cpu_demo --start="The for statement" --num_samples=1 --temperature=0
    python sample.py --out_dir=out/cpu_demo --start=FILE:prompt.txt --max_new_tokens=500
"""
import os
import sys

import tiktoken
import torch

from configurator import apply_overrides, fail, load_model, resolve_device

# -----------------------------------------------------------------------------
out_dir = 'out'  # the directory holding ckpt.pt
start = '<|endoftext|>'  # the prompt: text, or FILE:path to read it from; the default starts a document
num_samples = 3
max_new_tokens = 200
temperature = 0.8  # < 1 sharpens the distribution, > 1 flattens it; 0 always takes the likeliest token
top_k = 200  # sample only among the top_k likeliest tokens; 0 means all of them
seed = 1337
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16'  # 'bfloat16' (autocast) or 'float32'; on a CPU the default becomes float32
# -----------------------------------------------------------------------------
config = {k: v for k, v in globals().items() if not k.startswith('_') and type(v) in (int, float, bool, str)}
given = apply_overrides(config, sys.argv[1:])
device_type, autocast = resolve_device(config, given)
globals().update(config)

if num_samples <= 0 or max_new_tokens <= 0 or temperature < 0 or top_k < 0:
    fail("num_samples and max_new_tokens must be positive, temperature and top_k not negative")
torch.manual_seed(seed)

if start.startswith('FILE:'):
    path = start[len('FILE:'):]
    if not os.path.isfile(path):
        fail(f"prompt file not found: {path}")
    with open(path, encoding='utf-8') as f:
        start = f.read()
enc = tiktoken.get_encoding('gpt2')
start_ids = enc.encode(start, allowed_special={'<|endoftext|>'})
if not start_ids:
    fail("the prompt is empty: give some text with --start (the default starts a new document)")

ckpt_path = os.path.join(out_dir, 'ckpt.pt')
model, checkpoint = load_model(ckpt_path, device)
if model.config.vocab_size != 50257:
    fail(f"{ckpt_path} was trained on a vocabulary of {model.config.vocab_size} tokens, "
         "not GPT-2's 50257: sample.py can't decode it")
idx = torch.tensor([start_ids] * num_samples, dtype=torch.long, device=device)  # (num_samples, T)

with autocast:
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k or None)
for row in out.tolist():
    print(enc.decode(row))
    print('---------------')
