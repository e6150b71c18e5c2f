"""
gpu_check.py: one command that checks and times LIMe's mix on this GPU, with this torch, as a
training run compiles it, and writes one report (markdown, to paste into docs/performance.md).

    python -m lab.gpu_check                                 # 4 minutes on one H200, 8 at most
    python -m lab.gpu_check --parts=deep,gradients --minutes=20

The default parts, in this order. profile: the mixes of all the preset's layers alone
(kernels/memory.py, eager, as a run runs them between its compiled pieces), forward and backward:
each op's time and bytes/s, beside the floor of (2S + 3) N elements a layer (docs/performance.md).
training: the preset's training step (compiled, bf16) with each mix of VARIANTS, the definition
before the head-major change among them (static_before): the first step's gradients judged
against the eager definition's in float32 (judge), then tokens/s, the ratio to the baseline's,
peak memory, compile seconds and the attention kernel. Behind --parts (PARTS): deep, the training
part at 64 layers; gradients, its first step at every preset; self_check, memory.self_check at
every preset; tests, tests/test_kernels.py on the CPU beside the others; train_py, train.py itself
under torchrun with each mix.

It keeps to --minutes: a piece of a part (a mix, a router, a preset) starts only while the time
left is at least the longest piece of the part so far, and at the end of the time the piece still
running is stopped; the report names what was left out. On a CPU the same code runs a tiny model
(ON_A_CPU), eager and in float32: its paths and pass rule, not a GPU's numbers.
"""
import ast
import gc
import glob
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from datetime import date
from unittest.mock import patch

import numpy as np
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

from configurator import configure, fail, read_text
import kernels
from kernels import memory
from lab.plot import read_log
from lime import GPT, DynamicRouter, GPTConfig, StaticRouter, last_line
from prepare import shard_path, write_shard
from bookkeeping import write_whole

# -----------------------------------------------------------------------------
preset = 'config/gpt2.py'  # the model of the profile, training and train_py parts
presets = ''  # the gradients part's presets, comma-separated paths; '' = every config/*.py
parts = 'profile,training'  # in this order; also: deep, gradients, self_check, tests, train_py
steps = 8  # training steps of each mix in the training and train_py parts (the first compiles)
deep_steps = 3  # the same in the deep part
minutes = 8.0  # the whole command's time
report = 'gpu_check.md'  # where the report goes
# -----------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ON_A_GPU = torch.cuda.is_available()
DEVICE = 'cuda' if ON_A_GPU else 'cpu'
# On a CPU, these keys instead of the presets' (a preset's full shape takes minutes a step)
ON_A_CPU = dict(n_layer=4, n_embd=32, n_head=2, n_kv_head=0, mlp_hidden=0, block_size=32,
                vocab_size=256, batch_size=4, gradient_accumulation_steps=2)
# (router, mix) in the order they run, what matters most first: the time may run out
VARIANTS = [('static', 'before'), ('static', 'definition'), ('none', '-'),
            ('dynamic', 'definition'), ('static', 'memory.py'), ('dynamic', 'memory.py')]
MIXES = ("Mixes: `definition`, lime.py's; `before`, the static definition before the head-major "
         "change (R @ torch.cat(memory)); `memory.py`, kernels/memory.py (fused=True).")
# The float32 reference runs this many sequences at a time: gpt2's 32 at once, eager, would take
# about 70 GB of an 80 GB H100 (their logits, and torch.cat's copies of the memory); 8 of
# config/deep.py's at 64 layers, about as much
REFERENCE_CHUNK = 2
SMALL_BATCH = 2  # the gradients part's sequences: two, so that a mix of two sequences shows
DEEP_BATCH = 8  # the deep part's sequences
# bfloat16 keeps 8 significant bits: a gradient through a few layers of bf16 products is off by
# about 1e-2 of its largest entry (tests/test_kernels.py's compiled test allows 5e-2). A deep model
# rounds more: judge allows this plus twice the definition's own error under bf16 autocast.
BF16_TOLERANCE = 5e-2
LOSS_GAP = 0.05  # train_py: two runs' losses differ by at most this over a few bf16 steps
BANDWIDTH = 3.0e12  # an H100's memory bandwidth, bytes/s, as measured (lab/bench.py's bandwidth)
PASSES = 3  # the profile part's passes of every mix, under the profiler after one to warm up
DEADLINE = time.time() + 60 * minutes  # main sets it from --minutes


