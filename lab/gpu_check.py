"""
gpu_check.py: the one command that tells whether kernels/fused.py's Triton kernels can be trusted
on this GPU, with this torch and triton; its report is what docs/performance.md asks to record
before the kernels become the default (kernels/__init__.py: FUSED_BY_DEFAULT_ON_CUDA).

    python -m lab.gpu_check                     # ~10 minutes on one H100
    python -m lab.gpu_check --steps=50          # shorter

In order, each part skipped with its reason where it cannot run (on a CPU the self-checks run under Triton's interpreter, the rest is skipped):
1. the kernel tests (tests/test_fused.py, tests/test_fused_checks.py), with the real kernels;
2. the startup self-check (kernels/fused.py's self_check) at every shipped preset's shape;
3. `steps` bf16 training steps of `preset` with the plain mix and with the kernels, on the same
   batches from the same weights: the two loss curves (they must agree within bf16 noise),
   tokens/s and peak memory side by side;
4. compute-sanitizer's memcheck and racecheck on one fused step of a small model, when it is on
   PATH.
The report (markdown, to paste) is printed and written to `report`.
"""
import ast
import glob
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import date

import torch

import lime
from configurator import configure, fail, read_text
from lime import GPT, GPTConfig

# -----------------------------------------------------------------------------
preset = 'config/gpt2.py'  # the model trained in part 3
steps = 200  # training steps of each mix in part 3
batch_size = 8  # sequences per step in part 3
report = 'gpu_check.md'  # where the report goes
sanitize_step = False  # (internal: one fused step of a small model, for compute-sanitizer)
# -----------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def preset_values(path):
    """A config file's `key = literal` lines, over train.py's defaults for the model's keys."""
    values = {'n_layer': 12, 'n_head': 12, 'n_kv_head': 0, 'n_embd': 768, 'block_size': 1024,
              'router': 'static', 'mlp_hidden': 0, 'vocab_size': 50257}
    try:
        body = ast.parse(read_text(path, 'preset'), filename=path).body
    except (SyntaxError, ValueError) as e:  # ValueError: NUL bytes
        fail(f"{path}:{getattr(e, 'lineno', '')}: not a config file of `key = value` lines")
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, AttributeError, SyntaxError):  # as train.py would refuse it
                fail(f"{path}:{node.lineno}: config files hold `key = value` lines of plain literals")
    return values


def model_config(values, **changes):
    keys = {f: values[f] for f in GPTConfig.__dataclass_fields__ if f in values}
    return GPTConfig(**{**keys, **changes})


def run_tests():
    if not torch.cuda.is_available():
        return 'skipped: no CUDA GPU (on a CPU the tests run under the interpreter: pytest)'
    files = ['tests/test_fused.py', 'tests/test_fused_checks.py']
    started = time.time()
    result = subprocess.run([sys.executable, '-m', 'pytest', '-q', *files], cwd=ROOT,
                            capture_output=True, text=True)
    lines = (result.stdout + result.stderr).strip().splitlines()
    failures = [line for line in lines if line.startswith('FAILED')]
    summary = lines[-1] if lines else 'no output'
    return '\n'.join([f"{'passed' if result.returncode == 0 else 'FAILED'}: {summary} "
                      f"({time.time() - started:.0f} s)", *failures])


def self_checks():
    """On a CPU, under Triton's interpreter: the kernels' logic, not a GPU's arithmetic."""
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    import kernels
    why = kernels.why_not_fused(device, None)
    if why is not None:
        return f"skipped: {why}"
    from kernels import fused
    lines = [] if fused.INTERPRET is False else ["(no CUDA GPU: under Triton's interpreter)"]
    for path in sorted(glob.glob(os.path.join(ROOT, 'config', '*.py'))):
        cfg = model_config(preset_values(path))
        G, hs = cfg.n_kv_head, cfg.n_embd // cfg.n_head
        for dtype in (torch.bfloat16, torch.float32):
            started = time.time()
            why = fused.self_check(G, hs, dtype, device)
            lines.append(f"{os.path.relpath(path, ROOT)} G={G} hs={hs} {str(dtype)[6:]}: "
                         f"{why or 'passed'} ({time.time() - started:.1f} s)")
    return '\n'.join(lines)


