"""
bench.py: the training step (forward, backward, AdamW) of the baseline and of each LIMe mix, side
by side on random tokens; one markdown table.

    python -m lab.bench                                # on a GPU: gpt2's shape, 8 min; a CPU: tiny
    python -m lab.bench --shape=deep                   # the deep preset's shape, 64 layers
    python -m lab.bench --shape=all --minutes=30       # every GPU shape
    python -m lab.bench --routers=none,hc,static-hc    # and hyper-connections

A row is a router ('none', 'static', 'dynamic'); '-v1' after it routes hidden states
(memory='hidden', paper v1); 'hc' is the plain model with hyper-connections, '-hc' adds them to a
router. On a GPU the step is compiled and in bf16, as train.py runs it there.

Each row's time is the median of `steps` timed steps after `warmup` untimed ones; the first step's
time beyond it is the compile column. Ratios to 'none' come from the same run: compare those, not
absolute numbers across runs; no exact mix beats the routing floor (routing_floor_ms). A row
starts only while the minutes left are at least the longest row so far; the table names the rest.
"""
import statistics
import subprocess
import sys
import time
from datetime import date

import torch

from configurator import configure, fail, or_fail
from lime import GPT, ROUTERS, GPTConfig

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
routers = 'none,static,dynamic,static-v1,dynamic-v1'  # the rows
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


def parse_row(name):
    """(router, hyper_connections, memory) for a row name: a router, or 'hc' for the plain model
    with hyper-connections; then '-hc' to add them to a router, or '-v1' for the paper's v1
    routers (memory='hidden')."""
    with_hc = name == 'hc' or name.endswith('-hc')
    memory = 'hidden' if name.endswith('-v1') else 'kv'
    router = 'none' if name == 'hc' else name.removesuffix('-hc').removesuffix('-v1')
    return router, hyper_connections if with_hc else 0, memory


def routing_floor_ms(model, B, T):
    """The least time v2's mix can take in one training step: the bytes it must move at best,
    (2S + 3) N at layer l, which mixes S = l + 1 sources of N = B*T*2*G*hs elements
    (docs/performance.md counts them), at `bandwidth`. None for v1's mix of hidden states."""
    cfg = model.config
    if cfg.memory == 'hidden':
        return None
    N = B * T * 2 * cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    moved = sum((2 * (l + 1) + 3) * N for l in range(1, cfg.n_layer)) if model.routers() else 0
    return moved * (2 if dtype == 'bfloat16' else 4) / bandwidth * 1000


def cell(value, spec):
    return '-' if value is None else format(value, spec)


def measure(model_args, B, name):
    """A row's (model, median step seconds, first step's seconds beyond it, peak memory in bytes
    on CUDA)."""
    router, hc, memory = parse_row(name)
    cfg = or_fail(GPTConfig, router=router, memory=memory, hyper_connections=hc, **model_args)
    T = model_args['block_size']
    tokens = torch.Generator().manual_seed(0)  # the same tokens for every row
    x = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=tokens).to(device)
    torch._dynamo.reset()  # each row compiles afresh, with nothing cached from the last
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    optimizer = model.configure_optimizers(0.1, 1e-3, 1e-2, fused=device_type == 'cuda')
    step_model = torch.compile(model) if compile else model

    def step():
        t0 = time.perf_counter()
        with autocast:
            _, loss = step_model(x[:, :-1], x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device_type == 'cuda':
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    first = step()
    for _ in range(warmup - 1):
        step()
    if device_type == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    dt = statistics.median(step() for _ in range(steps))
    peak = torch.cuda.max_memory_allocated() if device_type == 'cuda' else None
    return model, dt, max(0.0, first - dt), peak


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
        if parse_row(name)[0] not in ROUTERS or name.startswith('none-'):
            fail(f"routers: {name!r} is not one of {', '.join(ROUTERS)}, hc (or static-v1, "
                 "dynamic-v1, static-hc, dynamic-hc, ...)")
    repeated = sorted({name for name in row_names if row_names.count(name) > 1})
    if repeated:  # a second row of the same router is a second timing of it, not a comparison
        fail(f"routers: {', '.join(map(repr, repeated))} named more than once")

    deadline = time.time() + 60 * minutes
    device_name = torch.cuda.get_device_name() if device_type == 'cuda' else 'cpu'
    print(f"bench.py --shape={shape} | {date.today()} | commit {commit()} | {device_name} | "
          f"torch {torch.__version__} | {dtype}{', compiled' if compile else ''} | "
          f"median of {steps} steps after {warmup}\n")
    print("| shape | router | params | ms/step | tok/s | vs none | MFU | peak GiB | vs none | "
          "compile s | routing ms | floor ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    longest, left_out = 0.0, []
    for shape_name in GPU_SHAPES if shape == 'all' else [shape]:
        model_args, default_batch = SHAPES[shape_name]
        B, T = batch_size or default_batch, model_args['block_size']
        base = None  # the baseline's (seconds, peak)
        for name in row_names:
            started = time.time()
            if longest and deadline - started < longest:
                left_out.append(f"{shape_name}/{name}")
                continue
            print(f"timing {shape_name} / {name} ...", file=sys.stderr, flush=True)
            model, dt, compile_s, peak = measure(model_args, B, name)
            if name == 'none':
                base = (dt, peak)
            tok_s = B * T / dt
            floor_ms = routing_floor_ms(model, B, T)
            routing_ms = (dt - base[0]) * 1000 if base else None
            speed = base[0] / dt if base else None
            memory_ratio = peak / base[1] if base and peak else None
            print(f"| {shape_name} | {name} | {model.num_params() / 1e6:.1f}M | {dt * 1000:.1f} | "
                  f"{tok_s:,.0f} | {cell(speed, '.3f')} | "
                  f"{model.estimate_mfu(tok_s, peak_flops):.1%} | "
                  f"{cell(peak and peak / 2**30, '.2f')} | "
                  f"{cell(memory_ratio, '.3f')} | "
                  f"{cell(compile_s if compile else None, '.1f')} | "
                  f"{cell(routing_ms, '.1f')} | {cell(floor_ms, '.1f')} |", flush=True)
            del model
            if device_type == 'cuda':
                torch.cuda.empty_cache()
            longest = max(longest, time.time() - started)
    if left_out:
        print(f"\nLeft out, the {minutes:g} minutes spent: {', '.join(left_out)}.")


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