class TimeUp(Exception):
    """The end of --minutes, raised by an alarm in whatever piece is running."""


def time_up(signum, frame):
    raise TimeUp()


def preset_values(path):
    """A config file's `key = literal` lines, over train.py's defaults for the keys read here."""
    values = {'n_layer': 12, 'n_head': 12, 'n_kv_head': 0, 'n_embd': 768, 'block_size': 1024,
              'mlp_hidden': 0, 'vocab_size': 50257, 'batch_size': 16,
              'gradient_accumulation_steps': 32}
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


def config_of(values):
    # Without router_init: a preset's start for the static router (config/deep.py's) would stop
    # the other routers' models; the start changes what a mix computes, not how fast or how right.
    return GPTConfig(**{f: values[f] for f in GPTConfig.__dataclass_fields__
                        if f in values and f != 'router_init'})


def preset_model(path):
    """(a preset's GPTConfig, its batch size), on a CPU with ON_A_CPU's keys instead."""
    values = {**preset_values(os.path.join(ROOT, path)), **({} if ON_A_GPU else ON_A_CPU)}
    return config_of(values), values['batch_size']


def describe(cfg, B):
    return (f"{cfg.n_layer} layers x {cfg.n_embd}, {cfg.n_head} heads, {cfg.n_kv_head} kv heads, "
            f"{B} x {cfg.block_size} tokens")


def cell(value, spec):
    return '-' if value is None else format(value, spec)


def ratio(value, base):
    return None if value is None or not base else value / base


def pieces(names, work, label=str):
    """([(name, work(name) or a line saying why it failed)], [what was left out, by label(name)]):
    a name's piece starts only while the time left is at least the longest piece so far, and an
    alarm stops it at the deadline."""
    done, skipped, longest = [], [], 0.0
    signal.signal(signal.SIGALRM, time_up)
    for name in names:
        if DEADLINE - time.time() < longest:
            skipped.append(label(name))
            continue
        started = time.time()
        signal.setitimer(signal.ITIMER_REAL, max(DEADLINE - started, 1e-3))
        try:
            done.append((name, work(name)))
        except Exception as e:  # the other pieces' results still make the report
            if time.time() >= DEADLINE:  # TimeUp, or what torch.compile made of it
                skipped.append(f"{label(name)} (stopped at the time limit)")
            else:
                done.append((name, f"FAILED: {type(e).__name__}: {last_line(e)}"))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        gc.collect()
        if ON_A_GPU:
            torch.cuda.empty_cache()
        longest = max(longest, time.time() - started)
    return done, skipped


def left_out(skipped):
    return ['', f"Left out, the time spent: {', '.join(skipped)}."] if skipped else []


# -----------------------------------------------------------------------------
# The mixes, and the pass rule on one step's gradients

def static_before(self, h, memory):
    """The static mix as lime.py defined it before the head-major change: all S*G (layer, head)
    sources side by side (B, T, 2, S*G, hs), and R (G, S*G) @ each (S*G, hs) matrix of them."""
    return self.mix_weights() @ torch.cat(list(memory), dim=3)  # (B, T, 2, G, hs)


@contextmanager
def mix(name):
    """The mix `name` of VARIANTS in use for 'before': the static router's forward swapped for
    static_before, whatever lime.py's is now (memory.py: kernels.install on the model)."""
    swap = patch.object(StaticRouter, 'forward', static_before) if name == 'before' else None
    with swap or nullcontext():
        yield


def seeded_model(cfg):
    """The same weights for every mix of a router."""
    torch.manual_seed(0)
    model = GPT(cfg).to(DEVICE)
    for router in model.routers():
        if isinstance(router, DynamicRouter):  # not its zero init, under which every token
            # routes alike: an error in one token's gradient could hide in the sum over tokens
            nn.init.normal_(router.proj.weight, std=cfg.n_embd ** -0.5)
    return model


