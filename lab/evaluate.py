"""
evaluate.py: score a checkpoint beyond its validation loss: multiple-choice accuracy (HellaSwag, or
any task in one JSON-lines format) as build-nanogpt's hellaswag.py scores it, and, given a data
directory, bits per byte. train.py scores its mc_task with TaskScorer. The paper's Table 1 (lm-eval's
own HellaSwag among its tasks) is lab/table1.py's. From the repo root (docs/evaluation.md says more):

    python -m lab.evaluate --out_dir=out/gpt2/static --task=hellaswag  # downloads the validation split
    python -m lab.evaluate --out_dir=out/gpt2/static --task=cloze.jsonl --max_examples=100
    python -m lab.evaluate --out_dir=out/cpu_demo --task= --data_dir=data/pydoc_bytes  # bits per byte

A task file holds one example a line, {"context": "...", "endings": ["...", ...], "label": k}
(HellaSwag's lines, with "ctx", too). An ending is scored by its summed loss after the context:
`acc` picks the least sum, `acc_norm` the least per token (not favouring short endings).
"""
import json
import math
import os
import sys
import urllib.request

import numpy as np
import torch
import torch.nn.functional as F

from bookkeeping import write_whole
from configurator import configure, fail, or_fail, read_text
from lime import load_model
from prepare import EOT, gpt2_encoding, nats_and_bytes, read_shard, shard_paths, token_bytes

# -----------------------------------------------------------------------------
out_dir = 'out'  # the directory holding ckpt.pt
task = 'hellaswag'  # 'hellaswag' (downloaded on first use), a JSON-lines task file, or '' for none
max_examples = 0  # score only the task's first this many examples; 0 = all of them
data_dir = ''  # a directory of token shards: report bits per byte on its validation shard; '' = don't
batch_size = 8  # sequences of block_size tokens per forward, for bits per byte
cache_dir = 'data/tasks'  # where downloaded tasks are kept
hellaswag_url = 'https://raw.githubusercontent.com/rowanz/hellaswag/master/data'  # its authors' repo
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16'  # 'bfloat16' (autocast) or 'float32'; on a CPU the default becomes float32
compile = True  # torch.compile, every forward padded to block_size; on a CPU the default is False
# -----------------------------------------------------------------------------


def task_file(name):
    """The path of a task: HellaSwag's validation split in cache_dir (downloaded if missing, and
    then written whole or not at all, its directory made only for it), or name itself."""
    if name != 'hellaswag':
        if not os.path.isfile(name):
            fail(f"task file not found: {name} (give --task=hellaswag or a JSON-lines file of "
                 '{"context": ..., "endings": [...], "label": k})')
        return name
    path = os.path.join(cache_dir, 'hellaswag_val.jsonl')
    url = f"{hellaswag_url}/hellaswag_val.jsonl"
    if not os.path.isfile(path):
        print(f"downloading {url} to {path}", file=sys.stderr)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
            os.makedirs(cache_dir, exist_ok=True)
            write_whole(path, lambda f: f.write(data))
        except (OSError, ValueError) as e:  # urllib's URLError is an OSError
            fail(f"could not download {url} ({getattr(e, 'reason', None) or e}); without a "
                 f"network, fetch it elsewhere and put it at {path}")
    return path


