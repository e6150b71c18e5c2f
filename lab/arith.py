"""
arith.py: the paper's synthetic Arithmetic Expression Task (LIMe, arXiv 2502.09245 v2, Sec. 5.3.2,
after Feng et al. 2023), written as character-level shards for train.py, and an exact-match
evaluation of a checkpoint trained on them.

    python -m lab.arith --mode=prepare                                   # data/arith/, in about 20 s
    python train.py config/arith.py --router=static --out_dir=out/arith_static
    python -m lab.arith --mode=eval --ckpt_dir=out/arith_static          # accuracy per operator count

An expression over the integers modulo a prime p (default 11) with n_ops operators from + - * / and
n_ops + 1 numbers, bracketed only where precedence needs it, is followed by its solution, one
operation a step, the answer last, then a newline. With p = 11 (12 = 1, 4*3 = 1, 1/4 = 3):

    (7+5)/(6+4*3-2*7)=1/(6+4*3-2*7)=1/(6+1-2*7)=1/(7-2*7)=1/(7-3)=1/4=3

Evaluation prompts with "\\n" + expression + "=", decodes greedily until the newline, and counts an
example right when the text after the last '=' is the answer (the paper's exact match). It prints a
table per operator count and one JSON line, also written to ckpt_dir/arith_eval.json (lab/plot.py).

Where the paper leaves a choice open:
- Tiers count operators (its Appendix B example has 6 operators and 7 numbers; Feng et al.'s
  generator counts operators): the paper's "6 operands" is n_ops = 6; the table shows both.
- Arithmetic is modulo a prime, as in Feng et al.: every number has at most two characters and
  division is always defined (a divisor that evaluates to 0 is redrawn).
- Expressions are random binary trees printed with the fewest brackets that keep their value; each
  step does the leftmost operation that is ready, which reproduces the paper's example.
- Training mixes every count from min_ops to max_ops, train_per_ops examples each, shuffled; the
  loss covers the random expression too, so it cannot go near zero.
- Evaluation draws distinct expressions from a stream of its own and reports accuracy on those not
  in training (held out, the paper's measure) and on all; every 1-operator expression is in
  training, so there only the second is defined. cot=False writes the answer right after the '='.
"""
import glob
import math
import os
import random
import shutil
import time
from collections import defaultdict

import numpy as np
import torch

from bookkeeping import write_json
from configurator import configure, fail, or_fail
from lab import json_line, read_json
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
eval_batch = 512  # prompts decoded together
device = 'cuda' if torch.cuda.is_available() else 'cpu'
# -----------------------------------------------------------------------------

VOCAB = '\n0123456789+-*/()='  # characters, id = position; '\n' (id 0) ends an example
END = VOCAB[0]
OPS = '+-*/'
PRECEDENCE = {'+': 1, '-': 1, '*': 2, '/': 2}
MOST_OPS = 100  # the largest max_ops: an example is ~max_ops**2 characters (100 at 6 operators, 30K at 100)
MOST_EVAL = 100000  # the largest eval_per_ops
MODULUS_BELOW = 10**14  # the prime test tries every divisor up to the square root: 10**7 of them
SLACK = 8  # tokens a completion may run past the reference solution before decoding stops
ASCII_TO_ID = np.full(128, len(VOCAB), dtype=np.uint16)  # len(VOCAB) marks "not in the vocabulary"
ASCII_TO_ID[[ord(c) for c in VOCAB]] = np.arange(len(VOCAB))


def encode(text):
    """Token ids (uint16 array) of a string over VOCAB."""
    ids = ASCII_TO_ID[np.frombuffer(text.encode('ascii'), dtype=np.uint8)]
    if (ids == len(VOCAB)).any():
        raise ValueError(f"not in the vocabulary {VOCAB!r}: {text!r}")
    return ids


def decode(ids):
    return np.frombuffer(VOCAB.encode('ascii'), dtype=np.uint8)[np.asarray(ids)].tobytes().decode('ascii')


# -----------------------------------------------------------------------------
# expressions and their solutions


def apply(op, a, b, p):
    if op == '+':
        return (a + b) % p
    if op == '-':
        return (a - b) % p
    if op == '*':
        return a * b % p
    return a * pow(b, -1, p) % p  # in the field Z_p, a / b is a times b's inverse