def gradients(model):
    """Every parameter's gradient, by name."""
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def relative_error(got, want):
    """max |got - want| over max |want|, on the device (a big model's gradients stay there)."""
    got, want = got.float(), want.float()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()


def reference_gradients(cfg, x):
    """({parameter: its gradient of one step of the eager definition in float32, on the CPU},
    {parameter: that gradient's error under bf16 autocast}: what bf16 alone does). Float32
    products stay float32: this command leaves torch's TF32 switch off, as it starts. The
    sequences run REFERENCE_CHUNK at a time, each chunk's loss weighted by its share of them."""
    model = seeded_model(cfg)
    grads = []
    with mix('definition'):
        for autocast in (nullcontext(), torch.autocast(DEVICE, torch.bfloat16)):
            for chunk in x.to(DEVICE).split(REFERENCE_CHUNK):
                with autocast:
                    _, loss = model(chunk[:, :-1], chunk[:, 1:])
                (loss * len(chunk) / len(x)).backward()
            grads.append(gradients(model))
            model.zero_grad(set_to_none=True)  # the tensors live on in grads
    reference, alone = grads
    alone = {name: relative_error(alone[name], want) for name, want in reference.items()}
    return {name: want.cpu() for name, want in reference.items()}, alone


def judge(reference, alone, fast):
    """The pass rule: ([(parameter, error, allowed, bf16 alone error)], [the parameters whose
    error is above what they are allowed]). Errors are relative to the reference's largest entry;
    a parameter is allowed BF16_TOLERANCE plus twice its bf16 alone error; one without a gradient
    is all wrong."""
    errors = []
    for name, want in reference.items():
        got = fast.get(name)
        error = 1.0 if got is None else relative_error(got, want.to(got.device))
        errors.append((name, error, BF16_TOLERANCE + 2 * alone[name], alone[name]))
    return errors, [name for name, error, allowed, _ in errors if not error <= allowed]


def verdict(errors, failed):
    """A table's cell: how many passed; the failed (three at most), else the nearest its bound."""
    shown = [e for e in errors if e[0] in failed][:3] or [max(errors, key=lambda e: e[1] / e[2])]
    worst = '; '.join(f"{name} {error:.1e} (allowed {allowed:.1e}, bf16 alone {alone:.1e})"
                      for name, error, allowed, alone in shown)
    within = len(errors) - len(failed)
    return f"{'FAILED' if failed else 'passed'} {within} of {len(errors)}: {worst}"


# -----------------------------------------------------------------------------
# Each mix's training step: its gradients, speed, memory and compile time

def dynamo_summary():
    """What torch.compile made of the model since the counters were cleared: graphs, graph breaks
    (kernels/memory.py: one at each mix), and the functions it left to run eager."""
    counters = torch._dynamo.utils.counters
    eager = counters['frames']['total'] - counters['frames']['ok']
    return (f"{counters['stats']['unique_graphs']} graphs, "
            f"{sum(counters['graph_break'].values())} breaks, {eager} eager")