def read_examples(path):
    """The examples of a JSON-lines task file, as (context, endings, label) tuples."""
    shape = '{"context": text, "endings": [two or more texts], "label": index of the right ending}'
    examples = []
    for n, line in enumerate(read_text(path, 'task file').split('\n'), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            fail(f"{path}:{n}: not a JSON object ({e})")
        record = record if isinstance(record, dict) else {}
        context = record.get('context', record.get('ctx'))  # HellaSwag's lines name it ctx
        endings = record.get('endings')
        label = record.get('label')
        if not (isinstance(context, str) and isinstance(endings, list) and len(endings) >= 2
                and all(isinstance(e, str) for e in endings) and type(label) is int
                and 0 <= label < len(endings)):
            fail(f"{path}:{n}: expected {shape}")
        empty = [k for k, ending in enumerate(endings) if not ending.strip()]
        if empty:  # it would be scored on no token of its own, or on a space, and win every time
            fail(f"{path}:{n}: ending {empty[0]} holds no text to score")
        examples.append((context, endings, label))
    if not examples:
        fail(f"{path} holds no examples")
    return examples


def encode_example(enc, example, block_size):
    """One (tokens, mask) per ending: the context's tokens then the ending's, the mask 1 on the
    ending's, cut on the left to block_size + 1 tokens (the inputs are all but the last)."""
    context, endings, _ = example
    stripped = context.rstrip()
    ctx = enc.encode_ordinary(stripped) or [EOT]  # the first token is predicted from something
    rows = []
    for ending in endings:
        space = '' if not context or context[-1:].isspace() or ending[:1].isspace() else ' '
        end = enc.encode_ordinary(context[len(stripped):] + space + ending)
        tokens = (ctx + end)[-(block_size + 1):]
        mask = ([0] * len(ctx) + [1] * len(end))[-(block_size + 1):]
        rows.append((tokens, mask))
    return rows


@torch.no_grad()
def score_endings(model, rows, device, autocast, length=None, n_rows=None):
    """(summed, per-token) loss of each ending, in one forward: rows padded on the right (which
    leaves a causal model's logits before it as they were) to the longest, or to length x n_rows."""
    L = length or max(len(tokens) for tokens, _ in rows)
    tokens = torch.zeros((n_rows or len(rows), L), dtype=torch.long)
    mask = torch.zeros(tokens.shape)
    for i, (t, m) in enumerate(rows):
        tokens[i, :len(t)], mask[i, :len(m)] = torch.tensor(t), torch.tensor(m, dtype=torch.float)
    tokens, mask = tokens.to(device), mask.to(device)
    with autocast:
        logits, _ = model(tokens[:, :-1])
    losses = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten(), reduction='none')
    losses = losses.view(len(tokens), L - 1) * mask[:, 1:]  # the ending's tokens only
    summed = losses.sum(1)[:len(rows)].cpu()
    return summed, summed / mask[:len(rows), 1:].sum(1).cpu()


@torch.no_grad()
def bits_per_byte(model, tokens, byte_counts, block_size, batch_size, device, autocast):
    """(bits per byte, tokens scored) over every whole window of block_size + 1 tokens (each
    overlapping the next by one); byte_counts: token_bytes's, as a tensor on device."""
    T, windows = block_size, (len(tokens) - 1) // block_size
    nats = nbytes = 0.0
    for i in range(0, windows, batch_size):
        B = min(batch_size, windows - i)
        buf = torch.from_numpy(tokens[i * T:(i + B) * T + 1].astype(np.int64)).to(device)
        with autocast:
            logits, _ = model(buf[:-1].view(B, T))
        losses = F.cross_entropy(logits.float().flatten(0, 1), buf[1:], reduction='none')
        n, b = nats_and_bytes(losses, buf[1:], byte_counts)
        nats += n
        nbytes += b
    return nats / (math.log(2) * nbytes), windows * T


