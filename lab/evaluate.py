"""
evaluate.py: score a checkpoint beyond its validation loss: accuracy on multiple-choice benchmarks
(HellaSwag, or any task in one JSON-lines format) and, given a data directory, bits per byte. The
scoring functions here are also what train.py calls to report both during training. From the repo
root (docs/evaluation.md says more):

    python -m lab.evaluate --out_dir=out/gpt2 --task=hellaswag     # downloads the validation split
    python -m lab.evaluate --out_dir=out/gpt2 --task=hellaswag --protocol=harness --shots=1
    python -m lab.evaluate --out_dir=out/gpt2 --task=piqa_val.jsonl --shots=1 \
        --train_file=piqa_train.jsonl
    python -m lab.evaluate --out_dir=out/cpu_demo --task= --data_dir=data/pydoc_bytes  # bits per byte

Multiple choice. A task file holds one example a line, {"context": "...", "endings": ["...", ...],
"label": k} with k the index of the right ending; HellaSwag's own lines ({"activity_label", "ctx_a",
"ctx_b", "ctx", "endings", "label", ...}) are read too. Each ending is scored by the model's summed
cross-entropy on its tokens only, after the context: `acc` picks the ending of least summed loss,
`acc_norm` the least loss per unit of length (which does not favour short endings). --protocol says
how, and which published numbers the scores compare with:

- 'build-nanogpt' (the default; train.py's too): build-nanogpt's hellaswag.py, whose numbers llm.c
  shares (GPT-2 124M: 28.6% acc, 29.5% acc_norm). HellaSwag's context is its `ctx` as it is; the
  ending follows after a space (none where it starts with whitespace); context and ending are
  tokenized apart; acc_norm divides by the ending's tokens.
- 'harness': the Eleuther LM Evaluation Harness's `hellaswag` task, which the LIMe paper's table
  reports (1-shot; GPT-2 124M: 28.9% acc, 31.1% acc_norm). A HellaSwag line's context is rewritten,
  preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()), and each ending
  preprocess(ending), where preprocess strips, makes " [title]" ". ", removes every [...] and
  turns double spaces single (other tasks' lines are used as they are); the ending always follows
  after a space; context + ending is tokenized whole, the ending's tokens being those after the
  context's own; acc_norm divides by the ending's length in characters.

In both, whitespace that ends a context moves to the start of the ending (as in the harness), so
"... he " + "starts" scores ' starts', not 'st', 'arts'; an empty context is <|endoftext|>. All
endings of an example go through the model in one forward, padded on the right (padding cannot
change earlier positions' logits in a causal model); a sequence longer than block_size loses tokens
on the left. With --shots=k, each example is preceded by k solved examples drawn from --train_file
(for hellaswag, its training split), each its context, the joining space and its right ending, all
joined by blank lines: the harness's few-shot format, and its draw (with_shots: --seed 1234, one
generator for the whole run; --shot_draw=k+1 draws k + 1 and drops the example scored, as the
harness does for a task that names no test split, like HellaSwag; k draws k, as for ARC). An ending
must hold some text: an empty one would win.

Bits per byte: the loss in nats summed over the validation shard's tokens, over ln 2 times the UTF-8
bytes those tokens decode to, so that models with different tokenizers compare. <|endoftext|> marks a
document boundary, not text: it has no bytes, and its loss is left out too. For arith.py's data (one
ASCII character a token) each token is one byte; for other vocabularies it is not reported.
"""
import json
import math
import os
import random
import re
import sys
import urllib.request

import numpy as np
import torch
import torch.nn.functional as F

from configurator import configure, fail, or_fail, read_text
from lab import json_line
from lime import load_model
from prepare import EOT, gpt2_encoding, read_shard, shard_paths, token_bytes
from bookkeeping import write_whole

