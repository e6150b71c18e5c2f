"""
sample.py: generate text from a checkpoint written by train.py, with the model's KV cache, decoded
with the tokenizer the run trained with (GPT-2 BPE or bytes: train.py saves which).

    python sample.py --out_dir=out/cpu_demo
    python sample.py --out_dir=out/cpu_demo --start="The for statement" --temperature=0
    python sample.py --out_dir=out/cpu_demo --start=FILE:prompt.txt --max_new_tokens=500
"""
import os

import torch

from configurator import configure, fail, or_fail, read_text
from lime import load_model
from prepare import BYTES_DOC, decode_bytes, gpt2_encoding

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
# -----------------------------------------------------------------------------
config, given, autocast = configure(globals(), {
    'path': ['out_dir'], 'text': ['start'], 'positive': ['num_samples', 'max_new_tokens'],
    'non-negative': ['temperature', 'top_k'], 'seed': ['seed'], 'device': ['device'],
    ('bfloat16', 'float32'): ['dtype']})
globals().update(config)
if 0 < temperature < 1e-6:  # float32 logits over such a temperature overflow to inf
    fail(f"temperature={temperature} is greedy in all but name: give --temperature=0")
torch.manual_seed(seed)

if start.startswith('FILE:'):
    start = read_text(start[len('FILE:'):], 'prompt file')
model, checkpoint = or_fail(load_model, os.path.join(out_dir, 'ckpt.pt'), device)
tokenizer = checkpoint['config'].get('tokenizer', 'gpt2')  # as train.py saved it
if tokenizer == 'bytes':  # any bytes are tokens: a command line's that are not UTF-8 reach
    # Python as surrogates (a Latin-1 terminal's é), which give them back
    prompt = start.encode(errors='surrogateescape')
    start_ids = [BYTES_DOC] if start == '<|endoftext|>' else list(prompt)
    decode = decode_bytes
elif tokenizer == 'gpt2' and model.config.vocab_size == 50257:
    enc = or_fail(gpt2_encoding)
    start_ids = enc.encode(start, allowed_special={'<|endoftext|>'})
    decode = enc.decode
else:
    fail(f"the model in {out_dir} was trained on {tokenizer} tokens, a vocabulary of "
         f"{model.config.vocab_size}: sample.py decodes GPT-2's (50257) and bytes")
if not start_ids:
    fail("the prompt is empty: give some text with --start (the default starts a new document)")
idx = torch.tensor([start_ids] * num_samples, dtype=torch.long, device=device)  # (num_samples, T)

with autocast:
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k or None)
for row in out.tolist():
    print(decode(row))
    print('---------------')