def bracket(tokens, op, parent, right):
    """A child expression's tokens, in brackets if printing it bare would change the value: a weaker
    operator under a stronger one, or the right side of - or / holding one of equal strength."""
    if op is not None and (PRECEDENCE[op] < PRECEDENCE[parent]
                           or right and PRECEDENCE[op] == PRECEDENCE[parent] and parent in '-/'):
        return ['(', *tokens, ')']
    return tokens


def random_expression(rng, n_ops, p):
    """(tokens, value, top operator) of a random expression with n_ops operators; tokens are numbers
    (as strings), operators and brackets. The top operator is None for a lone number."""
    if n_ops == 0:
        value = rng.randrange(p)
        return [str(value)], value, None
    op = rng.choice(OPS)
    left_ops = rng.randrange(n_ops)
    left, a, left_op = random_expression(rng, left_ops, p)
    while True:  # redraw a divisor that comes out as 0
        right, b, right_op = random_expression(rng, n_ops - 1 - left_ops, p)
        if op != '/' or b != 0:
            break
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
    """The solution steps: the expression after each operation, leftmost ready operation first (as in
    the paper's example), as strings; the last is the value."""
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
    """(expression, solution steps): the steps are the whole solution, or with cot=False the answer alone."""
    tokens, value, _ = random_expression(rng, n_ops, p)
    return ''.join(tokens), solve(tokens, p) if cot else [str(value)]


def example_text(expression, steps):
    return expression + '=' + '='.join(steps) + END


# -----------------------------------------------------------------------------
# prepare: shards for train.py


def split_text(name, per_ops, task):
    """One split's examples, per_ops of each operator count, shuffled, one per line. Each split draws
    from its own random stream (seeded by name and seed), so no split depends on another's size."""
    rng = random.Random(f"{name}:{task['seed']}")
    counts = [n for n in range(task['min_ops'], task['max_ops'] + 1) for _ in range(per_ops)]
    rng.shuffle(counts)
    return ''.join(example_text(*make_example(rng, n, task['modulus'], task['cot'])) for n in counts)


def run_prepare(task):
    """The data set into out_dir, as prepare.py writes one (beside it, then renamed into place):
    runs may have trained on what a directory holds, so the same set is kept and another refused."""
    # A shard's header counts its tokens in an int32: measured on one example of each operator count
    rng = random.Random(0)
    example_tokens = sum(len(example_text(*make_example(rng, n, task['modulus'], task['cot'])))
                         for n in range(task['min_ops'], task['max_ops'] + 1))
    for key in ('val_per_ops', 'train_per_ops'):
        if task[key] * example_tokens >= 2**31:
            fail(f"{key}={task[key]} makes a split of about {task[key] * example_tokens:,} tokens, more than "
                 "a shard holds (2**31 - 1)")
    task_path = os.path.join(out_dir, 'task.json')
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        if os.path.isfile(task_path) and read_json(task_path, 'task file') == task:
            print(f"{out_dir} already holds this data set: kept (delete it to prepare anew)")
            return print(f"next: python train.py config/arith.py --data_dir={out_dir}")
        fail(f"{out_dir} holds another data set, which runs may have trained on: give another "
             "--out_dir (or delete it, and the runs that read it, to prepare anew)")
    t0 = time.time()
    # Whole or absent: written into a directory beside out_dir, renamed to it once whole
    aside = or_fail(make_aside, out_dir)
    try:
        for name, per_ops, index in (('val', val_per_ops, 0), ('train', train_per_ops, 1)):
            tokens = encode(split_text(name, per_ops, task))
            write_shard(shard_path(aside, 'arith', name, index), tokens)
            print(f"{name}: {len(tokens):,} tokens, {per_ops} examples per operator count")
        write_json(os.path.join(aside, 'task.json'), task)
        os.rename(aside, out_dir)
    except OSError as e:  # a full disk, say
        fail(f"{e.filename}: {e.strerror}")
    finally:
        shutil.rmtree(aside, ignore_errors=True)  # renamed: gone already
    print(f"wrote {out_dir} in {time.time() - t0:.0f}s; examples:\n{split_text('example', 1, task)}", end='')
    print(f"next: python train.py config/arith.py --data_dir={out_dir}")