def attention_kernels(step):
    """The SDPA backends that step() runs, by the profiler's names for their ops."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    names = {event.name for event in prof.events() if '_scaled_dot_product' in event.name}
    backends = [b for b in ('flash', 'efficient', 'cudnn', 'math') if any(b in n for n in names)]
    return ', '.join(backends) or '-'


def train_variant(cfg, x, router, mix_name, n_steps, references):
    """n_steps training steps (forward, backward, AdamW) of cfg's model with one mix, compiled and
    in bf16 on a GPU (eager and float32 on a CPU, as train.py runs there). The first step's
    gradients are judged against the router's reference (made once a router); its time beyond a
    later step's is the compile time; the peak memory is the most allocated in the later steps."""
    torch._dynamo.reset()  # compiled afresh, as a new run compiles
    torch._dynamo.utils.counters.clear()
    cfg = replace(cfg, router=router)
    references[router] = references.get(router) or reference_gradients(cfg, x)
    x = x.to(DEVICE)
    with mix(mix_name):
        model = seeded_model(cfg)
        if mix_name == 'memory.py':  # no self-check: the self_check part is that
            kernels.install(model, DEVICE)
        optimizer = model.configure_optimizers(0.1, 3e-4, 3e-3, fused=ON_A_GPU)
        step_model = torch.compile(model) if ON_A_GPU else model
        autocast = torch.autocast(DEVICE, torch.bfloat16) if ON_A_GPU else nullcontext()
        judged = []

        def step():
            """The step's seconds; the first's gradients judged, outside its time."""
            started = time.perf_counter()
            with autocast:
                _, loss = step_model(x[:, :-1], x[:, 1:])
            loss.backward()
            loss.item()  # waits for the GPU
            seconds = time.perf_counter() - started
            if not judged:
                judged.append(judge(*references[router], gradients(model)))
            started = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if ON_A_GPU:
                torch.cuda.synchronize()
            return seconds + time.perf_counter() - started
        first = step()
        if ON_A_GPU:
            torch.cuda.reset_peak_memory_stats()
        later = statistics.median([step() for _ in range(n_steps - 1)]) if n_steps > 1 else None
        peak = torch.cuda.max_memory_allocated() / 2**30 if ON_A_GPU else None
        attention = attention_kernels(step)
    return {'gradients': verdict(*judged[0]), 'peak_gib': peak, 'attention': attention,
            'compile_s': max(0.0, first - later) if later and ON_A_GPU else None,
            'tokens_per_s': x[:, 1:].numel() / later if later else None,
            'compiled': dynamo_summary() if ON_A_GPU else 'eager'}


def variant_rows(path, B, n_steps, variants, changes):
    """(the table's rows for a preset's model, a mix a row, the baseline's first; what was left
    out; a line on the model). changes: GPTConfig fields to change, on a GPU."""
    cfg, batch_size = preset_model(path)
    if ON_A_GPU:
        cfg = replace(cfg, **changes)
    B = B if B and ON_A_GPU else batch_size
    x = torch.randint(0, cfg.vocab_size, (B, cfg.block_size + 1),
                      generator=torch.Generator().manual_seed(0))
    references = {}
    done, skipped = pieces(variants, lambda v: train_variant(cfg, x, *v, n_steps, references),
                           lambda v: ' '.join(word for word in (path, *v) if word != '-'))
    base = next((r for (router, _), r in done if router == 'none' and isinstance(r, dict)), {})
    rows = []
    for (router, mix_name), r in sorted(done, key=lambda d: d[0][0] != 'none'):
        first = f"| {path} | {router} | {mix_name} |"
        if isinstance(r, str):  # it failed
            rows.append(f"{first} {r} |")
            continue
        rows.append(f"{first} {r['gradients']} | {cell(r['tokens_per_s'], ',.0f')} | "
                    f"{cell(ratio(r['tokens_per_s'], base.get('tokens_per_s')), '.3f')} | "
                    f"{cell(r['peak_gib'], '.2f')} | "
                    f"{cell(ratio(r['peak_gib'], base.get('peak_gib')), '.3f')} | "
                    f"{cell(r['compile_s'], '.1f')} | {r['compiled']} | {r['attention']} |")
    return rows, skipped, f"- {path}: {describe(cfg, B)}"