# -----------------------------------------------------------------------------
out_dir = 'out'  # the directory holding ckpt.pt
task = 'hellaswag'  # 'hellaswag' (downloaded on first use), a JSON-lines task file, or '' for none
max_examples = 0  # score only the task's first this many examples; 0 = all of them
shots = 0  # solved examples put before each one (the paper's table is 1-shot)
protocol = 'build-nanogpt'  # multiple choice scored as 'build-nanogpt' or Eleuther's 'harness' does
train_file = ''  # where the solved examples come from (a task file); hellaswag uses its training split
data_dir = ''  # a directory of token shards: report bits per byte on its validation shard; '' = don't
batch_size = 8  # sequences of block_size tokens per forward, for bits per byte
cache_dir = 'data/tasks'  # where downloaded tasks are kept
hellaswag_url = 'https://raw.githubusercontent.com/rowanz/hellaswag/master/data'  # its authors' repo
seed = 1234  # draws the solved examples (the harness's fewshot_random_seed)
shot_draw = 'k+1'  # the harness's draw: 'k+1' (its HellaSwag, PIQA, ...) or 'k' (its ARC)
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16'  # 'bfloat16' (autocast) or 'float32'; on a CPU the default becomes float32
compile = True  # torch.compile the model, every forward padded to block_size; on a CPU the default is False
# -----------------------------------------------------------------------------


# -----------------------------------------------------------------------------
# tasks: files of examples, and HellaSwag's download


def download(url, path):
    """url's file at path, written whole or not at all; one line naming both when it cannot be had."""
    print(f"downloading {url} to {path}", file=sys.stderr)
    try:
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        with urllib.request.urlopen(url, timeout=60) as response:
            write_whole(path, lambda f: f.write(response.read()))
    except (OSError, ValueError) as e:  # urllib's URLError is an OSError
        fail(f"could not download {url} ({getattr(e, 'reason', None) or e}); without a network, fetch it "
             f"elsewhere and put it at {path}")


def task_file(name, split='val'):
    """The path of a task: hellaswag's split in cache_dir (downloaded if missing), or name itself."""
    if name == 'hellaswag':
        path = os.path.join(cache_dir, f'hellaswag_{split}.jsonl')
        if not os.path.isfile(path):
            download(f"{hellaswag_url}/hellaswag_{split}.jsonl", path)
        return path
    if not os.path.isfile(name):
        fail(f"task file not found: {name} (give --task=hellaswag or a JSON-lines file of "
             '{"context": ..., "endings": [...], "label": k})')
    return name


def preprocess(text):
    """The harness's clean-up of HellaSwag's text: WikiHow's [header], [title], [step], ... markers
    go (" [title]" becomes a full stop), and the spaces they leave."""
    text = text.strip().replace(' [title]', '. ')
    return re.sub(r'\[.*?\]', '', text).replace('  ', ' ')


def harness_query(record, where):
    """A HellaSwag line's context as the harness builds it: activity label, ctx_a and ctx_b."""
    fields = [record.get(key) for key in ('activity_label', 'ctx_a', 'ctx_b')]
    if not all(isinstance(field, str) for field in fields):
        fail(f"{where}: --protocol=harness builds a HellaSwag context from its activity_label, "
             "ctx_a and ctx_b (text each), and this line lacks one")
    activity, ctx_a, ctx_b = fields
    return preprocess(f"{activity}: {ctx_a} {ctx_b.capitalize()}")