# -----------------------------------------------------------------------------
# eval: exact match of greedy solutions on held-out expressions


def read_task(data_dir):
    path = os.path.join(data_dir, 'task.json')
    if not os.path.isdir(data_dir):
        fail(f"the checkpoint's data_dir {data_dir} is not there: evaluation reads its task.json "
             "and shards")
    task = read_json(path, 'task file', "the checkpoint was not trained on `python -m lab.arith --mode=prepare` data")
    # The same checks as main() makes of the keys that wrote it: an edited file fails here, not later.
    kinds = {'seed': int, 'modulus': int, 'min_ops': int, 'max_ops': int, 'cot': bool}
    well_formed = isinstance(task, dict) and all(type(task.get(k)) is t for k, t in kinds.items())
    if well_formed:
        well_formed = 2 <= task['modulus'] < MODULUS_BELOW and 1 <= task['min_ops'] <= task['max_ops'] <= MOST_OPS
    if not well_formed:
        fail(f"{path} is not the task.json that `python -m lab.arith --mode=prepare` writes")
    return task


def training_expressions(data_dir):
    """Every expression in the training shards, to tell held-out test expressions from seen ones."""
    lines = []
    for path in or_fail(shard_paths, data_dir, 'train'):
        lines += decode(or_fail(read_shard, path, len(VOCAB))).split(END)  # ids past VOCAB: not this task's
    return {line.split('=', 1)[0] for line in lines}


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
    """The answer a completion ends with: the text after its last '=' before the end token (after the
    prompt's '=' if it holds none); None if it never ends."""
    if END not in completion:
        return None
    return completion.split(END, 1)[0].rsplit('=', 1)[-1]


def solved(model, examples, batch):
    """The expressions of examples {expression: steps} whose greedy completion ends with the right answer.
    Prompts of equal length are decoded together (the model has no padding mask); each batch runs as long
    as its longest reference solution plus the end token and SLACK, so a model that rambles on is cut off,
    and wrong."""
    by_length = defaultdict(list)
    for expression, steps in examples.items():
        by_length[len(expression)].append((expression, steps))
    right = set()
    for group in by_length.values():
        for start in range(0, len(group), batch):
            chunk = group[start:start + batch]
            prompts = np.stack([encode(END + expression + '=') for expression, _ in chunk]).astype(np.int64)
            idx = torch.from_numpy(prompts).to(device)  # (B, T)
            budget = max(len('='.join(steps)) for _, steps in chunk) + 1 + SLACK
            out = model.generate(idx, budget, temperature=0)[:, idx.size(1):].cpu().numpy()  # (B, budget)
            right |= {expression for row, (expression, steps) in zip(out, chunk)
                      if final_answer(decode(row)) == steps[-1]}
    return right


def share(part, whole):
    return len(part) / len(whole) if whole else None


