"""
arith.py: the paper's synthetic Arithmetic Expression Task (LIMe, arXiv 2502.09245 v2, Sec. 5.3.2,
after Feng et al. 2023) as character-level shards for train.py, and exact-match scoring.

    python -m lab.arith --mode=prepare                                   # data/arith/, in about 10 s
    python train.py config/arith.py --router=static --out_dir=out/arith_static
    python -m lab.arith --mode=eval --ckpt_dir=out/arith_static          # accuracy per operator count

An expression over the integers modulo a prime p (default 11) with n_ops operators from + - * / and
n_ops + 1 numbers, bracketed only where precedence needs it, then its solution, one operation a
step (the leftmost that is ready, as in the paper's example), the answer last, then a newline.
With p = 11 (12 = 1, 4*3 = 1, 1/4 = 3):

    (7+5)/(6+4*3-2*7)=1/(6+4*3-2*7)=1/(6+1-2*7)=1/(7-2*7)=1/(7-3)=1/4=3

Evaluation prompts with "\\n" + expression + "=", decodes greedily, and counts an example right when
the text after the last '=' is the answer (the paper's exact match) on expressions not in training
(with 1 operator every one is: there, on all), into ckpt_dir/arith_eval.json (lab/plot.py reads it).
As in Feng et al., tiers count operators (the paper's "6 operands" is n_ops = 6) and arithmetic is
modulo a prime: a number has at most two characters, and a divisor that comes out 0 is redrawn.
"""
import os
import random
import shutil
import time
from collections import defaultdict

import numpy as np
import torch

from bookkeeping import write_json
from configurator import configure, fail, or_fail
from lab import read_json
from lime import load_model
from prepare import make_aside, read_shard, shard_path, shard_paths, write_shard

# -----------------------------------------------------------------------------
mode = 'prepare'  # 'prepare': write the data set; 'eval': score a checkpoint
# prepare (eval reads these back from the data set's task.json)
out_dir = 'data/arith'  # where the shards go
seed = 1337  # the data set is a function of the seed and the settings below
modulus = 11  # arithmetic is modulo this prime (Feng et al. use 11)
min_ops = 1  # operator counts in the data; in eval, given ones override the data's range
max_ops = 6  # the paper's hardest tier
cot = True  # write the step-by-step solution (the paper); False: the answer right after '='
train_per_ops = 50000  # training examples per operator count (the paper: 50,000)
val_per_ops = 500  # validation examples per operator count (for train.py's validation loss)
# eval
ckpt_dir = 'out/arith'  # the directory holding ckpt.pt
eval_per_ops = 500  # distinct test expressions per operator count (fewer where fewer exist)
device = 'cuda' if torch.cuda.is_available() else 'cpu'
# -----------------------------------------------------------------------------

VOCAB = '\n0123456789+-*/()='  # characters, id = position; '\n' (id 0) ends an example
END = VOCAB[0]
OPS = '+-*/'
PRECEDENCE = {'+': 1, '-': 1, '*': 2, '/': 2}
SLACK = 8  # tokens a completion may run past the reference solution before decoding stops
ASCII_TO_ID = np.array([max(VOCAB.find(chr(c)), 0) for c in range(128)], dtype=np.uint16)  # 0: not in VOCAB


def encode(text):
    return ASCII_TO_ID[np.frombuffer(text.encode('ascii'), dtype=np.uint8)]


def decode(ids):
    return np.frombuffer(VOCAB.encode('ascii'), dtype=np.uint8)[np.asarray(ids)].tobytes().decode('ascii')


# expressions and their solutions
def apply(op, a, b, p):
    if op == '/':
        return a * pow(b, -1, p) % p  # in the field Z_p, a / b is a times b's inverse
    return {'+': a + b, '-': a - b, '*': a * b}[op] % p


def bracket(tokens, op, parent, right):
    """A child expression's tokens, in brackets if printing it bare would change the value: a weaker
    operator under a stronger one, or the right side of - or / holding one of equal strength."""
    if op is not None and (PRECEDENCE[op] < PRECEDENCE[parent]
                           or right and PRECEDENCE[op] == PRECEDENCE[parent] and parent in '-/'):
        return ['(', *tokens, ')']
    return tokens