def training_part(paths=None, B=None, n_steps=None, variants=VARIANTS, **changes):
    """A table of each mix's training step at each preset (paths; `preset`'s by default), B
    sequences (the preset's batch size by default): the training part, and with its arguments the
    deep and gradients parts."""
    rows, skipped, models = [], [], []
    for path in paths or [preset]:
        more, left, model = variant_rows(path, B, n_steps or steps, variants, changes)
        rows += more
        skipped += left
        models.append(model)
    how = 'compiled, bf16' if ON_A_GPU else 'on a CPU: a tiny model, eager, float32'
    return '\n'.join([
        f"Training steps (forward, backward, AdamW) of random tokens, {n_steps or steps} of each "
        f"mix, {how}. Gradients: the first step's against the eager definition's in float32, "
        f"each parameter's within {BF16_TOLERANCE:g} + twice its bf16 alone error (relative to "
        "its largest entry). tokens/s: the median later step's; peak memory: in the later steps; "
        "compile s: the first step's time beyond a later one's. " + MIXES, '',
        '| preset | router | mix | gradients | tokens/s | vs none | peak GiB | vs none | '
        'compile s | compiled as | attention |', '|---|---|---|---|---|---|---|---|---|---|---|',
        *rows, '', *models, *left_out(skipped)])


