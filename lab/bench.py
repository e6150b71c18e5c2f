"""
bench.py: the training step (forward, backward, AdamW) of the baseline and of each LIMe mix, side
by side on random tokens, each row's first-step gradients checked against lime.py's eager float32
definition; one markdown table.

    python -m lab.bench                                # on a GPU: gpt2's shape, every row, 8 min
    python -m lab.bench --shape=deep                   # the deep preset's shape, 64 layers
    python -m lab.bench --shape=all --minutes=30       # every GPU shape
    python -m lab.bench --routers=none,static,static-fused --check=False   # speed alone
    python -m lab.bench --routers=none,hc,static-hc    # and hyper-connections
    python -m lab.bench                                # on a CPU: the tiny shape, in seconds

A row is a router ('none', 'static', 'dynamic'); '-v1' after it routes hidden states
(memory='hidden', paper v1); '-fused' runs kernels/memory.py's mix, as train.py's --fused=True
does (its self-check included, on a GPU); 'hc' is the plain model with hyper-connections, '-hc'
adds them to a router. On a GPU the step is compiled and in bf16, as train.py runs it there.

Each row's time is the median of `steps` timed steps after `warmup` untimed ones; the first step's
time beyond it is the compile column. Ratios to 'none' come from the same run: compare those, not
absolute numbers across runs. The routing floor counts the bytes v2's mix must move
(routing_bytes) and their time at `bandwidth` bytes/s: no exact implementation beats it.

Gradients (check=True): the first step's, before AdamW moves anything, against the same model's in
the eager float32 definition on the same tokens; a parameter passes within TOLERANCE (bf16: 5e-2,
float32: 1e-3) of its largest entry, plus twice the error that bf16 autocast alone gives the
definition. A row starts only while the minutes left are at least the
longest row so far; the table names the rows left out.
"""
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from datetime import date

import torch
import torch.nn as nn

from configurator import configure, fail, or_fail
import kernels
from lime import GPT, ROUTERS, DynamicRouter, GPTConfig

SHAPES = {  # name: (GPTConfig fields, batch size)
    'gpt2': (dict(n_layer=12, n_head=12, n_embd=768, block_size=1024), 32),
    'paper_1b': (dict(n_layer=16, n_head=32, n_embd=2048, mlp_hidden=8192, block_size=2048), 4),
    'paper_1b_gqa': (dict(n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, mlp_hidden=8192,
                          block_size=2048), 4),
    # config/deep.py's model at 64 layers, a 1,024-token block
    'deep': (dict(n_layer=64, n_head=8, n_embd=256, mlp_hidden=1024, block_size=1024), 32),
    # for CPUs, and the tests
    'tiny': (dict(n_layer=4, n_head=4, n_embd=64, block_size=64, vocab_size=512), 4),
}
GPU_SHAPES = ['gpt2', 'paper_1b', 'paper_1b_gqa', 'deep']  # what --shape=all runs
# -----------------------------------------------------------------------------
shape = 'gpt2'  # one of SHAPES, or 'all' for every GPU shape; on a CPU the default becomes 'tiny'
routers = 'none,static,dynamic,static-fused,dynamic-fused,static-v1,dynamic-v1'  # the rows
check = True  # judge each row's first-step gradients against the eager float32 definition
minutes = 8.0  # the whole command's time: a row that would not fit in what is left is left out
hyper_connections = 4  # streams of the HC rows (the paper's rate)
batch_size = 0  # 0 means the shape's own
steps = 10  # timed steps per row
warmup = 3  # untimed steps first (compilation happens in the first; at least 1)
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16'  # on a CPU the default becomes float32
compile = True  # on a CPU the default becomes False
peak_flops = 989e12  # bf16 dense peak of one H100 SXM, for MFU
bandwidth = 3.0e12  # memory bandwidth for the routing floor, bytes/s (measured on an H100: ~3 TB/s)
# -----------------------------------------------------------------------------
# A gradient's error allowed, relative to its largest entry, beyond twice what the dtype alone
# gives the definition. bfloat16 keeps 8 significant bits: through a few layers of bf16 products
# a gradient is off by about 1e-2 (tests/test_kernels.py's compiled test allows 5e-2). In float32
# another order of the same sums (a compiled graph, memory.py's mix) is off by far less than 1e-3.
TOLERANCE = {'bfloat16': 5e-2, 'float32': 1e-3}
# The float32 reference runs this many sequences at a time: gpt2's 32 at once, eager, would take
# about 70 GB of an 80 GB GPU (their logits, and the layer memory's copies)
REFERENCE_CHUNK = 2