def read_examples(path, protocol='build-nanogpt'):
    """The examples of a JSON-lines task file as (context, endings, label) tuples, HellaSwag's lines
    rewritten as the protocol has them."""
    shape = '{"context": text, "endings": [two or more texts], "label": index of the right ending}'
    examples = []
    for n, line in enumerate(read_text(path, 'task file').split('\n'), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            fail(f"{path}:{n}: not a JSON object ({e})")
        hellaswag = isinstance(record, dict) and 'ctx' in record and 'context' not in record
        if hellaswag:  # HellaSwag's own line
            record = {**record, 'context': record['ctx']}
        context, endings, label = (record.get(key) for key in ('context', 'endings', 'label')) \
            if isinstance(record, dict) else (None, None, None)
        if isinstance(label, str) and label.isdigit():
            label = int(label)
        if not (isinstance(context, str) and isinstance(endings, list) and len(endings) >= 2
                and all(isinstance(e, str) for e in endings) and type(label) is int
                and 0 <= label < len(endings)):
            fail(f"{path}:{n}: expected {shape}")
        if hellaswag and protocol == 'harness':
            context = harness_query(record, f"{path}:{n}")
            endings = [preprocess(ending) for ending in endings]
        empty = [k for k, ending in enumerate(endings) if not ending.strip()]
        if empty:  # it would be scored on no token of its own, or on a space, and win every time
            fail(f"{path}:{n}: ending {empty[0]} holds no text to score")
        examples.append((context, endings, label))
    if not examples:
        fail(f"{path} holds no examples")
    return examples


def continuation(context, ending, protocol='build-nanogpt'):
    """The text that follows the context: the harness puts a space before every ending,
    build-nanogpt too unless one side already has whitespace there."""
    if protocol == 'harness':
        return ' ' + ending
    return ending if not context or context[-1:].isspace() or ending[:1].isspace() else ' ' + ending


def split_at_whitespace(context, ending, protocol='build-nanogpt'):
    """(context, continuation): the whitespace that ends the context moved to the continuation's
    start, as the harness does, so that it is tokenized with the word after it."""
    follows = continuation(context, ending, protocol)
    stripped = context.rstrip()
    return stripped, context[len(stripped):] + follows


def with_shots(examples, solved, k, seed, protocol='build-nanogpt', draw='k+1'):
    """Each example's context after k solved examples drawn from solved, joined by blank lines.
    The draw is the harness's (lm_eval 0.4.13, api/samplers.py and api/task.py), so that a k-shot
    score is its score: one random.Random(seed) for the whole run, drawing for the examples in
    order (so the first max_examples get the same shots as all of them would). draw='k+1' is what
    the harness does where a task's few-shot split is the split it scores, or neither is named
    (HellaSwag, PIQA, Winogrande, COPA: no test split): k + 1 drawn, every copy of the example
    scored dropped, the first k kept; k drawn again from the others if two copies left fewer.
    draw='k' is its draw for a task that scores a test split and draws from another (ARC): k, no
    check, for solved is another file. A copy is an equal (context, endings, label); the harness
    compares whole records, which for HellaSwag also hold its ind and source_id."""
    extra = draw == 'k+1'
    if len(solved) < k + extra:
        fail(f"--shots={k} draws {k + extra} solved examples (--shot_draw={draw}), but there "
             f"are {len(solved)}")
    rng = random.Random(seed)
    out = []
    for example in examples:
        context, endings, label = example
        if extra:
            drawn = [shot for shot in rng.sample(solved, k + 1) if shot != example][:k]
            if len(drawn) < k:  # the example is in solved twice, and both copies were drawn
                others = [shot for shot in solved if shot != example]
                if len(others) < k:
                    fail(f"--shots={k}: too few solved examples other than the one being scored")
                drawn = rng.sample(others, k)
        else:
            drawn = rng.sample(solved, k)
        prefix = ''.join(c + continuation(c, e[l], protocol) + '\n\n' for c, e, l in drawn)
        out.append((prefix + context, endings, label))
    return out


def task_tokenizer(vocab_size):
    """GPT-2's BPE, which tasks are tokenized with: for models of its vocabulary only."""
    if vocab_size != EOT + 1:
        fail(f"the model's vocab_size is {vocab_size}, not GPT-2's {EOT + 1}: tasks are tokenized with "
             "GPT-2's BPE")
    return or_fail(gpt2_encoding)


def encode_example(enc, example, block_size, protocol='build-nanogpt'):
    """One (tokens, mask, length) per ending: the context's tokens then the ending's, the mask 1 on
    the ending's, cut on the left to block_size + 1 tokens (the inputs are all but the last).
    length is what acc_norm divides the ending's loss by: its tokens that are scored
    (build-nanogpt), or its characters (harness). The harness tokenizes context + ending whole and
    takes as the ending's the tokens after the context's own; build-nanogpt tokenizes them apart."""
    context, endings, _ = example
    rows = []
    for ending in endings:
        text, follows = split_at_whitespace(context, ending, protocol)
        ctx = enc.encode_ordinary(text)
        if protocol == 'harness':
            end = enc.encode_ordinary(text + follows)[len(ctx):]
        else:
            end = enc.encode_ordinary(follows)
        ctx = ctx or [EOT]  # the first token is predicted from something
        tokens = (ctx + end)[-(block_size + 1):]
        mask = ([0] * len(ctx) + [1] * len(end))[-(block_size + 1):]
        rows.append((tokens, mask, len(ending) if protocol == 'harness' else sum(mask[1:])))
    return rows


# -----------------------------------------------------------------------------
# scoring


@torch.no_grad()
def score_endings(model, rows, device, autocast, length=None, n_rows=None):
    """(summed, normalised) loss of each ending, in one forward: the sum over its tokens, and that
    over its length. rows: encode_example's, padded with token 0 (mask 0) to the longest, or to
    length tokens and n_rows rows when given (a compiled model then sees one shape only)."""
    L = length or max(len(tokens) for tokens, *_ in rows)
    E = n_rows or len(rows)
    tokens = torch.zeros((E, L), dtype=torch.long)
    mask = torch.zeros((E, L))
    for i, (t, m, _) in enumerate(rows):
        tokens[i, :len(t)], mask[i, :len(m)] = torch.tensor(t), torch.tensor(m, dtype=torch.float)
    tokens, mask = tokens.to(device), mask.to(device)
    with autocast:
        logits, _ = model(tokens[:, :-1])  # (E, L - 1, vocab)
    losses = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten(), reduction='none')
    losses = losses.view(E, L - 1) * mask[:, 1:]  # the ending's tokens only
    summed = losses.sum(1)[:len(rows)].cpu()
    return summed, summed / torch.tensor([float(length) for *_, length in rows])


