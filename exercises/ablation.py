"""
ablation.py: exercise 6's experiment, the paper's ablation of which layers LIMe reads, on a laptop.
Static LIMe models whose routers read only the first k or only the last k earlier layers (your
RestrictedRouter) train beside the full static router on Python's docs at byte level
(data/pydoc_bytes, made if missing), several seeds each; it prints their validation bits per byte.
From the repo root; with the defaults, 9 runs of about a CPU minute each:

    LIME_EXERCISES=exercises/student.py python -m exercises.ablation
    python -m exercises.ablation --k=4 --routers=none,all,first,last   # the repo's answer

A seed's models start from the same weights (routers aside) and see the same batches, so a
difference within a seed is the routers'. Read it beside the spread over seeds in the table
(docs/walkthrough.md, section 10, says what to expect and has a run of it).
"""
import math
import os
from contextlib import nullcontext

import torch

from configurator import configure, fail, or_fail
from exercises import ROOT, load
from exercises.checks import verdict
from lab.evaluate import bits_per_byte
from lab.plot import seed_table
from lime import GPT, GPTConfig
from prepare import BYTES_VOCAB, Batches, prepare_if_default, read_shard, shard_paths, token_bytes

# -----------------------------------------------------------------------------
exercises = os.environ.get('LIME_EXERCISES', 'exercises/answers.py')  # whose RestrictedRouter
data_dir = 'data/pydoc_bytes'  # byte-level shards (prepare.py --tokenizer=bytes)
routers = 'all,first,last'  # all: lime's StaticRouter; first, last: RestrictedRouter; none: LLaMA
k = 2  # the earlier layers a restricted router reads (the paper: 2, 4 and 6 of 12)
seeds = 3  # seeds 1..seeds, each training every router
n_layer = 8
n_head = 4
n_embd = 64
block_size = 128
batch_size = 16
max_iters = 300  # optimizer steps per model
learning_rate = 3e-3  # config/cpu_demo.py's rates and schedule
router_lr = 3e-2
weight_decay = 0.1
warmup_iters = 30
min_lr = 3e-4
# -----------------------------------------------------------------------------
ROUTERS = ('none', 'all', 'first', 'last')


def restricted_router():
    """The RestrictedRouter of the file exercises names, checked as tests/test_exercises.py checks
    it, before any training: a router not written, or wrong, stops here in one line."""
    if exercises == 'exercises/answers.py' and not (ROOT / exercises).is_file():
        fail(f"{exercises}, the repo's answer, is not in this copy (a student's handout leaves it "
             "out): train yours with LIME_EXERCISES=exercises/student.py python -m "
             "exercises.ablation")
    try:
        module = load(exercises)
    except (FileNotFoundError, SyntaxError) as e:
        fail(f"{exercises}: {e}")
    wrong = verdict(module, 'RestrictedRouter', exercises)
    if wrong is not None:
        fail(f"{exercises}: RestrictedRouter (exercise 6): {wrong}; its check: "
             f"LIME_EXERCISES={exercises} python -m pytest -q tests/test_exercises.py -k "
             "RestrictedRouter")
    return module.RestrictedRouter


def lr_factor(step):
    """Linear warmup, then cosine decay to min_lr (train.py's schedule): a factor on each lr."""
    if step < warmup_iters:
        return (step + 1) / warmup_iters
    progress = (step - warmup_iters) / max(1, max_iters - warmup_iters)
    floor = min_lr / learning_rate
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build(router, seed, RestrictedRouter):
    """A byte-level model of this file's shape with the given routers, initialised from seed."""
    config = or_fail(GPTConfig, vocab_size=BYTES_VOCAB, block_size=block_size, n_layer=n_layer,
                     n_head=n_head, n_embd=n_embd, router='none' if router == 'none' else 'static')
    model = GPT(config)
    if router in ('first', 'last'):
        for block in model.blocks[1:]:
            block.attn.router = RestrictedRouter(config, block.attn.layer_idx, k, router)
    torch.manual_seed(seed)
    model.init_weights()  # the routers draw last: every router starts from the same other weights
    return model


def train(model, val_tokens, byte_lengths):
    """Trains model for max_iters steps; its validation bits per byte."""
    batches = or_fail(Batches, data_dir, batch_size, block_size, vocab_size=BYTES_VOCAB)
    optimizer = model.configure_optimizers(weight_decay, learning_rate, router_lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)  # each group's lr times it
    for _ in range(max_iters):
        x, y = batches.next()
        _, loss = model(torch.from_numpy(x), torch.from_numpy(y))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    model.eval()
    bpb, _ = bits_per_byte(model, val_tokens, byte_lengths, block_size, batch_size, 'cpu',
                           nullcontext())
    return bpb


def main():
    config, _, _ = configure(globals(), {
        'path': ['exercises', 'data_dir'], 'text': ['routers'],
        'positive': ['k', 'seeds', 'batch_size', 'max_iters', 'learning_rate'],
        'non-negative': ['router_lr', 'weight_decay', 'warmup_iters', 'min_lr']})
    globals().update(config)
    names = [name.strip() for name in routers.split(',') if name.strip()]
    if not names or any(name not in ROUTERS for name in names):
        fail(f"--routers={routers}: a comma-separated list of {', '.join(ROUTERS)}")
    if k >= n_layer - 1:
        fail(f"k={k}: with n_layer={n_layer} every layer has at most {n_layer - 1} earlier ones, "
             "so a restricted router would read them all")
    RestrictedRouter = restricted_router() if {'first', 'last'} & set(names) else None
    prepare_if_default(data_dir)
    val_tokens = or_fail(read_shard, or_fail(shard_paths, data_dir, 'val')[0], BYTES_VOCAB)
    byte_lengths, why = token_bytes(BYTES_VOCAB, data_dir)
    if byte_lengths is None:
        fail(f"{data_dir}: {why}")
    byte_lengths = torch.from_numpy(byte_lengths)

    results = {name: {} for name in names}
    for seed in range(1, seeds + 1):
        for name in names:
            model = build(name, seed, RestrictedRouter)
            results[name][seed] = train(model, val_tokens, byte_lengths)
            print(f"seed {seed}, {name}: {results[name][seed]:.4f} bits per byte", flush=True)

    print(f"\nvalidation bits per byte after {max_iters} steps ({n_layer} layers, width {n_embd}, "
          f"k = {k}, on {data_dir}); lower is better")
    # Bits per byte differ as log-perplexities do: d apart is a per-byte perplexity ratio of 2 ** d.
    print('\n'.join(seed_table(results, baseline='all' if 'all' in names else None)))


if __name__ == '__main__':
    main()
