"""
gpu_check.py: the one command that checks LIMe's mix (kernels/memory.py) on this GPU, with this
torch, as train.py runs it, against lime.py's definition, and measures the two side by side. Its
reports are what docs/performance.md records (the first: one H100, 2026-11-27).

    python -m lab.gpu_check                                        # all, within 8 minutes
    python -m lab.gpu_check --parts=gradients --presets=config/deep.py --minutes=20

The parts (`parts` names some, in that order), each with its wall time in the report:
1. self_check: memory.self_check, which train.py runs on a GPU before step 0 with --fused=True
   (memory.py asked for; the automatic choice there is the definition), at every preset's kv
   heads and head size, in bfloat16 and float32: the mix run as a run runs it (eager: a compiled
   model breaks its graph at each mix), through enough layers to take both of the dynamic mix's
   ways. It cannot see the compiled code around the mix: part 2 checks that.
2. gradients: at every preset's model shape (SMALL_BATCH sequences of its block_size), both LIMe
   routers: every parameter's gradient of one compiled bf16 step with memory.py, against the eager
   definition's in float32 from the same weights and tokens. A parameter passes within
   BF16_TOLERANCE plus twice what bf16 autocast does to the definition's own gradient of it.
3. training: train.py itself, `torchrun --standalone --nproc_per_node=1 train.py <preset>`, on
   shards of random tokens written here: an evaluation (the graph train.py compiles first), then
   `steps` optimizer steps of the preset's batch and gradient accumulation (config/gpt2.py: 32
   sequences x 16 micro-steps), for static and dynamic, each with the compiled definition
   (--fused=False, what a run on a GPU runs by default) and with memory.py (--fused=True), then
   router none: the loss curves, tokens/s and compile time from each run's log.txt, the GPU
   memory each run took.
4. profile: torch.profiler over the mixes of all the preset's layers, forward and backward, at its
   batch, alone (the code a run runs between its compiled pieces): a table of their kernels' time
   and bytes/s beside docs/performance.md's floor; and which SDPA backend a compiled step ran.
5. deep: compile time and peak memory at 64 layers (config/deep.py's model) with memory.py.
6. tests: tests/test_kernels.py on this machine's CPU with its torch, started first and run beside
   the others (two threads, the GPU hidden from it), its result reported last.

GPU runs are rare: the whole check is meant to take under 8 minutes on one H100 (`minutes`). On
one (2026-11-27) the training part's five runs alone took 7.3 minutes (54 to 132 s each): give
it, or each part, time of its own (`parts`, `minutes`). Each part gets its share of the minutes
(SHARES) and starts its next piece (a preset, a run, a router) only while the time left in its
share is at least what its last piece took; the report names what it left out. On a CPU the
same code runs small: a tiny model (ON_A_CPU) for every preset in part 2 (still compiled, in bf16
autocast) and in parts 3 to 5, whose runs are float32 and eager, as train.py runs on a CPU: the
code paths, not a GPU's numbers or speed. The report (markdown, to paste) is printed and written
to `report`.
"""
import ast
import gc
import glob
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from datetime import date

import numpy as np
import torch
import torch.nn as nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from configurator import configure, fail, read_text
from kernels import memory
from lime import (GPT, ROUTERS, DynamicRouter, GPTConfig, compile_model, last_line,
                  use_fused_kernels)
from prepare import shard_path, write_shard
from safe_files import write_atomically

# -----------------------------------------------------------------------------
preset = 'config/gpt2.py'  # the model that parts 3 and 4 train and profile
presets = ''  # part 2's presets, comma-separated paths; '' = every config/*.py
parts = 'self_check,gradients,training,profile,deep,tests'  # which parts run, in this order
steps = 4  # optimizer steps of each train.py run in part 3, after its first evaluation
deep_steps = 2  # training steps of each router at 64 layers in part 5 (the first compiles)
minutes = 8.0  # the time budget of the whole check, shared out among the parts (SHARES)
report = 'gpu_check.md'  # where the report goes
# -----------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ON_A_GPU = torch.cuda.is_available()
DEVICE = 'cuda' if ON_A_GPU else 'cpu'
# On a CPU, these model keys instead of the presets' (a preset's full shape takes minutes a step)
ON_A_CPU = dict(n_layer=4, n_embd=32, n_head=2, n_kv_head=0, mlp_hidden=0, block_size=32,
                vocab_size=256)
# Each part's share of `minutes`; the tests run beside the others and need none.
SHARES = {'self_check': 0.05, 'gradients': 0.2, 'training': 0.5, 'profile': 0.1, 'deep': 0.15}
# Sequences in part 2's step and part 4's compiled step: two, so that a mix that mixed up
# two sequences would show
SMALL_BATCH = 2
DEEP_BATCH = 8  # sequences in part 5's steps
# bfloat16 keeps 8 significant bits: a gradient through a few layers of bf16 products is off by
# about 1e-2 of its largest entry (tests/test_kernels.py's compiled test allows 5e-2). A deep model
# rounds more: part 2 allows this plus twice the definition's own error under bf16 autocast.
BF16_TOLERANCE = 5e-2
LOSS_GAP = 0.05  # two runs' losses differ by at most this over a few bf16 steps
BANDWIDTH = 3.0e12  # an H100's memory bandwidth, bytes/s, as measured (lab/bench.py's bandwidth)
TRAIN_DEFAULTS = {'batch_size': 16, 'gradient_accumulation_steps': 32}  # train.py's