def random_expression(rng, n_ops, p):
    """(tokens, value, top operator or None) of a random expression with n_ops operators."""
    if n_ops == 0:
        value = rng.randrange(p)
        return [str(value)], value, None
    op = rng.choice(OPS)
    left_ops = rng.randrange(n_ops)
    left, a, left_op = random_expression(rng, left_ops, p)
    right, b, right_op = random_expression(rng, n_ops - 1 - left_ops, p)
    while op == '/' and b == 0:  # redraw a divisor that comes out as 0
        right, b, right_op = random_expression(rng, n_ops - 1 - left_ops, p)
    tokens = [*bracket(left, left_op, op, False), op, *bracket(right, right_op, op, True)]
    return tokens, apply(op, a, b, p), op


def is_ready(tokens, i):
    """Can the operator at tokens[i] be done now? Both operands are numbers, the left one does not belong
    to an earlier operator of equal or greater strength, nor the right one to a stronger later one."""
    if not (tokens[i - 1].isdigit() and tokens[i + 1].isdigit()):
        return False
    before = tokens[i - 2] if i >= 2 else '('
    after = tokens[i + 2] if i + 2 < len(tokens) else ')'
    op = tokens[i]
    return not (before in OPS and PRECEDENCE[before] >= PRECEDENCE[op]
                or after in OPS and PRECEDENCE[after] > PRECEDENCE[op])


def solve(tokens, p):
    """The expression after each operation, leftmost ready one first, as text; the last is the value."""
    steps = []
    while len(tokens) > 1:
        i = next(i for i, token in enumerate(tokens) if token in OPS and is_ready(tokens, i))
        value = str(apply(tokens[i], int(tokens[i - 1]), int(tokens[i + 1]), p))
        tokens = tokens[:i - 1] + [value] + tokens[i + 2:]
        if i >= 2 and tokens[i - 2] == '(' and tokens[i] == ')':  # "(5)" -> "5"
            tokens = tokens[:i - 2] + [value] + tokens[i + 1:]
        steps.append(''.join(tokens))
    return steps


def make_example(rng, n_ops, p, cot):
    """(expression, steps): the whole solution, or with cot=False the answer alone."""
    tokens, value, _ = random_expression(rng, n_ops, p)
    return ''.join(tokens), solve(tokens, p) if cot else [str(value)]


def example_text(expression, steps):
    return expression + '=' + '='.join(steps) + END


# prepare: shards for train.py
def split_text(name, per_ops, task):
    """One split's examples, per_ops of each operator count, shuffled; each split from a random
    stream of its own (seeded by name and seed), so no split depends on another's size."""
    rng = random.Random(f"{name}:{task['seed']}")
    counts = [n for n in range(task['min_ops'], task['max_ops'] + 1) for _ in range(per_ops)]
    rng.shuffle(counts)
    return ''.join(example_text(*make_example(rng, n, task['modulus'], task['cot'])) for n in counts)


def run_prepare(task):
    """The data set into out_dir, whole or not at all (written beside it, then renamed). Runs may
    have trained on what out_dir holds: the same set is kept, another refused."""
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        task_path = os.path.join(out_dir, 'task.json')
        if os.path.isfile(task_path) and read_json(task_path, 'task file') == task:
            print(f"{out_dir} already holds this data set: kept (delete it to prepare anew)")
            return
        fail(f"{out_dir} holds another data set, which runs may have trained on: give another "
             "--out_dir (or delete it, and the runs that read it, to prepare anew)")
    aside = or_fail(make_aside, out_dir)
    try:
        for name, per_ops, index in (('val', val_per_ops, 0), ('train', train_per_ops, 1)):
            tokens = encode(split_text(name, per_ops, task))
            write_shard(shard_path(aside, 'arith', name, index), tokens)
            print(f"{name}: {len(tokens):,} tokens, {per_ops} examples per operator count")
        write_json(os.path.join(aside, 'task.json'), task)
        os.rename(aside, out_dir)
    finally:
        shutil.rmtree(aside, ignore_errors=True)  # renamed: gone already
    print(f"wrote {out_dir}; an example of each operator count:\n{split_text('example', 1, task)}", end='')


# eval: exact match of greedy solutions on held-out expressions
def training_expressions(data_dir):
    """Every expression in the training shards, to tell held-out test expressions from seen ones."""
    return {line.split('=', 1)[0] for path in or_fail(shard_paths, data_dir, 'train')
            for line in decode(read_shard(path)).split(END)}


def eval_set(n_ops, count, task):
    """Up to count distinct expressions {expression: steps} with n_ops operators, from a random stream of
    their own. Small counts have fewer: one operator allows only 3 x 11 x 11 + 11 x 10 = 473 (mod 11)."""
    rng = random.Random(f"test:{task['seed']}:{n_ops}")
    examples = {}
    for _ in range(20 * count):
        expression, steps = make_example(rng, n_ops, task['modulus'], task['cot'])
        examples[expression] = steps
        if len(examples) == count:
            break
    return examples


