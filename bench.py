"""
bench.py: time full training steps (forward, backward, AdamW) of the baseline and the LIMe routers
side by side, on random tokens, and print one table.

    python bench.py --shape=gpt2                    # on a GPU: torch.compile + bf16
    python bench.py --shape=paper_1b_gqa --steps=30
    python bench.py --shape=tiny --device=cpu       # anywhere, in seconds

Each router's number is the median of `steps` timed steps after `warmup` untimed ones (which also
absorb compilation). Ratios to 'none' come from the same run: compare those, not absolute numbers
across runs. The routing-floor column counts the bytes LIMe's mix must move (see routing_bytes)
and the time they take at `bandwidth` bytes/s: no implementation of the exact method can beat it.
"""
import statistics
import subprocess
import sys
import time
from datetime import date

import torch

from configurator import apply_overrides, fail, resolve_device
from lime import GPT, GPTConfig

SHAPES = {  # name: (GPTConfig fields, batch size)
    'gpt2': (dict(n_layer=12, n_head=12, n_embd=768, block_size=1024), 32),
    'paper_1b': (dict(n_layer=16, n_head=32, n_embd=2048, mlp_hidden=8192, block_size=2048), 4),
    'paper_1b_gqa': (dict(n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, mlp_hidden=8192,
                          block_size=2048), 4),
    'deep': (dict(n_layer=64, n_head=8, n_embd=256, mlp_hidden=1024, block_size=1024), 32),
    'tiny': (dict(n_layer=4, n_head=4, n_embd=64, block_size=64, vocab_size=512), 4),  # for CPUs, tests
}
# -----------------------------------------------------------------------------
shape = 'gpt2'  # one of SHAPES
routers = 'none,static,dynamic'
batch_size = 0  # 0 means the shape's own
steps = 20  # timed steps per router
warmup = 5  # untimed steps first (compilation happens in the first)
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16'  # on a CPU the default becomes float32
compile = True  # on a CPU the default becomes False
peak_flops = 989e12  # bf16 dense peak of one H100 SXM, for MFU
bandwidth = 3.0e12  # memory bandwidth for the routing floor, bytes/s (measured on an H100: ~3 TB/s)
# -----------------------------------------------------------------------------
config = {k: v for k, v in globals().items() if not k.startswith('_') and type(v) in (int, float, bool, str)}
given = apply_overrides(config, sys.argv[1:])
device_type, autocast = resolve_device(config, given)
globals().update(config)
if shape not in SHAPES:
    fail(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
router_list = sorted(routers.split(','), key=lambda r: r != 'none')  # the baseline first: ratios need it
model_args, default_batch = SHAPES[shape]
B, T = batch_size or default_batch, model_args['block_size']
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True


def routing_bytes(model, element_size):
    """Bytes LIMe's mix must move in one training step, at best. Layer l mixes S = l + 1 source
    tensors of N = B*T*2*G*hs elements (keys and values). Forward: read S, write 1. Backward, at
    best: read the output's gradient and the S sources (for the router's gradient), and write the
    sources' gradients once each if they are summed over all the layers reading them in one pass:
    about S + 2 more. So (2S + 3) N per layer; the dynamic probabilities are small beside it."""
    cfg = model.config
    N = B * T * 2 * cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    return sum((2 * (l + 1) + 3) * N * element_size for l in range(1, cfg.n_layer)) if model.routers() else 0


def measure(router):
    """Median step time (s) and peak memory (bytes, CUDA only) for one router."""
    torch.manual_seed(0)
    torch._dynamo.reset()  # each router compiles afresh, with nothing cached from the last
    try:
        model = GPT(GPTConfig(router=router, **model_args)).to(device)
    except ValueError as e:
        fail(str(e))
    optimizer = model.configure_optimizers(0.1, 1e-3, 1e-2, fused=device_type == 'cuda')
    step_model = torch.compile(model) if compile else model
    x = torch.randint(0, model.config.vocab_size, (B, T + 1), device=device)
    x, y = x[:, :-1], x[:, 1:]

    def step():
        with autocast:
            _, loss = step_model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    if device_type == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        if device_type == 'cuda':
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device_type == 'cuda' else 0
    return model, statistics.median(times), peak


def commit():
    try:
        return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'


device_name = torch.cuda.get_device_name() if device_type == 'cuda' else 'cpu'
print(f"bench.py --shape={shape}: B={B} T={T} {model_args} | {device_name} | torch {torch.__version__} | "
      f"{dtype}{' compiled' if compile else ''} | {date.today()} | commit {commit()}")
print(f"{'router':<8} {'params':>9} {'ms/step':>9} {'tok/s':>11} {'vs none':>8} {'MFU':>6} "
      f"{'peak GiB':>9} {'vs none':>8} {'routing ms':>11} {'floor ms':>9}")
results = {}


def cell(value, spec, width):
    return f"{'-' if value is None else format(value, spec):>{width}}"


for router in router_list:
    model, dt, peak = measure(router)
    results[router] = (dt, peak)
    base_dt, base_peak = results.get('none', (None, None))
    tok_s = B * T / dt
    floor_ms = routing_bytes(model, 2 if dtype == 'bfloat16' else 4) / bandwidth * 1000
    has_peak, has_base = device_type == 'cuda', base_dt is not None
    print(f"{router:<8} {model.num_params() / 1e6:>8.1f}M {dt * 1000:>9.1f} {tok_s:>11,.0f} "
          f"{cell(base_dt / dt if has_base else None, '.3f', 8)} "
          f"{model.estimate_mfu(tok_s, peak_flops):>6.1%} "
          f"{cell(peak / 2**30 if has_peak else None, '.2f', 9)} "
          f"{cell(peak / base_peak if has_peak and has_base else None, '.3f', 8)} "
          f"{cell((dt - base_dt) * 1000 if has_base else None, '.1f', 11)} {floor_ms:>9.1f}", flush=True)
    del model
    if device_type == 'cuda':
        torch.cuda.empty_cache()