def preset_values(path):
    """A config file's `key = literal` lines, over train.py's defaults for the keys read here."""
    values = {'n_layer': 12, 'n_head': 12, 'n_kv_head': 0, 'n_embd': 768, 'block_size': 1024,
              'router': 'static', 'mlp_hidden': 0, 'vocab_size': 50257, **TRAIN_DEFAULTS}
    try:
        body = ast.parse(read_text(path, 'preset'), filename=path).body
    except (SyntaxError, ValueError) as e:  # ValueError: NUL bytes
        fail(f"{path}:{getattr(e, 'lineno', '')}: not a config file of `key = value` lines")
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, AttributeError, SyntaxError):  # as train.py would refuse it
                fail(f"{path}:{node.lineno}: config files hold `key = value` lines of plain "
                     "literals")
    return values


def model_config(values, **changes):
    keys = {f: values[f] for f in GPTConfig.__dataclass_fields__ if f in values}
    return GPTConfig(**{**keys, **changes})


def describe(cfg):
    return (f"{cfg.n_layer} layers x {cfg.n_embd}, {cfg.n_head} heads, {cfg.n_kv_head} kv heads, "
            f"{cfg.block_size} tokens")


def preset_paths():
    """Part 2's presets: `presets`, or every config/*.py, `preset` first, then the biggest models
    (the GPU's) before the small ones, so that a short budget leaves out the small ones."""
    if presets:
        return presets.split(',')
    paths = glob.glob(os.path.join(ROOT, 'config', '*.py'))
    paths.sort(key=lambda p: (os.path.relpath(p, ROOT) != os.path.normpath(preset),
                              -model_config(preset_values(p)).num_floats()))
    return [os.path.relpath(p, ROOT) for p in paths]


def free_memory():
    gc.collect()
    if ON_A_GPU:
        torch.cuda.empty_cache()


class Clock:
    """A part's share of the budget. A part starts its next piece of work only while the time
    left is at least what its last piece took: it keeps to its share within one piece."""

    def __init__(self, seconds):
        self.end = time.time() + seconds
        self.last = 0.0

    def allows_another(self):
        return self.end - time.time() >= self.last

    @contextmanager
    def piece(self):
        started = time.time()
        yield
        self.last = time.time() - started


def left_out(pieces):
    if not pieces:
        return []
    return ['', f"Left out, the part's share of --minutes={minutes:g} spent: {', '.join(pieces)}."]


# -----------------------------------------------------------------------------
# Part 1: the self-check


def self_checks(clock):
    """A table, one row per preset, a cell per dtype: 'passed' or what differed."""
    lines = [f"memory.py on {DEVICE} against lime.py's definition in float32 on the CPU, run eager "
             "and under autocast as a run runs the mix (float32 in full float32, TF32 off, as the "
             "check runs it). What it cannot see: the compiled code around the mix (part 2) and "
             "speed (parts 3 to 5).", '',
             '| preset | kv heads | head size | bfloat16 | float32 |', '|---|---|---|---|---|']
    skipped = []
    for path in sorted(glob.glob(os.path.join(ROOT, 'config', '*.py'))):
        name = os.path.relpath(path, ROOT)
        if not clock.allows_another():
            skipped.append(name)
            continue
        cfg = model_config(preset_values(path))
        G, hs = cfg.n_kv_head, cfg.n_embd // cfg.n_head
        cells = []
        with clock.piece():
            for dtype in (torch.bfloat16, torch.float32):
                started = time.time()
                why = memory.self_check(G, hs, dtype, DEVICE)
                cells.append(f"{why or 'passed'} ({time.time() - started:.1f} s)")
        lines.append(f"| {name} | {G} | {hs} | {' | '.join(cells)} |")
    return '\n'.join(lines + left_out(skipped))


# -----------------------------------------------------------------------------
# Part 2: every parameter's gradient, compiled memory.py against the eager definition


def bf16_autocast():
    return torch.autocast(DEVICE, torch.bfloat16)