def parse_row(name):
    """(router, hyper_connections, memory.py's mix?, memory) for a row name: a router, or 'hc'
    for the plain model with hyper-connections; then '-hc' to add them to a router, or '-v1' for
    the paper's v1 routers (memory='hidden'); then '-fused' (v2's LIMe routers only)."""
    base = name.removesuffix('-fused')
    with_hc = base == 'hc' or base.endswith('-hc')
    memory = 'hidden' if base.endswith('-v1') else 'kv'
    router = 'none' if base == 'hc' else base.removesuffix('-hc').removesuffix('-v1')
    return router, hyper_connections if with_hc else 0, base != name, memory


def routing_bytes(model, B, T, element_size):
    """Bytes v2's mix must move in one training step, at best. Layer l mixes S = l + 1 source
    tensors of N = B*T*2*G*hs elements (keys and values). Forward: read S, write 1. Backward, at
    best: read the output's gradient and the S sources (for the router's gradient), and write the
    sources' gradients once each if they are summed over all the layers reading them in one pass:
    about S + 2 more. So (2S + 3) N per layer; the dynamic probabilities are small beside it."""
    cfg = model.config
    N = B * T * 2 * cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    if not model.routers():
        return 0
    return sum((2 * (l + 1) + 3) * N * element_size for l in range(1, cfg.n_layer))


def cell(value, spec):
    return '-' if value is None else format(value, spec)


def ratio(value, base):
    return None if value is None or not base else value / base


def sync():
    if device_type == 'cuda':
        torch.cuda.synchronize()


def seeded_model(cfg):
    """The same weights for a row and its reference."""
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
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
    """({parameter: its first-step gradient in the eager definition, float32, on the CPU},
    {parameter: that gradient's error under `dtype`'s autocast}: what the dtype alone does)."""
    model = seeded_model(cfg)
    grads = []
    for precision in (nullcontext(), autocast):
        for chunk in x.split(REFERENCE_CHUNK):  # each chunk's loss weighted by its share
            with precision:
                _, loss = model(chunk[:, :-1], chunk[:, 1:])
            (loss * len(chunk) / len(x)).backward()
        grads.append(gradients(model))
        model.zero_grad(set_to_none=True)  # the tensors live on in grads
    reference, alone = grads
    alone = {name: relative_error(alone[name], want) for name, want in reference.items()}
    return {name: want.cpu() for name, want in reference.items()}, alone


def judge(reference, alone, fast):
    """(passed, failed, the worst parameter's line): a parameter passes within TOLERANCE[dtype]
    plus twice its dtype-alone error, relative to its largest entry; one without a gradient is
    all wrong."""
    errors = []
    for name, want in reference.items():
        got = fast.get(name)
        error = 1.0 if got is None else relative_error(got, want.to(got.device))
        errors.append((name, error, TOLERANCE[dtype] + 2 * alone[name]))
    failed = [name for name, error, allowed in errors if not error <= allowed]
    name, error, allowed = max(errors, key=lambda e: e[1] / e[2])
    return len(errors) - len(failed), failed, f"{name} {error:.1e} (allowed {allowed:.1e})"


def measure(model_args, B, name, references):
    """A row's (model, median step seconds, first step's seconds beyond it, peak memory in bytes
    on CUDA, the gradients' cell)."""
    router, hc, fused, memory = parse_row(name)
    cfg = or_fail(GPTConfig, router=router, memory=memory, hyper_connections=hc, **model_args)
    T = model_args['block_size']
    tokens = torch.Generator().manual_seed(0)  # the same tokens for every row and its reference
    x = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=tokens).to(device)
    if check and (router, hc, memory) not in references:  # a fused row shares its reference
        references[router, hc, memory] = reference_gradients(cfg, x)
    torch._dynamo.reset()  # each row compiles afresh, with nothing cached from the last
    model = seeded_model(cfg)
    if fused:  # with its self-check on a GPU, as train.py's --fused=True
        or_fail(kernels.install, model, device, torch.bfloat16 if dtype == 'bfloat16' else None)
    optimizer = model.configure_optimizers(0.1, 1e-3, 1e-2, fused=device_type == 'cuda')
    step_model = torch.compile(model) if compile else model
    judged = []

    def step():
        """The step's seconds; the first one's gradients judged, outside its time."""
        t0 = time.perf_counter()
        with autocast:
            _, loss = step_model(x[:, :-1], x[:, 1:])
        loss.backward()
        sync()
        seconds = time.perf_counter() - t0
        if check and not judged:
            judged.append(judge(*references[router, hc, memory], gradients(model)))
        t0 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return seconds + time.perf_counter() - t0

    first = step()
    for _ in range(warmup - 1):
        step()
    if device_type == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    dt = statistics.median(step() for _ in range(steps))
    peak = torch.cuda.max_memory_allocated() if device_type == 'cuda' else None
    verdict = '-'
    if judged:
        passed, failed, worst = judged[0]
        verdict = (f"FAILED {', '.join(failed[:3])}" if failed else
                   f"{passed} passed, nearest: {worst}")
    return model, dt, max(0.0, first - dt), peak, verdict


