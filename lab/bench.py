"""
bench.py: time full training steps (forward, backward, AdamW) of the baseline and the LIMe routers
side by side, on random tokens, and print one markdown table.

    python -m lab.bench --shape=all                     # on a GPU: every GPU shape, one table
    python -m lab.bench --shape=gpt2 --routers=none,static,static-fused
    python -m lab.bench --shape=gpt2 --routers=none,hc,dynamic,dynamic-hc   # and hyper-connections
    python -m lab.bench                                 # on a CPU: the tiny shape, in seconds

Each router's number is the median of `steps` timed steps after `warmup` untimed ones. The first
step compiles: its time beyond a normal step is the compile column. Ratios to 'none' come from the
same run: compare those, not absolute numbers across runs. A LIMe router runs lime.py's mix, as
every script does; named with '-fused' (static-fused) it runs kernels/memory.py's, as train.py's
--fused=True does, to compare the two. 'hc' is the paper's other baseline,
hyper-connections (dynamic, with `hyper_connections` streams) on the plain model, and '-hc' after
a router adds them to it (static-hc). The routing-floor column counts the bytes LIMe's mix must
move (see routing_bytes) and the time they take at `bandwidth` bytes/s: no exact implementation
beats it.
"""
import statistics
import sys
import time
from datetime import date

import torch

from configurator import configure, fail, or_fail
from lab.gpu_check import cell, commit, ratio  # as in its report
import kernels
from lime import GPT, ROUTERS, GPTConfig