def predictions(model, encoded, device, autocast, block_size=None, progress=False):
    """For each example (encode_example's rows), the ending of least summed loss and that of least
    normalised loss (the first, in a tie). block_size pads every forward to block_size + 1 tokens
    and the most endings any example has, for a compiled model."""
    from tqdm import tqdm
    length = block_size and block_size + 1
    n_rows = max(map(len, encoded), default=0) if block_size else None
    picks = []
    for rows in tqdm(encoded, disable=not progress, unit='example'):
        summed, norm = score_endings(model, rows, device, autocast, length, n_rows)
        picks.append((int(summed.argmin()), int(norm.argmin())))
    return picks


def multiple_choice(model, encoded, labels, device, autocast, block_size=None, progress=False):
    """(examples right by summed loss, right by normalised loss, examples)."""
    picks = predictions(model, encoded, device, autocast, block_size, progress)
    right = sum(pick == label for (pick, _), label in zip(picks, labels))
    right_norm = sum(pick == label for (_, pick), label in zip(picks, labels))
    return right, right_norm, len(encoded)


def nats_and_bytes(logits, targets, byte_lengths):
    """The loss in nats summed over the targets that are text, and the bytes of their text."""
    nbytes = byte_lengths[targets]  # (B, T)
    losses = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction='none')
    return (losses * (nbytes.flatten() > 0)).sum().item(), nbytes.sum().item()


@torch.no_grad()
def bits_per_byte(model, tokens, byte_lengths, block_size, batch_size, device, autocast):
    """Over all whole windows of block_size + 1 tokens (each overlapping the next by one) of tokens."""
    T, windows = block_size, (len(tokens) - 1) // block_size
    nats = nbytes = 0
    for i in range(0, windows, batch_size):
        B = min(batch_size, windows - i)
        buf = torch.from_numpy(tokens[i * T:(i + B) * T + 1].astype(np.int64)).to(device)
        with autocast:
            logits, _ = model(buf[:-1].view(B, T))
        n, b = nats_and_bytes(logits, buf[1:].view(B, T), byte_lengths)
        nats, nbytes = nats + n, nbytes + b
    return nats / (math.log(2) * nbytes), windows * T