class TaskScorer:
    """train.py's multiple-choice scoring (its mc_task): this process's share of the task's first
    n examples, encoded once; score() gives the accuracies over all processes' shares."""

    def __init__(self, task, n, vocab_size, block_size, rank=0, world_size=1):
        if vocab_size != EOT + 1:  # before a download, which such a model has no use for
            fail(f"the model's vocab_size is {vocab_size}, not GPT-2's {EOT + 1}: tasks are "
                 "tokenized with GPT-2's BPE (--task= scores none)")
        enc = or_fail(gpt2_encoding)
        examples = read_examples(task_file(task))[:n]
        mine = examples[rank::world_size]
        self.encoded = [encode_example(enc, example, block_size) for example in mine]
        self.labels = [label for *_, label in mine]
        self.n, self.name, self.block_size = len(examples), os.path.basename(task), block_size

    @classmethod
    def for_training(cls, config, rank, world_size):
        """The scorer of train.py's mc_task, after checking the keys that set it up."""
        if not config['mc_task']:
            fail("mc_interval needs mc_task: 'hellaswag' or a task file")
        if config['mc_interval'] % config['eval_interval']:
            fail(f"mc_interval ({config['mc_interval']}) must be a multiple of eval_interval "
                 f"({config['eval_interval']})")
        return cls(config['mc_task'], config['mc_examples'], config['vocab_size'],
                   config['block_size'], rank, world_size)

    def score(self, model, device, autocast, compiled):
        """(acc, acc_norm): the shares of examples whose right ending has the least summed loss,
        and the least per token (the first least, in a tie), model in eval mode meanwhile.
        compiled pads every forward to block_size + 1 tokens and the most endings of any example."""
        length = self.block_size + 1 if compiled else None
        n_rows = max(map(len, self.encoded), default=0) if compiled else None
        right = [0, 0]
        model.eval()
        for rows, label in zip(self.encoded, self.labels):
            for i, losses in enumerate(score_endings(model, rows, device, autocast, length, n_rows)):
                right[i] += int(losses.argmin()) == label
        model.train()
        counts = torch.tensor(right, dtype=torch.float64, device=device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(counts)  # the processes score disjoint shares
        return tuple(counts.div(self.n).tolist())


def main():
    config, _, autocast = configure(globals(), {
        'path': ['out_dir', 'cache_dir', 'hellaswag_url'], 'text': ['task', 'data_dir'],
        'positive': ['batch_size'], 'non-negative': ['max_examples'], 'device': ['device'],
        ('bfloat16', 'float32'): ['dtype']})
    globals().update(config)
    if not task and not data_dir:
        fail("nothing to evaluate: give --task, --data_dir, or both")
    # The checkpoint, then the task, before any scoring.
    model, checkpoint = or_fail(load_model, os.path.join(out_dir, 'ckpt.pt'), device)
    vocab_size, block_size = model.config.vocab_size, model.config.block_size
    scorer = TaskScorer(task, max_examples or None, vocab_size, block_size) if task else None
    result = {'out_dir': out_dir, 'step': checkpoint['step']}
    if data_dir:
        path = or_fail(shard_paths, data_dir, 'val')[0]
        tokens = or_fail(read_shard, path, vocab_size)
        if len(tokens) <= block_size:
            fail(f"{path} holds {len(tokens)} tokens, fewer than one sequence of block_size + 1")
        byte_counts, why = or_fail(token_bytes, vocab_size, data_dir)
        if byte_counts is None:
            print(f"note: no bits per byte: {why}")
        else:
            byte_counts = torch.from_numpy(byte_counts).to(device)
            bpb, n = bits_per_byte(model, tokens, byte_counts, block_size, batch_size, device, autocast)
            if not math.isfinite(bpb):  # the weights are finite (load_model): the logits overflow
                fail(f"{path}: the bits per byte came out {bpb}, not a result (in {dtype}: "
                     "--dtype=float32 has more range)")
            print(f"{path}: {bpb:.4f} bits per byte ({n:,} tokens)")
            result.update(bpb=bpb, bpb_tokens=n)
    if scorer:
        acc, acc_norm = scorer.score(torch.compile(model) if compile else model, device, autocast,
                                     compile)
        print(f"{scorer.name}: acc {acc:.4f} | acc_norm {acc_norm:.4f} | {scorer.n:,} examples")
        result.update(task=scorer.name, acc=acc, acc_norm=acc_norm, examples=scorer.n)
    print(json.dumps(result))  # every number in it is finite: bits per byte is checked above


if __name__ == '__main__':
    main()