def run_eval(given):
    model, checkpoint = or_fail(load_model, os.path.join(ckpt_dir, 'ckpt.pt'), device)
    if model.config.vocab_size != len(VOCAB):
        fail(f"the checkpoint's vocab_size is {model.config.vocab_size}, not this task's "
             f"{len(VOCAB)}: train it with config/arith.py")
    if 'data_dir' not in checkpoint.get('config', {}):
        fail(f"{ckpt_dir}/ckpt.pt does not say which data it was trained on: was it saved by train.py?")
    # The data's real path (train.py saves it beside the data position), else the path as given:
    # relative to the directory train.py ran in, which need not be this one.
    given_dir = checkpoint['config']['data_dir']
    data_dir = next((d for d in (checkpoint.get('data', {}).get('data_dir'), given_dir)
                     if d and os.path.isdir(d)), given_dir)
    task = read_task(data_dir)
    seen = training_expressions(data_dir)
    lo = min_ops if 'min_ops' in given else task['min_ops']
    hi = max_ops if 'max_ops' in given else task['max_ops']
    print(f"{ckpt_dir}: router={model.config.router}, step {checkpoint['step']}, data {data_dir} "
          f"(mod {task['modulus']}, cot={task['cot']}), up to {eval_per_ops} test expressions per count")
    row = '{:>9} {:>8} {:>5} {:>8} {:>8} {:>8} {:>6}'.format
    print(row('operators', 'operands', 'all', 'accuracy', 'held-out', 'accuracy', 'time'))
    # step and best_val_loss name the checkpoint: plot.py finds them in the run's log, or refuses.
    best = checkpoint['best_val_loss']  # inf in an older version's before its first evaluation
    result = {'ckpt_dir': ckpt_dir, 'router': model.config.router, 'step': checkpoint['step'],
              'best_val_loss': best if math.isfinite(best) else None,
              'accuracy': {}, 'accuracy_all': {}, 'n': {}, 'n_held_out': {}}
    for n_ops in range(lo, hi + 1):
        t0 = time.time()
        examples = eval_set(n_ops, eval_per_ops, task)
        longest = max(len(example_text(*example)) + 1 for example in examples.items())
        if longest + SLACK > model.config.block_size:
            fail(f"{n_ops}-operator solutions run to {longest + SLACK} tokens, past the model's "
                 f"block_size {model.config.block_size}")
        right = solved(model, examples, eval_batch)
        held_out = set(examples) - seen
        result['accuracy'][n_ops] = share(right & held_out, held_out)  # the paper's measure
        result['accuracy_all'][n_ops] = share(right, examples)
        result['n'][n_ops], result['n_held_out'][n_ops] = len(examples), len(held_out)
        shown = f"{share(right & held_out, held_out):.1%}" if held_out else '-'
        print(row(n_ops, n_ops + 1, len(examples), f"{share(right, examples):.1%}", len(held_out), shown,
                  f"{time.time() - t0:.1f}s"))
    print(json_line(result))
    path = os.path.join(ckpt_dir, 'arith_eval.json')  # for plot.py --mode=arith
    try:
        write_json(path, result)
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror} (the table above is all there is)")


def main(argv=None):
    # The settings are the lowercase values at the top (UPPERCASE names are fixed constants).
    config, given, _ = configure(globals(), {
        ('prepare', 'eval'): ['mode'], 'path': ['out_dir', 'ckpt_dir'], 'seed': ['seed'], 'device': ['device'],
        'positive': ['modulus', 'min_ops', 'max_ops', 'train_per_ops', 'val_per_ops', 'eval_per_ops', 'eval_batch']}, argv)
    globals().update(config)
    other = given & {'prepare': {'ckpt_dir', 'eval_per_ops', 'eval_batch', 'device'},
                     'eval': {'out_dir', 'seed', 'modulus', 'cot', 'train_per_ops',
                              'val_per_ops'}}[mode]
    if other:  # eval reads the data's settings from its task.json
        why = "it reads the data set's task.json" if mode == 'eval' else "they are for --mode=eval"
        fail(f"--mode={mode} has no use for {', '.join(sorted(other))}: {why}")
    if not 1 <= min_ops <= max_ops:
        fail(f"need 1 <= min_ops <= max_ops, got {min_ops} and {max_ops}")
    if max_ops > MOST_OPS:
        fail(f"max_ops must be at most {MOST_OPS}, got {max_ops}: a solution's length grows as its square")
    if modulus >= MODULUS_BELOW:
        fail(f"modulus must be below 10**14 (a prime such as 11), got {modulus}")
    if modulus < 2 or any(modulus % d == 0 for d in range(2, int(modulus ** 0.5) + 1)):
        fail(f"modulus must be a prime (so that every nonzero number has an inverse), got {modulus}")
    if eval_per_ops > MOST_EVAL:  # and up to 20 times that many are drawn to find them
        fail(f"eval_per_ops must be at most {MOST_EVAL:,}, got {eval_per_ops}")
    if mode == 'prepare':
        run_prepare({'seed': seed, 'modulus': modulus, 'min_ops': min_ops, 'max_ops': max_ops, 'cot': cot,
                     'vocab': VOCAB, 'train_per_ops': train_per_ops, 'val_per_ops': val_per_ops})
    else:
        run_eval(given)


if __name__ == '__main__':
    main()