def main():
    global device_type, autocast
    config, given, autocast = configure(globals(), {
        'text': ['shape', 'routers'],  # checked against SHAPES and ROUTERS below
        'positive': ['steps', 'warmup', 'hyper_connections', 'peak_flops', 'bandwidth',
                     'minutes'],
        'non-negative': ['batch_size'],
        'device': ['device'], ('bfloat16', 'float32'): ['dtype'],
    })
    device_type = 'cuda' if config['device'].startswith('cuda') else 'cpu'
    if device_type == 'cpu' and 'shape' not in given:
        config['shape'] = 'tiny'  # the GPU shapes take many GB and minutes per step on a CPU
    globals().update(config)
    if shape not in SHAPES and shape != 'all':
        fail(f"shape must be one of {', '.join(SHAPES)} or all, got {shape!r}")
    if shape == 'all' and device_type == 'cpu':
        fail("--shape=all runs the GPU shapes (GBs of memory, minutes per step on a CPU): use a "
             "GPU, or one shape, e.g. --shape=tiny")
    row_names = sorted(routers.split(','), key=lambda r: r != 'none')  # the ratios need it first
    for name in row_names:
        router, _, fused, memory = parse_row(name)
        if (router not in ROUTERS or (fused and (router == 'none' or memory != 'kv'))
                or name.startswith('none-')):
            fail(f"routers: {name!r} is not one of {', '.join(ROUTERS)}, hc (or static-fused, "
                 "dynamic-fused, static-v1, dynamic-v1, static-hc, dynamic-hc, ...)")
    repeated = sorted({name for name in row_names if row_names.count(name) > 1})
    if repeated:  # a second row of the same router is a second timing of it, not a comparison
        fail(f"routers: {', '.join(map(repr, repeated))} named more than once")

    deadline = time.time() + 60 * minutes
    device_name = torch.cuda.get_device_name() if device_type == 'cuda' else 'cpu'
    print(f"bench.py --shape={shape} | {date.today()} | commit {commit()} | {device_name} | "
          f"torch {torch.__version__} | {dtype}{', compiled' if compile else ''} | "
          f"median of {steps} steps after {warmup}\n")
    print("| shape | router | params | ms/step | tok/s | vs none | MFU | peak GiB | vs none | "
          "compile s | routing ms | floor ms | gradients |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    longest, left_out, failed_rows = 0.0, [], []
    for shape_name in GPU_SHAPES if shape == 'all' else [shape]:
        model_args, default_batch = SHAPES[shape_name]
        B, T = batch_size or default_batch, model_args['block_size']
        base, references = None, {}  # the baseline's (seconds, peak); each router's reference
        for name in row_names:
            started = time.time()
            if longest and deadline - started < longest:
                left_out.append(f"{shape_name}/{name}")
                continue
            print(f"timing {shape_name} / {name} ...", file=sys.stderr, flush=True)
            model, dt, compile_s, peak, verdict = measure(model_args, B, name, references)
            if name == 'none':
                base = (dt, peak)
            if verdict.startswith('FAILED'):
                failed_rows.append(f"{shape_name}/{name}")
            tok_s = B * T / dt
            size = 2 if dtype == 'bfloat16' else 4
            floor_ms = routing_bytes(model, B, T, size) / bandwidth * 1000
            if model.config.memory == 'hidden':
                floor_ms = None  # routing_bytes counts v2's traffic of keys and values, not v1's
            routing_ms = (dt - base[0]) * 1000 if base else None
            print(f"| {shape_name} | {name} | {model.num_params() / 1e6:.1f}M | {dt * 1000:.1f} | "
                  f"{tok_s:,.0f} | {cell(ratio(base and base[0], dt), '.3f')} | "
                  f"{model.estimate_mfu(tok_s, peak_flops):.1%} | "
                  f"{cell(peak and peak / 2**30, '.2f')} | "
                  f"{cell(ratio(peak, base and base[1]), '.3f')} | "
                  f"{cell(compile_s if compile else None, '.1f')} | "
                  f"{cell(routing_ms, '.1f')} | {cell(floor_ms, '.1f')} | {verdict} |", flush=True)
            del model
            if device_type == 'cuda':
                torch.cuda.empty_cache()
            longest = max(longest, time.time() - started)
    if left_out:
        print(f"\nLeft out, the {minutes:g} minutes spent: {', '.join(left_out)}.")
    if failed_rows:  # the table stands; the exit status says a gradient was wrong
        fail(f"gradients wrong in {', '.join(failed_rows)}: see the table's last column")


def commit():
    """This checkout's commit, and whether its tracked files differ from it."""
    def git(*args):
        try:
            return subprocess.run(['git', *args], capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None
    changed = git('status', '--porcelain', '--untracked-files=no')
    return (git('rev-parse', '--short', 'HEAD') or 'unknown') + (' with changes' if changed else '')


if __name__ == '__main__':
    main()