def gradients_part():
    paths = presets.split(',') if presets else sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/config/*.py"))
    return training_part(paths, SMALL_BATCH, 1, [v for v in VARIANTS if v[0] != 'none'])


# -----------------------------------------------------------------------------
# The mix's kernels alone

def mix_pass(router, cfg, B, dtype):
    """A function that runs every layer's mix as GPT.forward calls them, then their backward pass,
    on random keys/values (B, T, 2, G, hs), output gradients and router weights: R (G, S*G), or
    probabilities (B, T, G, S) in float32, as a router's."""
    G, hs, T, L = cfg.n_kv_head, cfg.n_embd // cfg.n_head, cfg.block_size, cfg.n_layer
    sources = [torch.randn(B, T, 2, G, hs, device=DEVICE, dtype=dtype, requires_grad=True)
               for _ in range(L)]
    douts = [torch.randn(B, T, 2, G, hs, device=DEVICE, dtype=dtype) for _ in range(L - 1)]
    if router == 'static':
        weights = [torch.randn(G, S * G, device=DEVICE) for S in range(2, L + 1)]
    else:
        weights = [torch.randn(B, T, G, S, device=DEVICE).softmax(-1) for S in range(2, L + 1)]
    weights = [w.requires_grad_() for w in weights]
    mix_of = memory.static_mix if router == 'static' else memory.dynamic_mix

    def run():
        layer_memory = memory.LayerMemory(L)
        outs = []
        for layer, kv in enumerate(sources):
            layer_memory[layer] = kv
            if layer > 0:
                outs.append(mix_of(weights[layer - 1], layer_memory[:layer + 1]))
        torch.autograd.backward(outs, douts)
        for tensor in sources + weights:
            tensor.grad = None
    return run


def op_elements(name, shapes):
    """The least an op of the mix moves, in elements: its operands read once, its result written
    once (in place, the first operand is read and written; a copy reads one and writes the
    other). None where an op is not one of these."""
    sizes = [math.prod(shape) for shape in shapes if shape]  # tensors (a scalar's shape is [])
    if name in ('aten::copy_', 'aten::zero_', 'aten::fill_'):
        return sum(sizes)
    if name in ('aten::mm', 'aten::bmm'):  # (.., m, k) @ (.., k, n) writes (.., m, n)
        return sizes[0] + sizes[1] + math.prod(shapes[0][:-1]) * shapes[1][-1]
    if name.endswith('_'):  # baddbmm_, addcmul_: read, modify, write the first operand
        return sum(sizes) + sizes[0]
    if name in ('aten::mul', 'aten::add', 'aten::sum'):
        return sum(sizes) + (max(sizes) if name != 'aten::sum' else 0)
    return None


def mix_rows(router, cfg, B, dtype):
    """(rows for a router's 8 slowest ops, a line on all its ops against the floor) of a pass of
    every layer's mix, forward and backward: the mean of PASSES under the profiler."""
    run = mix_pass(router, cfg, B, dtype)
    run()  # to warm up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ON_A_GPU else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(PASSES):
            run()
    size = torch.finfo(dtype).bits // 8
    ops = {}  # name: (calls, seconds, bytes or None) in the PASSES
    for e in prof.key_averages(group_by_input_shape=True):
        us = e.self_device_time_total if ON_A_GPU else e.self_cpu_time_total  # its own kernels'
        if not e.key.startswith('aten::') or us <= 0:  # views, and ops whose work others do
            continue
        elements = op_elements(e.key, e.input_shapes)
        calls, seconds, nbytes = ops.get(e.key, (0, 0.0, 0))
        nbytes = None if None in (elements, nbytes) else nbytes + elements * size * e.count
        ops[e.key] = (calls + e.count, seconds + us / 1e6, nbytes)
    ops = {name: (calls / PASSES, seconds / PASSES, nbytes and nbytes / PASSES)
           for name, (calls, seconds, nbytes) in ops.items()}  # a pass's
    total = sum(seconds for _, seconds, _ in ops.values())
    rows = [f"| {router} | {name} | {calls:.0f} | {seconds * 1e3:.2f} | {seconds / total:.1%} | "
            f"{cell(nbytes and nbytes / 1e9, '.3g')} | "
            f"{cell(nbytes and nbytes / seconds / 1e9, ',.0f')} |"
            for name, (calls, seconds, nbytes) in sorted(ops.items(), key=lambda o: -o[1][1])[:8]]
    moved = sum(nbytes for _, _, nbytes in ops.values() if nbytes is not None)
    N = B * cfg.block_size * 2 * cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    floor = sum((2 * S + 3) * N for S in range(2, cfg.n_layer + 1)) * size
    line = (f"- {router}, all its ops: {total * 1e3:.2f} ms a pass; {moved / 1e9:.3g} GB by their "
            f"operands, {moved / total / 1e9:,.0f} GB/s; the floor: {floor / 1e9:.3g} GB")
    if ON_A_GPU:
        line += (f", {floor / BANDWIDTH * 1e3:.2f} ms at {BANDWIDTH / 1e12:g} TB/s: the mix "
                 f"takes {total / (floor / BANDWIDTH):.1f}x the floor's time")
    return rows, line


def profile_part():
    cfg, B = preset_model(preset)
    dtype = torch.bfloat16 if ON_A_GPU else torch.float32
    how = "bf16, the kernels' time" if ON_A_GPU else "on a CPU: float32, the ops' own CPU time"
    done, skipped = pieces(['static', 'dynamic'], lambda r: mix_rows(r, cfg, B, dtype))
    rows = [row for _, result in done if isinstance(result, tuple) for row in result[0]]
    lines = [result[1] if isinstance(result, tuple) else result for _, result in done]
    return '\n'.join([
        f"The mixes of {preset}'s layers alone ({describe(cfg, B)}; kernels/memory.py, eager), "
        f"forward and backward, {how}; a pass's mean over {PASSES}, each router's 8 slowest "
        "ops. GB: what an op's operands hold, each read or written once (op_elements); the "
        "floor: (2S + 3) N a layer (docs/performance.md).", '',
        '| router | op | calls | ms | share | GB | GB/s |', '|---|---|---|---|---|---|---|',
        *rows, '', *lines, *left_out(skipped)])


# -----------------------------------------------------------------------------
# Behind --parts: the self-check, the kernel tests, train.py under torchrun

def self_check_part():
    """memory.self_check (which train.py runs with --fused=True on a GPU) at every preset's kv
    heads and head size, in bfloat16 and float32: 'passed' or what differed."""
    def check(path):
        cfg = config_of(preset_values(os.path.join(ROOT, path)))
        return ' | '.join(memory.self_check(cfg.n_kv_head, cfg.n_embd // cfg.n_head, dtype,
                                            DEVICE) or 'passed'
                          for dtype in (torch.bfloat16, torch.float32))
    paths = sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/config/*.py"))
    done, skipped = pieces(paths, check)
    return '\n'.join([f"memory.py on {DEVICE}, eager and under autocast as a run runs it, "
                      "against lime.py's definition in float32 on the CPU.", '',
                      '| preset | bfloat16 | float32 |', '|---|---|---|',
                      *[f"| {path} | {cells} |" for path, cells in done], *left_out(skipped)])


def run_for_the_time_left(arguments, **options):
    """(a process's exit code, its stdout and stderr), or TimeUp where it runs to the deadline
    (stopped then, with what it started: it runs in a session of its own)."""
    process = subprocess.Popen(arguments, cwd=ROOT, text=True, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)
    try:
        out, err = process.communicate(timeout=DEADLINE - time.time())
        return process.returncode, out, err
    except (subprocess.TimeoutExpired, TimeUp):
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise TimeUp() from None


def tests_part():
    """tests/test_kernels.py on the CPU (the GPU hidden from it), in two threads: pytest's summary
    line and its failures."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='2',
               TORCHINDUCTOR_COMPILE_THREADS='1', COLUMNS='200')  # wide: each failure's reason
    code, out, err = run_for_the_time_left(
        [sys.executable, '-m', 'pytest', '-q', 'tests/test_kernels.py'], env=env)
    lines = (out + err).strip().splitlines() or ['no output']
    failures = [line for line in lines if line.startswith(('FAILED', 'ERROR'))]
    return '\n'.join([f"{'passed' if code == 0 else 'FAILED'}: {lines[-1]}", *failures])


def train_run(router, fused, data_dir):
    """One train.py run under torchrun: (its val losses, its losses, tokens/s of the steps after
    the first, compile s on a GPU) from its log.txt, or a line saying why it failed."""
    out_dir = os.path.join(data_dir, f"{router}-{fused}")
    arguments = [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                 '--nproc_per_node=1', 'train.py', preset, f'--router={router}',
                 f'--data_dir={data_dir}', f'--out_dir={out_dir}', f'--max_iters={steps}',
                 f'--eval_interval={steps}', '--eval_iters=2', '--log_interval=1',
                 '--warmup_iters=0']  # no warmup: the few steps' learning rate moves the loss
    arguments += [] if fused is None else [f'--fused={fused}']  # not the automatic choice
    arguments += [] if ON_A_GPU else [f'--{key}={value}' for key, value in ON_A_CPU.items()]
    code, _, stderr = run_for_the_time_left(arguments)
    if code != 0:  # train.py's own `error:` line where it gave one
        errors = [line for line in stderr.splitlines() if line.startswith('error: ')]
        return f"FAILED: {(errors or [last_line(stderr)])[-1][:200]}"
    records = read_log(out_dir)[1]
    shutil.rmtree(out_dir)  # its checkpoint: GBs at gpt2's size, and of no use here
    trained = [r for r in records if 'train_loss' in r]
    later = statistics.median(r['ms_per_step'] for r in trained[1:] or trained) / 1000
    return ([r['val_loss'] for r in records if 'val_loss' in r],
            [r['train_loss'] for r in trained],
            statistics.median(r['tokens_per_sec'] for r in trained[1:] or trained),
            max(0.0, trained[0]['ms_per_step'] / 1000 - later) if ON_A_GPU else None)


def train_py_part():
    """train.py itself with each mix, end to end (evaluation, gradient accumulation, checkpoint),
    on shards of random tokens from a quarter of the vocabulary (learnt within a few steps, so
    the loss moves): a validation shard of 2 batches and a training shard of one step's."""
    values = {**preset_values(os.path.join(ROOT, preset)), **({} if ON_A_GPU else ON_A_CPU)}
    runs = [('none', None), ('static', False), ('static', True), ('dynamic', False),
            ('dynamic', True)]  # fused: False the definition, True memory.py
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for split, index, batches in (('val', 0, 2),
                                      ('train', 1, values['gradient_accumulation_steps'])):
            ids = rng.integers(0, values['vocab_size'] // 4,
                               batches * values['batch_size'] * values['block_size'] + 1)
            write_shard(shard_path(tmp, 'random', split, index), ids)
        done, skipped = pieces(runs, lambda run: train_run(*run, tmp),
                               lambda run: f"{run[0]} fused={run[1]}")
    results = {run: r for run, r in done if isinstance(r, tuple)}
    base = results.get(('none', None), [None] * 3)[2]
    rows, gaps = [], []
    for (router, fused), r in done:
        if isinstance(r, str):
            rows.append(f"| {router} | {fused} | {r} |")
            continue
        losses = [r[0][0], r[1][0], r[1][-1], r[0][-1]]
        rows.append(f"| {router} | {fused} | " + ' | '.join(f"{v:.4f}" for v in losses)
                    + f" | {r[2]:,.0f} | {cell(ratio(r[2], base), '.3f')} | {cell(r[3], '.1f')} |")
        if fused and (router, False) in results:
            other = results[router, False]
            gap = max(abs(a - b) for a, b in zip(r[0] + r[1], other[0] + other[1]))
            gaps.append(f"- {router}: the two mixes' losses differ by at most {gap:.4f} "
                        f"({'within' if gap <= LOSS_GAP else 'NOT within'} {LOSS_GAP})")
    return '\n'.join([
        f"`torchrun --standalone --nproc_per_node=1 train.py {preset} --router=R --fused=F`, "
        f"{values['batch_size']} sequences x {values['gradient_accumulation_steps']} micro-steps, "
        f"{steps} steps after an evaluation, on random tokens.", '',
        f"| router | fused | val loss, step 0 | loss, step 1 | loss, step {steps} | val loss, step "
        f"{steps} | tokens/s | vs none | compile s |", '|---|---|---|---|---|---|---|---|---|',
        *rows, '', *gaps, *left_out(skipped)])


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


# This order is the error line's; --parts gives the order they run in
PARTS = {'self_check': ('Self-check at every preset', self_check_part),
         'gradients': ('Gradients at every preset', gradients_part),
         'training': ('Training step: each mix', training_part),
         'profile': ("Profile: the mix's kernels alone", profile_part),
         'deep': ('64 layers: each mix',
                  lambda: training_part(['config/deep.py'], DEEP_BATCH, deep_steps, n_layer=64)),
         'tests': ('Kernel tests on the CPU', tests_part),
         'train_py': ('train.py under torchrun', train_py_part)}


def main():
    global DEADLINE
    config, _, _ = configure(globals(), {'path': ['preset', 'report'], 'text': ['parts', 'presets'],
                                         'positive': ['steps', 'deep_steps', 'minutes']})
    globals().update(config)
    chosen = parts.split(',')
    for part in chosen:
        if part not in PARTS:
            fail(f"parts: {part!r} is not one of {', '.join(PARTS)}")
    for path in [preset] + (presets.split(',') if presets else []):  # now, not minutes later
        try:
            config_of(preset_values(os.path.join(ROOT, path)))
        except (TypeError, ValueError) as e:  # a value of another type, or out of its range
            fail(f"preset {path}: {e}")
    started = time.time()
    DEADLINE = started + 60 * minutes - 15  # the seconds of the imports before and the report
    text, failed = ['# lab/gpu_check.py report', '', environment()], []
    # The tests part, a process on the CPU, runs beside the others: started first
    with ThreadPoolExecutor(1) as pool:
        tests = pool.submit(tests_part) if 'tests' in chosen else None
        for name in chosen:
            title, part = PARTS[name]
            print(f"{title}...", file=sys.stderr, flush=True)
            part_started = time.time()
            try:
                body = tests.result() if name == 'tests' else part()
            except TimeUp:  # the tests' process, stopped
                body = 'stopped at the time limit'
            except Exception as e:  # the other parts' results still make the report
                body = f"FAILED: {type(e).__name__}: {last_line(e)}"
            if 'FAILED' in body or 'NOT within' in body:
                failed.append(name)
            text += ['', f"## {title}", '', body, '',
                     f"({name}: {time.time() - part_started:.0f} s)"]
    text = '\n'.join(text + ['', f"(all: {time.time() - started:.0f} s of {minutes:g} minutes)"])
    print(text)
    write_whole(report, lambda f: f.write(text.encode('utf-8')))
    print(f"written to {report}", file=sys.stderr)
    if failed:
        fail(f"{', '.join(failed)}: a check failed, or a piece with an error (see the report)")


if __name__ == '__main__':
    main()
