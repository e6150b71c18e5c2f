"""
sample.py: generate text from a checkpoint written by train.py, with the model's KV cache, decoded
with the tokenizer the run trained with (GPT-2 BPE or bytes: train.py saves which).

    python sample.py --out_dir=out/cpu_demo
    python sample.py --out_dir=out/cpu_demo --start="The for statement" --temperature=0
    python sample.py --out_dir=out/cpu_demo --start=FILE:prompt.txt --max_new_tokens=500

A --start that is not UTF-8 (typed in a Latin-1 terminal) is taken as its bytes: as they are by
the byte tokenizer, with U+FFFD for those that are not UTF-8 by GPT-2's, with a note.
"""
from configurator import configure, fail, or_fail, read_text  # first: Ctrl-C is one line

import os
import sys

import torch

from lime import load_model
from memory_limits import check_memory
from prepare import BYTES_DOC, BYTES_VOCAB, decode_bytes, gpt2_encoding

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
# The tokenizer the model was trained with, as train.py saved it (earlier runs: GPT-2's).
saved = checkpoint.get('config')
tokenizer = saved.get('tokenizer', 'gpt2') if isinstance(saved, dict) else 'gpt2'
vocab_size = {'gpt2': 50257, 'bytes': BYTES_VOCAB}.get(tokenizer)
if vocab_size is None:
    fail(f"{out_dir}/ckpt.pt names a tokenizer sample.py does not know: {tokenizer!r}")
if model.config.vocab_size != vocab_size:
    fail(f"the model in {out_dir} has a vocabulary of {model.config.vocab_size} tokens, not the "
         f"{vocab_size} of its tokenizer ({tokenizer}): sample.py can't decode it")
# A command line's bytes that are not UTF-8 (a Latin-1 terminal's é) reach Python as U+DC80 to
# U+DCFF (surrogateescape), which give those bytes back; any other surrogate is no text at all.
try:
    prompt = start.encode('utf-8', 'surrogateescape')
except UnicodeEncodeError as e:
    fail(f"the prompt holds {start[e.start:e.end]!r}, half of a UTF-16 pair: not text")
if tokenizer == 'bytes':  # any bytes are tokens
    start_ids = [BYTES_DOC] if start == '<|endoftext|>' else list(prompt)
    decode = decode_bytes
else:
    enc = or_fail(gpt2_encoding)
    text = prompt.decode('utf-8', errors='replace')
    if text != start:
        print(f"note: the prompt is not UTF-8 ({prompt!r}): GPT-2's tokenizer reads it with U+FFFD "
              "for the bytes that are not", file=sys.stderr)  # beside load_model's line
    start_ids = enc.encode(text, allowed_special={'<|endoftext|>'})
    decode = enc.decode
if not start_ids:
    fail("the prompt is empty: give some text with --start (the default starts a new document)")
# Each sample holds a KV cache (keys and values of every layer, block_size long), its tokens, the
# logits of its prompt, and at each new token a copy of its logits (GPT.generate):
# more samples than the memory left beside the model (loaded, so held already) are refused now.
cfg = model.config
cache_bytes = 2 * cfg.n_layer * cfg.n_kv_head * cfg.block_size * (cfg.n_embd // cfg.n_head)
cache_bytes *= 2 if dtype == 'bfloat16' else 4
prompt_bytes = 8 * len(start_ids) + 4 * cfg.padded_vocab * min(len(start_ids), cfg.block_size)
check_memory(num_samples * (cache_bytes + prompt_bytes + 4 * cfg.vocab_size), device,
             f"--num_samples={num_samples}: their KV caches and logits", "sample fewer at once")
idx = torch.tensor([start_ids] * num_samples, dtype=torch.long, device=device)  # (num_samples, T)

with autocast:
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k or None)
for row in out.tolist():
    print(decode(row))
    print('---------------')