def final_answer(completion):
    """The text after the completion's last '=' (the prompt's if it has none) before the end token;
    None if it never ends."""
    return completion.split(END, 1)[0].rsplit('=', 1)[-1] if END in completion else None


def solved(model, examples):
    """The expressions of examples {expression: steps} whose greedy completion ends with the right
    answer. Prompts of equal length are decoded together (the model has no padding mask), as long as
    their longest solution, the end token and SLACK: a model that rambles on is cut off, and wrong."""
    by_length = defaultdict(list)
    for expression, steps in examples.items():
        by_length[len(expression)].append((expression, steps))
    right = set()
    for group in by_length.values():
        prompts = np.stack([encode(END + expression + '=') for expression, _ in group]).astype(np.int64)
        idx = torch.from_numpy(prompts).to(device)  # (B, T)
        budget = max(len('='.join(steps)) for _, steps in group) + 1 + SLACK
        out = model.generate(idx, budget, temperature=0)[:, idx.size(1):].cpu().numpy()  # (B, budget)
        right |= {expression for row, (expression, steps) in zip(out, group)
                  if final_answer(decode(row)) == steps[-1]}
    return right


def run_eval(given):
    model, checkpoint = or_fail(load_model, os.path.join(ckpt_dir, 'ckpt.pt'), device)
    if model.config.vocab_size != len(VOCAB):
        fail(f"the checkpoint's vocab_size is {model.config.vocab_size}, not this task's "
             f"{len(VOCAB)}: train it with config/arith.py")
    data_dir = checkpoint['data']['data_dir']  # train.py saves the data's real path
    task = read_json(os.path.join(data_dir, 'task.json'), 'task file',
                     "the checkpoint was not trained on `python -m lab.arith --mode=prepare` data")
    seen = training_expressions(data_dir)
    lo = min_ops if 'min_ops' in given else task['min_ops']
    hi = max_ops if 'max_ops' in given else task['max_ops']
    print(f"{ckpt_dir}: router={model.config.router}, step {checkpoint['step']}, data {data_dir}")
    row = '{:>9} {:>8} {:>5} {:>8} {:>8} {:>8} {:>6}'.format
    print(row('operators', 'operands', 'all', 'accuracy', 'held-out', 'accuracy', 'time'))
    # the step names the checkpoint: plot.py finds it in the run's log, or refuses
    result = {'step': checkpoint['step'], 'accuracy': {}, 'accuracy_all': {}, 'n': {}, 'n_held_out': {}}
    for n_ops in range(lo, hi + 1):
        t0 = time.time()
        examples = eval_set(n_ops, eval_per_ops, task)
        right = solved(model, examples)
        held_out = set(examples) - seen
        accuracy = len(right & held_out) / len(held_out) if held_out else None  # the paper's measure
        result['accuracy'][n_ops], result['accuracy_all'][n_ops] = accuracy, len(right) / len(examples)
        result['n'][n_ops], result['n_held_out'][n_ops] = len(examples), len(held_out)
        print(row(n_ops, n_ops + 1, len(examples), f"{len(right) / len(examples):.1%}", len(held_out),
                  '-' if accuracy is None else f"{accuracy:.1%}", f"{time.time() - t0:.1f}s"))
    write_json(os.path.join(ckpt_dir, 'arith_eval.json'), result)


def main(argv=None):
    config, given, _ = configure(globals(), {
        ('prepare', 'eval'): ['mode'], 'path': ['out_dir', 'ckpt_dir'], 'seed': ['seed'], 'device': ['device'],
        'positive': ['modulus', 'min_ops', 'max_ops', 'train_per_ops', 'val_per_ops', 'eval_per_ops']}, argv)
    globals().update(config)
    if not min_ops <= max_ops:
        fail(f"need min_ops <= max_ops, got {min_ops} and {max_ops}")
    if modulus < 2 or any(modulus % d == 0 for d in range(2, int(modulus ** 0.5) + 1)):
        fail(f"modulus must be a prime (so that every nonzero number has an inverse), got {modulus}")
    if mode == 'prepare':
        run_prepare({'seed': seed, 'modulus': modulus, 'min_ops': min_ops, 'max_ops': max_ops, 'cot': cot,
                     'vocab': VOCAB, 'train_per_ops': train_per_ops, 'val_per_ops': val_per_ops})
    else:
        run_eval(given)


if __name__ == '__main__':
    main()