SHAPES = {  # name: (GPTConfig fields, batch size)
    'gpt2': (dict(n_layer=12, n_head=12, n_embd=768, block_size=1024), 32),
    'paper_1b': (dict(n_layer=16, n_head=32, n_embd=2048, mlp_hidden=8192, block_size=2048), 4),
    'paper_1b_gqa': (dict(n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, mlp_hidden=8192,
                          block_size=2048), 4),
    'deep': (dict(n_layer=64, n_head=8, n_embd=256, mlp_hidden=1024, block_size=1024), 32),
    # for CPUs, and the tests
    'tiny': (dict(n_layer=4, n_head=4, n_embd=64, block_size=64, vocab_size=512), 4),
}
GPU_SHAPES = ['gpt2', 'paper_1b', 'paper_1b_gqa', 'deep']  # what --shape=all runs
# -----------------------------------------------------------------------------
shape = 'gpt2'  # one of SHAPES, or 'all' for every GPU shape; on a CPU the default becomes 'tiny'
routers = 'none,static,dynamic'  # '-v1': memory='hidden'; '-fused': memory.py's mix; '-hc': HC
hyper_connections = 4  # streams of the HC rows (the paper's rate)
batch_size = 0  # 0 means the shape's own
steps = 20  # timed steps per router
warmup = 5  # untimed steps first (compilation happens in the first; at least 1)
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16'  # on a CPU the default becomes float32
compile = True  # on a CPU the default becomes False
peak_flops = 989e12  # bf16 dense peak of one H100 SXM, for MFU
bandwidth = 3.0e12  # memory bandwidth for the routing floor, bytes/s (measured on an H100: ~3 TB/s)
# -----------------------------------------------------------------------------
config, given, autocast = configure(globals(), {
    'text': ['shape', 'routers'],  # checked against SHAPES and ROUTERS below
    'positive': ['steps', 'warmup', 'hyper_connections', 'peak_flops', 'bandwidth'],
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
    fail("--shape=all runs the GPU shapes (GBs of memory, minutes per step on a CPU): use a GPU, "
         "or one shape, e.g. --shape=tiny")


def parse_row(name):
    """(router, hyper_connections, memory.py's mix?, memory) for a row name: a router, or 'hc'
    for the plain model with hyper-connections; then '-hc' to add them to a router, or '-v1' for
    the paper's v1 routers (memory='hidden'); then '-fused' (v2's LIMe routers only)."""
    base = name.removesuffix('-fused')
    with_hc = base == 'hc' or base.endswith('-hc')
    memory = 'hidden' if base.endswith('-v1') else 'kv'
    router = 'none' if base == 'hc' else base.removesuffix('-hc').removesuffix('-v1')
    return router, hyper_connections if with_hc else 0, base != name, memory


# the baseline first: the ratios need it
router_list = sorted(routers.split(','), key=lambda r: r != 'none')
for name in router_list:
    router, _, fused, memory = parse_row(name)
    if (router not in ROUTERS or (fused and (router == 'none' or memory != 'kv'))
            or name.startswith('none-')):
        fail(f"routers: {name!r} is not one of {', '.join(ROUTERS)}, hc (or static-fused, "
             "dynamic-fused, static-v1, dynamic-v1, static-hc, dynamic-hc, static-hc-fused, ...)")
repeated = sorted({name for name in router_list if router_list.count(name) > 1})
if repeated:  # a second row of the same router is a second timing of it, not a comparison
    fail(f"routers: {', '.join(map(repr, repeated))} named more than once")


def routing_bytes(model, B, T, element_size):
    """Bytes LIMe's mix must move in one training step, at best. Layer l mixes S = l + 1 source
    tensors of N = B*T*2*G*hs elements (keys and values). Forward: read S, write 1. Backward, at
    best: read the output's gradient and the S sources (for the router's gradient), and write the
    sources' gradients once each if they are summed over all the layers reading them in one pass:
    about S + 2 more. So (2S + 3) N per layer; the dynamic probabilities are small beside it."""
    cfg = model.config
    N = B * T * 2 * cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    if not model.routers():
        return 0
    return sum((2 * (l + 1) + 3) * N * element_size for l in range(1, cfg.n_layer))


def sync():
    if device_type == 'cuda':
        torch.cuda.synchronize()


def measure(model_args, B, name):
    """Median step time (s), first-step time beyond it (s, compilation) and peak memory (bytes,
    CUDA only) for one router."""
    torch.manual_seed(0)
    router, hc, fused, memory = parse_row(name)
    torch._dynamo.reset()  # each router compiles afresh, with nothing cached from the last
    model_config = or_fail(GPTConfig, router=router, memory=memory, hyper_connections=hc,
                           **model_args)
    T = model_args['block_size']  # the step's float32 logits, at the least: B * T * vocabulary
    model = GPT(model_config).to(device)
    if fused:  # no self-check: lab.gpu_check's
        kernels.install(model, device)
    optimizer = model.configure_optimizers(0.1, 1e-3, 1e-2, fused=device_type == 'cuda')
    step_model = torch.compile(model) if compile else model
    x = torch.randint(0, model.config.vocab_size, (B, T + 1), device=device)
    x, y = x[:, :-1], x[:, 1:]

    def step():
        t0 = time.perf_counter()
        with autocast:
            _, loss = step_model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0

    first = step()
    for _ in range(warmup - 1):
        step()
    if device_type == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    dt = statistics.median(step() for _ in range(steps))
    peak = torch.cuda.max_memory_allocated() if device_type == 'cuda' else None
    return model, dt, max(0.0, first - dt), peak


device_name = torch.cuda.get_device_name() if device_type == 'cuda' else 'cpu'
shapes = GPU_SHAPES if shape == 'all' else [shape]
print(f"bench.py --shape={shape} | {date.today()} | commit {commit()} | {device_name} | "
      f"torch {torch.__version__} | {dtype}{', compiled' if compile else ''} | "
      f"median of {steps} steps after {warmup}\n")
print("| shape | router | params | ms/step | tok/s | vs none | MFU | peak GiB | vs none | "
      "compile s | vs none | routing ms | floor ms |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for shape_name in shapes:
    model_args, default_batch = SHAPES[shape_name]
    B, T = batch_size or default_batch, model_args['block_size']
    base = None  # the baseline's (ms, compile s, peak) in this shape
    for name in router_list:
        print(f"timing {shape_name} / {name} ...", file=sys.stderr, flush=True)
        model, dt, compile_s, peak = measure(model_args, B, name)
        compile_s = compile_s if compile else None
        if name == 'none':
            base = (dt, compile_s, peak)
        tok_s = B * T / dt
        floor_ms = routing_bytes(model, B, T, 2 if dtype == 'bfloat16' else 4) / bandwidth * 1000
        if model.config.memory == 'hidden':
            floor_ms = None  # routing_bytes counts v2's traffic of keys and values, not v1's
        routing_ms = (dt - base[0]) * 1000 if base else None
        print(f"| {shape_name} | {name} | {model.num_params() / 1e6:.1f}M | {dt * 1000:.1f} | "
              f"{tok_s:,.0f} | {cell(ratio(base and base[0], dt), '.3f')} | "
              f"{model.estimate_mfu(tok_s, peak_flops):.1%} | "
              f"{cell(peak and peak / 2**30, '.2f')} | "
              f"{cell(ratio(peak, base and base[2]), '.3f')} | "
              f"{cell(compile_s, '.1f')} | {cell(ratio(compile_s, base and base[1]), '.2f')} | "
              f"{cell(routing_ms, '.1f')} | {cell(floor_ms, '.1f')} |", flush=True)
        del model
        if device_type == 'cuda':
            torch.cuda.empty_cache()