def train_side_by_side():
    """Part 3: the same weights and batches, trained with the plain mix and with the kernels."""
    if not torch.cuda.is_available():
        return 'skipped: no CUDA GPU', None
    import kernels
    why = kernels.why_not_fused('cuda', None)
    if why is not None:
        return f"skipped: {why}", None
    values = preset_values(os.path.join(ROOT, preset))
    cfg = model_config(values)
    B, T = batch_size, cfg.block_size
    batches, data = training_batches(values.get('data_dir', 'data/fineweb_edu'), cfg, B, T)
    torch.manual_seed(0)
    initial = {k: v.clone() for k, v in GPT(cfg).state_dict().items()}
    results = {}
    for name in ('plain', 'fused'):
        torch._dynamo.reset()
        mix = lime.use_fused_kernels(name == 'fused', 'cuda')
        model = GPT(cfg)
        model.load_state_dict(initial)
        model.to('cuda').train()
        optimizer = model.configure_optimizers(0.1, 3e-4, 3e-3, fused=True)
        compiled = torch.compile(model, fullgraph=getattr(mix, 'NEEDS_ONE_GRAPH', False))
        torch.cuda.reset_peak_memory_stats()
        losses, times = [], []
        for step in range(steps):
            batch = batches[step % len(batches)].to('cuda')
            torch.cuda.synchronize()
            started = time.time()
            with torch.autocast('cuda', torch.bfloat16):
                _, loss = compiled(batch[:, :-1], batch[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())  # waits for the GPU
            times.append(time.time() - started)
        steady = sorted(times[len(times) // 2:])[len(times) // 4] if len(times) > 3 else times[-1]
        results[name] = dict(losses=losses, tokens_per_sec=B * T / steady,
                             peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    lime.use_fused_kernels(False, 'cuda')
    plain, fused = results['plain'], results['fused']
    # bf16 noise: the curves' 10-step means, compared
    means = [sum(x[i:i + 10]) / len(x[i:i + 10]) for x in (plain['losses'], fused['losses'])
             for i in range(0, steps, 10)]
    half = len(means) // 2
    gap = max(abs(a - b) for a, b in zip(means[:half], means[half:]))
    lines = [f"{preset} ({cfg.n_layer} layers, router={cfg.router}), {steps} steps of {B} x {T} "
             f"tokens ({data}), bf16, compiled",
             "| mix | first loss | last loss | tokens/s | peak GiB |", "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['losses'][0]:.4f} | {r['losses'][-1]:.4f} | "
                     f"{r['tokens_per_sec']:,.0f} | {r['peak_gib']:.2f} |")
    lines.append(f"largest gap between the curves' 10-step means: {gap:.4f} "
                 f"({'within' if gap < 0.05 else 'NOT within'} bf16 noise, 0.05); "
                 f"fused / plain speed {fused['tokens_per_sec'] / plain['tokens_per_sec']:.3f}, "
                 f"memory {fused['peak_gib'] / plain['peak_gib']:.3f}")
    return '\n'.join(lines), results


def training_batches(data_dir, cfg, B, T):
    """Up to `steps` batches (B, T + 1) from the preset's data, or random tokens without it."""
    from prepare import Batches
    path = os.path.join(ROOT, data_dir)
    try:
        source = Batches(path, B, T, vocab_size=cfg.vocab_size, log=lambda message: None)
        batches = []
        for _ in range(steps):
            x, y = source.next()
            batches.append(torch.cat((torch.from_numpy(x), torch.from_numpy(y[:, -1:])), dim=1))
        return batches, f"{data_dir}'s first {steps} batches"
    except (ValueError, OSError):
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen) for _ in range(8)]
        return batches, f"random tokens, 8 batches round and round: no shards in {data_dir}"


def sanitize():
    tool = shutil.which('compute-sanitizer')
    if not torch.cuda.is_available():
        return 'skipped: no CUDA GPU'
    if tool is None:
        return 'skipped: compute-sanitizer is not on PATH (it comes with the CUDA toolkit)'
    lines = []
    for check in ('memcheck', 'racecheck'):
        result = subprocess.run([tool, '--tool', check, sys.executable, '-m', 'lab.gpu_check',
                                 '--sanitize_step=True'], cwd=ROOT, capture_output=True, text=True)
        summary = [line for line in (result.stdout + result.stderr).splitlines()
                   if 'ERROR SUMMARY' in line or 'RACECHECK SUMMARY' in line]
        lines.append(f"{check}: exit {result.returncode}; {' '.join(summary) or 'no summary'}")
    return '\n'.join(lines)


def one_fused_step():
    """A small static model's forward and backward with the kernels: what the sanitizer watches."""
    lime.use_fused_kernels(True, 'cuda')
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, block_size=64,
                          vocab_size=512, router='static')).cuda()
    x = torch.randint(0, 512, (2, 65), device='cuda')
    with torch.autocast('cuda', torch.bfloat16):
        _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    torch.cuda.synchronize()


def environment():
    commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip() or 'unknown'
    try:  # not `import triton`: on a CPU, kernels/fused.py must come first (its interpreter)
        triton_version = importlib.metadata.version('triton')
    except importlib.metadata.PackageNotFoundError:
        triton_version = 'not installed'
    gpu = 'no CUDA GPU'
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        gpu = f"{torch.cuda.get_device_name()} (compute capability {major}.{minor})"
    return (f"{date.today()}, commit {commit}, {gpu}, torch {torch.__version__}, triton "
            f"{triton_version}, Python {platform.python_version()}")


def main():
    config, _, _ = configure(globals(), {'path': ['preset', 'report'],
                                         'positive': ['steps', 'batch_size']})
    globals().update(config)
    if sanitize_step:
        one_fused_step()
        return
    if not os.path.isfile(os.path.join(ROOT, preset)):
        fail(f"preset not found: {preset}")
    try:  # its model, checked now: part 3, which trains it, comes after minutes of the others
        model_config(preset_values(os.path.join(ROOT, preset)))
    except (TypeError, ValueError) as e:  # a value of another type, or out of its range
        fail(f"preset {preset}: {e}")
    parts = [('Environment', environment)]
    parts += [('1. Kernel tests, real kernels', run_tests),
              ('2. Self-check at every preset', self_checks),
              ('3. Training, plain mix vs kernels', lambda: train_side_by_side()[0]),
              ('4. compute-sanitizer', sanitize)]
    text = ['# lab/gpu_check.py report']
    for title, part in parts:
        print(f"{title}...", file=sys.stderr, flush=True)
        text += ['', f"## {title}", part()]
    text = '\n'.join(text) + '\n'
    print(text)
    with open(report, 'w', encoding='utf-8') as f:
        f.write(text)
    print(f"written to {report}", file=sys.stderr)


if __name__ == '__main__':
    main()