@contextmanager
def exact_float32():
    """float32 products in float32, not TF32 (which train.py allows on a GPU): the reference."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def step_gradients(model, x, compiled, autocast):
    """Every parameter's gradient after one forward and backward pass of model on x (B, T + 1),
    with the mix that lime.use_fused_kernels has set; compiled: through torch.compile, as train.py
    runs it."""
    step_model = compile_model(model) if compiled else model
    with autocast:
        _, loss = step_model(x[:, :-1], x[:, 1:])
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)  # the tensors live on in grads
    return grads


def relative_error(got, want):
    """max |got - want| over max |want|, on the device (a big model's gradients stay there)."""
    got, want = got.float(), want.float()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()


def dynamo_summary():
    """What torch.compile made of the model since the counters were cleared: graphs, graph breaks
    (one at each mix), and the functions it left to run eager: one with a graph break inside a
    loop (GPT.forward's loop over the blocks), and one compiled anew for each layer, since it
    reads its layer's index, past torch._dynamo.config.recompile_limit variants: the layers after
    those run it eager (at 12 layers with memory.py, CausalSelfAttention.forward)."""
    counters = torch._dynamo.utils.counters
    breaks = sum(counters['graph_break'].values())
    eager = counters['frames']['total'] - counters['frames']['ok']
    at_limit = sum(n for why, n in counters['unimplemented'].items() if 'recompile limit' in why)
    limit = torch._dynamo.config.recompile_limit
    return (f"{counters['stats']['unique_graphs']} graphs, {breaks} graph breaks; functions left "
            f"eager: {eager} ({at_limit} past the recompile limit, {limit} variants)")


def gradient_sets(cfg):
    """Every parameter's gradient of one step of a model of cfg, three ways, from the same weights
    and tokens: the eager definition in float32 (the reference), the same under bf16 autocast
    (what bf16 alone does), and memory.py compiled under bf16 autocast, as train.py runs it; and
    what torch.compile made of the model."""
    torch.manual_seed(0)
    model = GPT(cfg).to(DEVICE)
    for router in model.routers():
        if isinstance(router, DynamicRouter):  # not its zero init, under which every token
            # routes alike: an error in one token's gradient could hide in the sum over tokens
            nn.init.normal_(router.proj.weight, std=cfg.n_embd ** -0.5)
    x = torch.randint(0, cfg.vocab_size, (SMALL_BATCH, cfg.block_size + 1),
                      generator=torch.Generator().manual_seed(0)).to(DEVICE)
    use_fused_kernels(False, DEVICE)
    with exact_float32():
        reference = step_gradients(model, x, compiled=False, autocast=nullcontext())
    alone = step_gradients(model, x, compiled=False, autocast=bf16_autocast())
    use_fused_kernels(True, DEVICE)  # no self-check: part 1 is that
    torch._dynamo.reset()  # compiled afresh, as a new run compiles
    torch._dynamo.utils.counters.clear()
    fast = step_gradients(model, x, compiled=True, autocast=bf16_autocast())
    return reference, alone, fast, dynamo_summary()


def judge(reference, alone, fast):
    """The pass rule: ([(parameter, error, allowed, bf16 alone error)], [the parameters whose
    error is above what they are allowed]). Errors are relative to the reference's largest entry;
    a parameter is allowed BF16_TOLERANCE plus twice its bf16 alone error."""
    errors = []
    for name, want in reference.items():
        bf16_alone = relative_error(alone[name], want)
        error = relative_error(fast[name], want) if name in fast else 1.0  # none: all wrong
        errors.append((name, error, BF16_TOLERANCE + 2 * bf16_alone, bf16_alone))
    return errors, [name for name, error, allowed, _ in errors if not error <= allowed]


def check_model(cfg):
    """{'errors': judge's list, 'failed': the parameters out of bounds, 'compiled': what
    torch.compile made of the model}."""
    reference, alone, fast, compiled = gradient_sets(cfg)
    errors, failed = judge(reference, alone, fast)
    return {'errors': errors, 'failed': failed, 'compiled': compiled}


def gradient_row(name, router, cfg, result, seconds):
    errors = result['errors']
    worst = max(errors, key=lambda e: e[1] / e[2])  # the nearest to its bound
    verdict = 'passed' if not result['failed'] else 'FAILED'
    within = len(errors) - len(result['failed'])
    return (f"| {name} | {router} | {describe(cfg)} | {verdict}: {within} of {len(errors)} | "
            f"{worst[0]} | {worst[1]:.1e} | {worst[2]:.1e} | {worst[3]:.1e} | "
            f"{result['compiled']} | {seconds:.0f} |")


def failure_line(name, router, result):
    """The worst parameters of a failed row, three at most, as a line under the table."""
    failed = [e for e in result['errors'] if e[0] in result['failed']]
    failed.sort(key=lambda e: -e[1] / e[2])
    return (f"- {name}, {router}: {len(failed)} parameters out of bounds, the worst: "
            + '; '.join(f"{p} off by {error:.1e} (allowed {allowed:.1e}, bf16 alone {alone:.1e})"
                        for p, error, allowed, alone in failed[:3]))


def gradients(clock):
    """Part 2: a row per preset and router."""
    if ON_A_GPU:
        models = [(path, preset_values(os.path.join(ROOT, path))) for path in preset_paths()]
        where = f"{SMALL_BATCH} sequences of each preset's block_size"
    else:
        models = [('tiny (ON_A_CPU)', ON_A_CPU)]
        where = (f"on a CPU: a tiny model for every preset, {SMALL_BATCH} sequences: the code "
                 "and the pass rule, not a GPU's numbers")
    lines = [f"One compiled bf16 step with memory.py against the eager definition in float32 "
             f"(TF32 off), the same weights and tokens; {where}. A parameter passes within "
             f"{BF16_TOLERANCE:g} + twice its bf16 alone error (the eager definition's under "
             "bf16 autocast), relative to its largest gradient entry.", '',
             '| preset | router | model | parameters within | worst parameter | its error | '
             'allowed | bf16 alone | compiled as | s |',
             '|---|---|---|---|---|---|---|---|---|---|']
    failed_lines, skipped = [], []
    for name, values in models:
        for router in ('static', 'dynamic'):
            if not clock.allows_another():
                skipped.append(f"{name} {router}")
                continue
            cfg = model_config(values, router=router)
            started = time.time()
            with clock.piece():
                result = check_model(cfg)
            lines.append(gradient_row(name, router, cfg, result, time.time() - started))
            if result['failed']:
                failed_lines.append(failure_line(name, router, result))
            free_memory()
    return '\n'.join(lines + ([''] + failed_lines if failed_lines else []) + left_out(skipped))


# -----------------------------------------------------------------------------
# Part 3: train.py under torchrun, the definition and memory.py side by side

EVAL_ITERS = 2  # validation batches of each run's evaluations
RUN_TIMEOUT = 600  # seconds: a run still going by then is stopped, not waited for
RUNS = [('static', 'definition'), ('static', 'memory.py'), ('dynamic', 'definition'),
        ('dynamic', 'memory.py'), ('none', '-')]  # (router, mix), in the order they run


def write_random_shards(data_dir, values):
    """A validation shard of EVAL_ITERS batches and a training shard of one optimizer step's
    micro-batches (train.py reads it round and round), in prepare.py's format, of random tokens
    from a quarter of the vocabulary: a model learns which within a few steps, so its loss moves."""
    batch_tokens = values['batch_size'] * values['block_size']
    rng = np.random.default_rng(0)
    for split, index, batches in (('val', 0, EVAL_ITERS),
                                  ('train', 1, values['gradient_accumulation_steps'])):
        tokens = rng.integers(0, values['vocab_size'] // 4, batches * batch_tokens + 1)
        write_shard(shard_path(data_dir, 'random', split, index), tokens)


def train_command(router, mix, data_dir, out_dir):
    """torchrun's arguments: train.py as a user starts it, with these runs' settings and the mix
    named ('definition', 'memory.py', or '-': the baseline has none), and on a CPU a tiny model."""
    command = ['--standalone', '--nproc_per_node=1', 'train.py', preset, f'--router={router}',
               f'--data_dir={data_dir}', f'--out_dir={out_dir}', f'--max_iters={steps}',
               f'--eval_interval={steps}', f'--eval_iters={EVAL_ITERS}', '--log_interval=1',
               '--warmup_iters=0']  # no warmup: the few steps' learning rate moves the loss
    # Each mix by name: the automatic choice (fused=None) is not the same on a GPU as on a CPU
    if mix != '-':
        command.append(f"--fused={mix == 'memory.py'}")
    if not ON_A_GPU:
        command += [f'--{key}={value}' for key, value in ON_A_CPU.items()]
    return command


def run_torchrun(arguments, timeout):
    """(torchrun's exit code, or None where it ran past timeout seconds and was stopped; its
    stderr). `python -m torch.distributed.run` is torchrun, run by this Python. In a session of
    its own, so that a stop reaches torchrun's worker too."""
    process = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', *arguments],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        return None, stderr
    return process.returncode, stderr


def why_it_failed(stderr):
    """The line that says why a run failed: train.py's `error: ...`, else the worker's last
    exception (torchrun's own report of the failure comes after it), else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()] or ['no output']
    errors = [line for line in lines if line.startswith('error: ')]
    exceptions = [line for line in lines if re.match(r'[\w.]+(Error|Exception): ', line)]
    return (errors or exceptions or lines)[-1][:200]


def gpu_memory_used():
    free, total = torch.cuda.mem_get_info()
    return total - free


def watching_gpu_memory(work):
    """(work()'s result, the most GPU memory in use while it ran beyond what was in use before,
    GiB; None without a GPU). The whole device's, polled every 0.1 s: a run in another process
    holds its memory where this process's allocator cannot see it."""
    if not ON_A_GPU:
        return work(), None
    before = gpu_memory_used()
    peak = [before]
    done = threading.Event()

    def poll():
        while not done.wait(0.1):
            peak[0] = max(peak[0], gpu_memory_used())
    poller = threading.Thread(target=poll)
    poller.start()
    try:
        result = work()
    finally:
        done.set()
        poller.join()
    return result, (peak[0] - before) / 2**30


def read_log(out_dir):
    """A run's losses, tokens/s (the median of the steps after the first, which compiled) and
    compile time (the first step's beyond a later one's) from its log.txt records."""
    with open(os.path.join(out_dir, 'log.txt')) as f:
        records = [json.loads(line) for line in f][1:]  # the first is the run's settings
    evals = [r['val_loss'] for r in records if 'val_loss' in r]
    trained = [r for r in records if 'train_loss' in r]
    later = [r for r in trained if r['step'] > 1]
    result = {'val': evals, 'train': [r['train_loss'] for r in trained],
              'tokens_per_s': None, 'compile_s': None}
    if later:
        result['tokens_per_s'] = statistics.median(r['tokens_per_sec'] for r in later)
        step_ms = statistics.median(r['ms_per_step'] for r in later)
        if ON_A_GPU:  # (on a CPU train.py runs eager)
            result['compile_s'] = max(0.0, trained[0]['ms_per_step'] - step_ms) / 1000
    return result


def train_run(router, mix, data_dir, out_dir):
    started = time.time()
    arguments = train_command(router, mix, data_dir, out_dir)
    (code, stderr), peak = watching_gpu_memory(lambda: run_torchrun(arguments, RUN_TIMEOUT))
    if code != 0:
        return {'error': f"ran past {RUN_TIMEOUT} s: stopped" if code is None else
                why_it_failed(stderr)}
    result = {**read_log(out_dir), 'peak_gib': peak, 'run_s': time.time() - started}
    shutil.rmtree(out_dir)  # its checkpoint: GBs at gpt2's size, and of no use here
    return result


def cell(value, spec):
    return '-' if value is None else format(value, spec)


def ratio(value, base):
    return None if value is None or not base else value / base


def training_row(router, mix, run, base):
    if 'error' in run:
        return f"| {router} | {mix} | FAILED: {run['error']} |"
    losses = [run['val'][0], run['train'][0], run['train'][-1], run['val'][-1]]
    return (f"| {router} | {mix} | " + ' | '.join(f"{loss:.4f}" for loss in losses)
            + f" | {cell(run['tokens_per_s'], ',.0f')} | "
            f"{cell(ratio(run['tokens_per_s'], base.get('tokens_per_s')), '.3f')} | "
            f"{cell(run['peak_gib'], '.2f')} | "
            f"{cell(ratio(run['peak_gib'], base.get('peak_gib')), '.3f')} | "
            f"{cell(run['compile_s'], '.1f')} | {run['run_s']:.0f} |")


def comparison(router, definition, fast):
    """A line on one router's two runs: their loss curves, speed and memory, and on a GPU
    whether the automatic choice there (fused=None: the compiled definition) is the faster."""
    gap = max(abs(a - b) for a, b in zip(definition['val'] + definition['train'],
                                         fast['val'] + fast['train']))
    speed = ratio(fast['tokens_per_s'], definition['tokens_per_s'])
    peak = ratio(fast['peak_gib'], definition['peak_gib'])
    line = (f"- {router}: the largest gap between the two runs' losses is {gap:.4f} "
            f"({'within' if gap <= LOSS_GAP else 'NOT within'} {LOSS_GAP}: a check of the run's "
            f"path, not of the gradients, which part 2 tests); memory.py / the definition: "
            f"tokens/s {cell(speed, '.3f')}" + ('' if peak is None else f", GPU memory {peak:.3f}"))
    if ON_A_GPU and speed is not None:  # on a GPU fused=None runs the definition (kernels/)
        line += ('. The compiled definition is the faster here: the automatic choice on a GPU '
                 '(fused=None) runs it' if speed < 1 else
                 f". memory.py is the faster here: on this GPU a {router} run should set "
                 "--fused=True, and the automatic choice (kernels/__init__.py) be measured again")
    return line


def training(clock):
    """Part 3: the baseline, then each LIMe router with the definition and with memory.py."""
    values = preset_values(os.path.join(ROOT, preset))
    if not ON_A_GPU:
        values.update(ON_A_CPU)
    runs, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        write_random_shards(tmp, values)
        # The two mixes side by side first, the baseline last: what a short budget leaves out
        for router, mix in RUNS:
            if not clock.allows_another():
                skipped.append(router if router == 'none' else f"{router} with {mix}")
                continue
            print(f"  {router}, {mix}...", file=sys.stderr, flush=True)
            with clock.piece():
                run = train_run(router, mix, tmp, os.path.join(tmp, f"{router}-{mix}"))
            runs.append((router, mix, run))
    runs.sort(key=lambda run: ROUTERS.index(run[0]))  # the table: the baseline first
    how = ('compiled, bf16' if ON_A_GPU else
           f"on a CPU: a tiny model ({describe(model_config(values))}), float32, eager")
    shown = ['torchrun'] + train_command('ROUTER', '-', '<random tokens>', '<a directory>')
    lines = [f"Each run: `{' '.join(shown)}`, with `--fused=False` for the definition and "
             f"`--fused=True` for memory.py; {how}; "
             f"{values['batch_size']} sequences x {values['gradient_accumulation_steps']} "
             f"micro-steps a step; {EVAL_ITERS} validation batches. GPU memory: the most the "
             "device had in use during the run beyond before it (polled).", '',
             f"| router | mix | val loss, step 0 | loss, step 1 | loss, step {steps} | "
             f"val loss, step {steps} | tokens/s | vs none | GPU GiB | vs none | compile s | "
             "run s |", '|---|---|---|---|---|---|---|---|---|---|---|---|']
    base = next((run for router, _, run in runs if router == 'none' and 'error' not in run), {})
    lines += [training_row(router, mix, run, base) for router, mix, run in runs]
    done = {(router, mix): run for router, mix, run in runs if 'error' not in run}
    pairs = [router for router in ('static', 'dynamic')
             if (router, 'definition') in done and (router, 'memory.py') in done]
    if pairs:
        lines.append('')
    lines += [comparison(router, done[router, 'definition'], done[router, 'memory.py'])
              for router in pairs]
    return '\n'.join(lines + left_out(skipped))


# -----------------------------------------------------------------------------
# Part 4: the mix's kernels, and attention's backend

PROFILED_PASSES = 3


def mix_inputs(router, cfg, B, dtype):
    """Random keys/values of every layer (B, T, 2, G, hs), gradients for every mix's output, and
    the routers' weights: R (G, S*G), or probabilities (B, T, G, S) in float32 as a router's."""
    G, hs, T, L = cfg.n_kv_head, cfg.n_embd // cfg.n_head, cfg.block_size, cfg.n_layer
    shape = (B, T, 2, G, hs)
    sources = [torch.randn(shape, device=DEVICE, dtype=dtype, requires_grad=True)
               for _ in range(L)]
    douts = [torch.randn(shape, device=DEVICE, dtype=dtype) for _ in range(L - 1)]
    if router == 'static':
        weights = [torch.randn(G, S * G, device=DEVICE) for S in range(2, L + 1)]
    else:
        weights = [torch.randn(B, T, G, S, device=DEVICE).softmax(-1) for S in range(2, L + 1)]
    return sources, douts, [w.requires_grad_() for w in weights]


def mix_pass(router, sources, douts, weights):
    """Every layer's mix, as GPT.forward calls them, then their backward pass from douts."""
    mix = memory.static_mix if router == 'static' else memory.dynamic_mix
    layer_memory = memory.LayerMemory(len(sources))
    outs = []
    for layer, kv in enumerate(sources):
        layer_memory[layer] = kv
        if layer > 0:
            outs.append(mix(weights[layer - 1], layer_memory[:layer + 1]))
    torch.autograd.backward(outs, douts)
    for tensor in sources + weights:
        tensor.grad = None


def op_bytes(name, shapes, element_size):
    """The least an op of the mix moves: its operands read once, its result written once (in
    place, the first operand is read and written; a copy reads one and writes the other). An
    operand broadcast over a batched product counts once a batch entry, as the product reads
    it. None where an op is not one of these."""
    sizes = [math.prod(shape) for shape in shapes if shape]  # tensors (a scalar's shape is [])
    if name in ('aten::copy_', 'aten::zero_', 'aten::fill_'):
        moved = sum(sizes)
    elif name in ('aten::mm', 'aten::bmm'):
        a, b = shapes[0], shapes[1]
        moved = sizes[0] + sizes[1] + math.prod(a[:-1]) * b[-1]
    elif name.endswith('_'):  # baddbmm_, addcmul_: read, modify, write the first operand
        moved = sum(sizes) + sizes[0]
    elif name in ('aten::mul', 'aten::add', 'aten::sum'):
        moved = sum(sizes) + (max(sizes) if name != 'aten::sum' else 0)
    else:
        return None
    return moved * element_size


def op_time_s(event):
    """An op's own time: on a GPU its kernels' (not the ops it calls), on a CPU its own work."""
    us = event.self_device_time_total if ON_A_GPU else event.self_cpu_time_total
    return us / 1e6


def profile_mix(router, cfg, B, dtype):
    """{op: [calls, seconds, bytes or None]} a pass: every layer's mix, forward and backward,
    under the profiler, after a pass to warm up."""
    inputs = mix_inputs(router, cfg, B, dtype)
    mix_pass(router, *inputs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ON_A_GPU else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(PROFILED_PASSES):
            mix_pass(router, *inputs)
    ops = {}
    for event in prof.events():
        seconds = op_time_s(event)
        if event.device_type != DeviceType.CPU or not event.name.startswith('aten::'):
            continue  # a kernel (its op counts it), or autograd's and the profiler's own records
        if seconds <= 0:  # a view, or an op whose work is in the ops it calls
            continue
        moved = op_bytes(event.name, event.input_shapes, torch.finfo(dtype).bits // 8)
        calls, total, nbytes = ops.get(event.name, (0, 0.0, 0))
        nbytes = None if moved is None or nbytes is None else nbytes + moved
        ops[event.name] = (calls + 1, total + seconds, nbytes)
    return {name: [calls / PROFILED_PASSES, seconds / PROFILED_PASSES,
                   None if nbytes is None else nbytes / PROFILED_PASSES]
            for name, (calls, seconds, nbytes) in ops.items()}


def floor_bytes(cfg, B, element_size):
    """docs/performance.md's floor: (2S + 3) N elements a layer, N = B*T*2*G*hs."""
    N = B * cfg.block_size * 2 * cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    return sum((2 * S + 3) * N for S in range(2, cfg.n_layer + 1)) * element_size


def mix_rows(router, cfg, B, dtype):
    """(the table's rows for a router's mix: its 8 slowest ops; a line on all its ops against
    the floor)."""
    ops = profile_mix(router, cfg, B, dtype)
    total_s = sum(seconds for _, seconds, _ in ops.values())
    rows = []
    for name, (calls, seconds, nbytes) in sorted(ops.items(), key=lambda op: -op[1][1])[:8]:
        rows.append(f"| {router} | {name} | {calls:.0f} | {seconds * 1e3:.2f} | "
                    f"{seconds / total_s:.1%} | {cell(nbytes and nbytes / 1e9, '.3g')} | "
                    f"{cell(nbytes and nbytes / seconds / 1e9, ',.0f')} |")
    moved = sum(nbytes for _, _, nbytes in ops.values() if nbytes is not None)
    floor = floor_bytes(cfg, B, torch.finfo(dtype).bits // 8)
    line = (f"- {router}, all its ops: {total_s * 1e3:.2f} ms a pass; {moved / 1e9:.3g} GB by "
            f"their operands, {moved / total_s / 1e9:,.0f} GB/s; docs/performance.md's floor, "
            f"(2S + 3) N a layer: {floor / 1e9:.3g} GB")
    if ON_A_GPU:
        line += (f", {floor / BANDWIDTH * 1e3:.2f} ms at {BANDWIDTH / 1e12:g} TB/s: the mix "
                 f"takes {total_s / (floor / BANDWIDTH):.1f}x the floor's time")
    return rows, line


SDPA_BACKENDS = {'flash': torch.backends.cuda.flash_sdp_enabled,  # each with its switch
                 'efficient': torch.backends.cuda.mem_efficient_sdp_enabled,
                 'cudnn': torch.backends.cuda.cudnn_sdp_enabled,
                 'math': torch.backends.cuda.math_sdp_enabled}


def sdpa_ops(cfg):
    """The scaled_dot_product_attention kernels (the profiler's op names) of a training step of
    cfg's model with memory.py: compiled and in bf16 on a GPU, as train.py runs it."""
    use_fused_kernels(True, DEVICE)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(cfg).to(DEVICE)
    step_model = compile_model(model) if ON_A_GPU else model
    x = torch.randint(0, cfg.vocab_size, (SMALL_BATCH, cfg.block_size + 1), device=DEVICE)
    autocast = bf16_autocast() if ON_A_GPU else nullcontext()

    def step():
        with autocast:
            _, loss = step_model(x[:, :-1], x[:, 1:])
        loss.backward()
        model.zero_grad(set_to_none=True)
    step()  # compiles
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sorted({e.name for e in prof.events() if '_scaled_dot_product' in e.name})


def sdpa_line(cfg):
    names = sdpa_ops(cfg)
    ran = [backend for backend in SDPA_BACKENDS if any(backend in name for name in names)]
    enabled = [backend for backend, switch in SDPA_BACKENDS.items() if switch()]
    how = 'compiled, bf16' if ON_A_GPU else 'eager'
    return (f"- SDPA in a training step of the static model ({how}, {SMALL_BATCH} sequences): "
            f"{', '.join(ran) or 'no backend named'} ran "
            f"({', '.join(names) or 'no SDPA op: attention in plain products'}); enabled in "
            f"torch.backends.cuda: {', '.join(enabled)}")


def profile_part(clock):
    """Part 4: the mix's kernels at the preset's shape, each router; the SDPA backend."""
    values = preset_values(os.path.join(ROOT, preset))
    cfg = model_config(values) if ON_A_GPU else model_config(values, **ON_A_CPU)
    B = values['batch_size'] if ON_A_GPU else 4
    dtype = torch.bfloat16 if ON_A_GPU else torch.float32
    how = ('bf16, the kernels\' time' if ON_A_GPU else
           f"on a CPU: a tiny model ({describe(cfg)}), float32, the ops' own CPU time")
    rows, lines, skipped = [], [], []
    for router in ('static', 'dynamic'):
        if not clock.allows_another():
            skipped.append(f"{router}'s mix")
            continue
        with clock.piece():
            router_rows, line = mix_rows(router, model_config(vars(cfg), router=router), B, dtype)
        rows += router_rows
        lines.append(line)
        free_memory()
    if clock.allows_another():
        lines.append(sdpa_line(model_config(vars(cfg), router='static')))
    else:
        skipped.append('the SDPA backend')
    return '\n'.join([
        f"The mixes of {preset}'s {cfg.n_layer} layers alone (memory.py, eager, as a run runs "
        f"them between its compiled pieces), forward and backward, {B} sequences, {how}; a "
        f"pass's mean over {PROFILED_PASSES}, the 8 slowest ops of each router. GB: what an op's "
        "operands hold, each read or written once (op_bytes).", '',
        '| router | op | calls | ms | share | GB | GB/s |', '|---|---|---|---|---|---|---|',
        *rows, '', *lines, *left_out(skipped)])


# -----------------------------------------------------------------------------
# Part 5: 64 layers


def timed_steps(cfg, n_steps, B):
    """n_steps training steps (AdamW) of a model of cfg with memory.py, on random tokens; on a
    GPU compiled and in bf16 autocast, as train.py runs it. Returns each step's seconds, the peak
    memory (GiB, on a GPU) and, compiled, what dynamo made of it."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    free_memory()
    use_fused_kernels(True, DEVICE)
    torch.manual_seed(0)
    model = GPT(cfg).to(DEVICE).train()
    optimizer = model.configure_optimizers(0.1, 3e-4, 3e-3, fused=ON_A_GPU)
    step_model = compile_model(model) if ON_A_GPU else model
    autocast = bf16_autocast() if ON_A_GPU else nullcontext()
    x = torch.randint(0, cfg.vocab_size, (B, cfg.block_size + 1), device=DEVICE)
    if ON_A_GPU:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(n_steps):
        started = time.perf_counter()
        with autocast:
            _, loss = step_model(x[:, :-1], x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # waits for the GPU
        times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() / 2**30 if ON_A_GPU else None
    return times, peak, dynamo_summary() if ON_A_GPU else 'eager'


def deep_model(clock):
    """Part 5: each router at 64 layers, with memory.py."""
    values = preset_values(os.path.join(ROOT, 'config', 'deep.py'))
    cfg = model_config(values, n_layer=64) if ON_A_GPU else model_config(values, **ON_A_CPU)
    B = DEEP_BATCH if ON_A_GPU else 2
    what = ("config/deep.py's model at 64 layers" if ON_A_GPU else
            "on a CPU, a tiny model instead of config/deep.py's at 64 layers")
    how = 'bf16, compiled' if ON_A_GPU else 'float32, eager'
    lines = [f"{what} ({describe(cfg)}), {deep_steps} steps of {B} sequences of random tokens, "
             f"memory.py, {how}.", '',
             '| router | first step s | later step s | compile s | peak GiB | compiled as |',
             '|---|---|---|---|---|---|']
    skipped = []
    for router in ('static', 'dynamic', 'none'):  # LIMe's first: what a short budget leaves out
        if not clock.allows_another():
            skipped.append(router)
            continue
        print(f"  {router}...", file=sys.stderr, flush=True)
        with clock.piece():
            times, peak, compiled = timed_steps(model_config(vars(cfg), router=router),
                                                deep_steps, B)
        later = statistics.median(times[1:]) if len(times) > 1 else None
        compile_s = None if later is None or not ON_A_GPU else max(0.0, times[0] - later)
        lines.append(f"| {router} | {times[0]:.2f} | {cell(later, '.2f')} | "
                     f"{cell(compile_s, '.1f')} | {cell(peak, '.2f')} | {compiled} |")
    return '\n'.join(lines + left_out(skipped))


# -----------------------------------------------------------------------------
# Part 6: the tests, beside the others


def start_tests():
    """tests/test_kernels.py in a process of its own, started now: on the CPU only (the GPU
    hidden from it) and in two threads, to leave the GPU parts' timings alone. None without
    pytest."""
    if importlib.util.find_spec('pytest') is None:
        return None
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='2',
               TORCHINDUCTOR_COMPILE_THREADS='1',
               COLUMNS='200')  # wide enough for pytest to say why each failure failed
    output = tempfile.TemporaryFile('w+')  # not a pipe, which a long output would fill
    process = subprocess.Popen([sys.executable, '-m', 'pytest', '-q', 'tests/test_kernels.py'],
                               cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, text=True,
                               env=env)
    return process, output


def tests_result(started):
    """pytest's summary line and its failures, once it has finished."""
    if started is None:
        return 'skipped: pytest is not installed (pip install pytest)'
    process, output = started
    process.wait()
    output.seek(0)
    lines = output.read().strip().splitlines()
    failures = [line for line in lines if line.startswith(('FAILED', 'ERROR'))]
    summary = lines[-1] if lines else 'no output'
    return '\n'.join([f"{'passed' if process.returncode == 0 else 'FAILED'}: {summary}",
                      *failures])


# -----------------------------------------------------------------------------


def commit():
    """This checkout's commit, and whether its tracked files differ from it."""
    def git(*args):
        try:
            return subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None
    changed = git('status', '--porcelain', '--untracked-files=no')
    return (git('rev-parse', '--short', 'HEAD') or 'unknown') + (' with changes' if changed else '')


def environment():
    gpu = 'no CUDA GPU'
    if ON_A_GPU:
        major, minor = torch.cuda.get_device_capability()
        gpu = (f"{torch.cuda.get_device_name()} (compute capability {major}.{minor}), CUDA "
               f"{torch.version.cuda}")
    return (f"{date.today()}, commit {commit()}, {gpu}, torch {torch.__version__}, Python "
            f"{platform.python_version()}")


PARTS = {'self_check': ('1. Self-check at every preset', self_checks),
         'gradients': ('2. Gradients: compiled memory.py against the eager definition',
                       gradients),
         'training': ('3. Training with train.py: the definition vs memory.py, and the baseline',
                      training),
         'profile': ("4. Profile: the mix's kernels, and attention's backend", profile_part),
         'deep': ('5. 64 layers: compile time and memory', deep_model),
         'tests': ('6. Kernel tests', None)}


def check_presets():
    """Every preset this run reads, checked now, not after minutes of the parts before it."""
    for path in [preset] + (presets.split(',') if presets else []):
        if not os.path.isfile(os.path.join(ROOT, path)):
            fail(f"preset not found: {path}")
        try:
            model_config(preset_values(os.path.join(ROOT, path)))
        except (TypeError, ValueError) as e:  # a value of another type, or out of its range
            fail(f"preset {path}: {e}")


def main():
    config, _, _ = configure(globals(), {'path': ['preset', 'report'], 'text': ['parts', 'presets'],
                                         'positive': ['steps', 'deep_steps', 'minutes']})
    globals().update(config)
    if ON_A_GPU:  # float32 matmuls may use TF32, as in train.py (configurator.configure)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    chosen = parts.split(',')
    for part in chosen:
        if part not in PARTS:
            fail(f"parts: {part!r} is not one of {', '.join(PARTS)}")
    check_presets()
    tests = start_tests() if 'tests' in chosen else None
    text = ['# lab/gpu_check.py report', '', environment()]
    crashed = []
    check_started = time.time()
    for name in chosen:
        title, part = PARTS[name]
        print(f"{title}...", file=sys.stderr, flush=True)
        started = time.time()
        clock = Clock(SHARES.get(name, 0) * minutes * 60)
        try:
            body = tests_result(tests) if name == 'tests' else part(clock)
        except Exception as e:  # the other parts' results still make the report
            body = f"FAILED: {type(e).__name__}: {last_line(e)}"
            crashed.append(name)
        free_memory()
        text += ['', f"## {title}", '', body, '', f"({name}: {time.time() - started:.0f} s)"]
    text += ['', f"(all: {time.time() - check_started:.0f} s; budget {minutes:g} minutes)"]
    text = '\n'.join(text) + '\n'
    print(text)
    write_atomically(report, lambda f: f.write(text.encode('utf-8')))
    print(f"written to {report}", file=sys.stderr)
    if crashed:
        fail(f"{', '.join(crashed)}: stopped with an error (see the report)")


if __name__ == '__main__':
    main()