class TaskScorer:
    """train.py's multiple-choice scoring (its mc_task): this process's share of the task's first
    n examples, encoded once; score() counts the right answers among them."""

    def __init__(self, task, n, vocab_size, block_size, rank, world_size, protocol='build-nanogpt'):
        examples = read_examples(task_file(task), protocol)[:n]
        enc = task_tokenizer(vocab_size)
        mine = examples[rank::world_size]
        self.encoded = [encode_example(enc, ex, block_size, protocol) for ex in mine]
        self.labels = [label for *_, label in mine]
        self.n, self.name, self.block_size = len(examples), os.path.basename(task), block_size
        self.protocol = protocol

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
        """(acc, acc_norm) over all processes' examples, model in eval mode meanwhile: by summed
        loss, and by loss per token or character (the protocol's). compiled pads every forward to
        one shape."""
        model.eval()
        right, right_norm, _ = multiple_choice(model, self.encoded, self.labels, device, autocast,
                                               self.block_size if compiled else None)
        model.train()
        counts = torch.tensor([right, right_norm], dtype=torch.float64, device=device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(counts)  # the processes score disjoint shares
        return tuple(counts.div(self.n).tolist())


# -----------------------------------------------------------------------------


def val_shard(model):
    """The first validation shard in data_dir, its token ids checked against the model's vocabulary."""
    path = or_fail(shard_paths, data_dir, 'val')[0]
    tokens = or_fail(read_shard, path, model.config.vocab_size)
    if len(tokens) <= model.config.block_size:
        fail(f"{path} holds {len(tokens)} tokens, fewer than one sequence of block_size + 1")
    return path, tokens


def main():
    config, _, autocast = configure(globals(), {
        'path': ['out_dir', 'cache_dir', 'hellaswag_url'], 'text': ['task', 'train_file', 'data_dir'],
        'positive': ['batch_size'], 'non-negative': ['max_examples', 'shots'], 'seed': ['seed'],
        'device': ['device'], ('bfloat16', 'float32'): ['dtype'], ('k+1', 'k'): ['shot_draw'],
        ('build-nanogpt', 'harness'): ['protocol']})
    globals().update(config)
    if not task and not data_dir:
        fail("nothing to evaluate: give --task, --data_dir, or both")
    if shots and task != 'hellaswag' and not train_file:
        fail(f"--shots={shots} needs --train_file, a task file of solved examples to draw them from")
    if train_file and not shots:
        fail("--train_file is where --shots draws solved examples from: give --shots too")

    # The checkpoint before the task: no download for a run that is not there.
    model, checkpoint = or_fail(load_model, os.path.join(out_dir, 'ckpt.pt'), device)
    paths = (task_file(task), task_file(train_file or task, 'train') if shots else None) if task else None
    if shots and shot_draw == 'k' and os.path.abspath(paths[1]) == os.path.abspath(paths[0]):
        fail("--shot_draw=k never drops the example scored from the draw: give a --train_file "
             "other than --task (or --shot_draw=k+1)")
    block_size = model.config.block_size
    result = {'out_dir': out_dir, 'step': checkpoint['step']}
    if data_dir:
        path, tokens = val_shard(model)
        byte_lengths, why = or_fail(token_bytes, model.config.vocab_size, data_dir)
        if byte_lengths is None:
            print(f"note: no bits per byte: {why}")
        else:
            byte_lengths = torch.from_numpy(byte_lengths).to(device)
            bpb, n = bits_per_byte(model, tokens, byte_lengths, block_size, batch_size, device, autocast)
            if not math.isfinite(bpb):  # the weights are finite (load_model): the logits overflow
                fail(f"{path}: the bits per byte came out {bpb}, not a result (in {dtype}: "
                     "--dtype=float32 has more range)")
            print(f"{path}: {bpb:.4f} bits per byte ({n:,} tokens)")
            result.update(bpb=bpb, bpb_tokens=n)
    if task:
        enc = task_tokenizer(model.config.vocab_size)
        examples = read_examples(paths[0], protocol)[:max_examples or None]
        if shots:
            solved = read_examples(paths[1], protocol)
            need = shots + (shot_draw == 'k+1')
            if len(solved) < need:
                fail(f"--shots={shots} draws {need} solved examples (--shot_draw={shot_draw}), but "
                     f"{paths[1]} holds only {len(solved)}")
            examples = with_shots(examples, solved, shots, seed, protocol, shot_draw)
        encoded = [encode_example(enc, example, block_size, protocol) for example in examples]
        if compile:
            model = torch.compile(model)
        right, right_norm, n = multiple_choice(model, encoded, [label for *_, label in examples], device,
                                               autocast, block_size if compile else None, progress=True)
        name = 'hellaswag' if task == 'hellaswag' else os.path.basename(task)
        per = 'character' if protocol == 'harness' else 'token'
        print(f"{name}, {protocol} protocol, {shots}-shot: acc {right / n:.4f} | acc_norm "
              f"{right_norm / n:.4f} (per {per}) | {n:,} examples")
        result.update(task=name, protocol=protocol, shots=shots, acc=right / n,
                      acc_norm=right_norm / n, examples=n)
    print(json_line(result))


if __name__ == '__main__':
    main()
