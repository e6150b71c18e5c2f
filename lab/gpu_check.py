"""
gpu_check.py: the one command that checks LIMe's fast mix (kernels/memory.py) against lime.py's
definition on this GPU, with this torch, and measures both; its report is what docs/performance.md
records. Until one is recorded, every GPU speed there is a prediction.

    python -m lab.gpu_check                                 # every part
    python -m lab.gpu_check --parts=training --steps=50     # one part, shorter

The parts (`parts` names some), each with its wall time in the report:
1. tests: tests/test_kernels.py, run here: pytest's summary line and its failures;
2. self_check: the startup self-check (memory.self_check, which train.py runs before step 0 on a
   GPU) at every preset's kv heads and head size, in bfloat16 and float32;
3. training: `steps` bf16 compiled training steps of `preset`'s model with the baseline
   router='none', then with the static and the dynamic router, each run with the definition and
   with memory.py from the same weights on the same batches: a router's two loss curves must
   agree within bf16 noise; tokens/s, peak memory and compile time side by side;
4. deep: compile time and peak memory at 64 layers (config/deep.py's model), `deep_steps` steps
   of each router with memory.py (the definition keeps, at each layer, a copy of every earlier
   layer's keys and values: memory that grows with the square of the depth).
Each part is meant to take under 10 minutes on one H100 (not timed on one yet): where one takes
longer, lower `steps`, `deep_steps` or `batch_size`. On a CPU the same parts run small: parts 1
and 2 as on a GPU (the self-check on the CPU), parts 3 and 4 in float32, eager, with a tiny model
(ON_A_CPU) and 20 steps in part 3: the code paths, not speed. The report (markdown, to paste) is
printed and written to `report`.
"""
import ast
import gc
import glob
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from datetime import date

import torch

import lime
from configurator import configure, fail, read_text
from kernels import memory
from lime import GPT, GPTConfig, last_line

# -----------------------------------------------------------------------------
preset = 'config/gpt2.py'  # the model trained in part 3
parts = 'tests,self_check,training,deep'  # which of the parts (see above) to run, in this order
steps = 200  # training steps of each run in part 3; on a CPU the default becomes 20
deep_steps = 3  # training steps of each router in part 4 (the first compiles)
batch_size = 8  # sequences per step in parts 3 and 4
report = 'gpu_check.md'  # where the report goes
# -----------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ON_A_GPU = torch.cuda.is_available()
DEVICE = 'cuda' if ON_A_GPU else 'cpu'
# Parts 3 and 4 on a CPU: these model keys instead of the presets' (64 layers would take minutes)
ON_A_CPU = dict(n_layer=4, n_embd=32, n_head=2, n_kv_head=0, mlp_hidden=0, block_size=32,
                vocab_size=256)
BF16_NOISE = 0.05  # the largest gap between two 10-step loss means that bf16 rounding explains


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
                fail(f"{path}:{node.lineno}: config files hold `key = value` lines of plain "
                     "literals")
    return values


def model_config(values, **changes):
    keys = {f: values[f] for f in GPTConfig.__dataclass_fields__ if f in values}
    return GPTConfig(**{**keys, **changes})


def describe(cfg):
    return (f"{cfg.n_layer} layers x {cfg.n_embd}, {cfg.n_head} heads, {cfg.n_kv_head} kv heads, "
            f"{cfg.block_size} tokens")


# -----------------------------------------------------------------------------
# Parts 1 and 2: the fast path's numbers against the definition's


def run_tests():
    """Part 1: tests/test_kernels.py on this machine, with its torch (on a GPU machine too the
    tests run on the CPU: what they pin is the code; part 2 checks the GPU's arithmetic)."""
    if importlib.util.find_spec('pytest') is None:
        return 'skipped: pytest is not installed (pip install pytest)'
    result = subprocess.run([sys.executable, '-m', 'pytest', '-q', 'tests/test_kernels.py'],
                            cwd=ROOT, capture_output=True, text=True)
    lines = (result.stdout + result.stderr).strip().splitlines()
    failures = [line for line in lines if line.startswith(('FAILED', 'ERROR'))]
    summary = lines[-1] if lines else 'no output'
    return '\n'.join([f"{'passed' if result.returncode == 0 else 'FAILED'}: {summary}",
                      *failures])


def self_checks():
    """Part 2: a table, one row per preset, a cell per dtype: 'passed' or what differed."""
    lines = [f"memory.py on {DEVICE} against lime.py's definition in float32 on the CPU", '',
             '| preset | kv heads | head size | bfloat16 | float32 |', '|---|---|---|---|---|']
    for path in sorted(glob.glob(os.path.join(ROOT, 'config', '*.py'))):
        cfg = model_config(preset_values(path))
        G, hs = cfg.n_kv_head, cfg.n_embd // cfg.n_head
        cells = []
        for dtype in (torch.bfloat16, torch.float32):
            started = time.time()
            why = memory.self_check(G, hs, dtype, DEVICE)
            cells.append(f"{why or 'passed'} ({time.time() - started:.1f} s)")
        lines.append(f"| {os.path.relpath(path, ROOT)} | {G} | {hs} | {' | '.join(cells)} |")
    return '\n'.join(lines)


# -----------------------------------------------------------------------------
# Parts 3 and 4: training runs side by side


def train(cfg, fused, batches, n_steps):
    """n_steps training steps (AdamW) of a model of cfg from seed 0's weights (so the same weights
    for the same cfg, whichever mix), on batches round and round; fused: lime.use_fused_kernels'
    switch. On a GPU, compiled and in bf16 autocast, as train.py runs. Returns the losses; the
    tokens/s of the steps after the first (None with one step); on a GPU, the peak memory (GiB)
    and the first step's time beyond a later one's (compiling, s)."""
    torch._dynamo.reset()  # each run compiles afresh, with nothing cached from the last
    gc.collect()
    lime.use_fused_kernels(fused, DEVICE)  # no self-check here: part 2 is that
    torch.manual_seed(0)
    model = GPT(cfg).to(DEVICE).train()
    optimizer = model.configure_optimizers(0.1, 3e-4, 3e-3, fused=ON_A_GPU)
    step_model = torch.compile(model) if ON_A_GPU else model
    autocast = torch.autocast('cuda', torch.bfloat16) if ON_A_GPU else nullcontext()
    if ON_A_GPU:
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for step in range(n_steps):
        batch = batches[step % len(batches)].to(DEVICE)
        started = time.perf_counter()
        with autocast:
            _, loss = step_model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # waits for the GPU
        times.append(time.perf_counter() - started)
    result = dict(losses=losses, tokens_per_s=None, compile_s=None, peak_gib=None)
    if ON_A_GPU:
        result['peak_gib'] = torch.cuda.max_memory_allocated() / 2**30
    later = times[1:]
    if later:
        step_s = statistics.median(later[len(later) // 2:])  # the later half: warmed up
        B, T = batches[0].shape
        result['tokens_per_s'] = B * (T - 1) / step_s
        if ON_A_GPU:
            result['compile_s'] = max(0.0, times[0] - step_s)
    return result


def random_batches(cfg, B, count):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, cfg.vocab_size, (B, cfg.block_size + 1), generator=gen)
            for _ in range(count)]


def training_batches(data_dir, cfg, B):
    """(`steps` batches (B, T + 1) from the preset's data, or 8 random ones where it cannot serve,
    and a line saying which)."""
    from prepare import Batches
    try:
        source = Batches(os.path.join(ROOT, data_dir), B, cfg.block_size,
                         vocab_size=cfg.vocab_size, log=lambda message: None)
    except (ValueError, OSError) as e:
        return random_batches(cfg, B, 8), f"random tokens, 8 batches round and round: {e}"
    batches = []
    for _ in range(steps):
        x, y = source.next()
        batches.append(torch.cat((torch.from_numpy(x), torch.from_numpy(y[:, -1:])), dim=1))
    return batches, f"{data_dir}'s first {steps} batches"


def cell(value, spec):
    return '-' if value is None else format(value, spec)


def ratio(value, base):
    return None if value is None or not base else value / base


def table(runs):
    """runs: [(router, mix, result)], the baseline first: one markdown table, with ratios to it."""
    lines = ['| router | mix | first loss | last loss | tokens/s | vs none | peak GiB | vs none | '
             'compile s | vs none |', '|---|---|---|---|---|---|---|---|---|---|']
    base = runs[0][2]
    for router, mix, r in runs:
        measures = [(r[key], ratio(r[key], base[key]), spec) for key, spec in
                    (('tokens_per_s', ',.0f'), ('peak_gib', '.2f'), ('compile_s', '.1f'))]
        lines.append(f"| {router} | {mix} | {r['losses'][0]:.4f} | {r['losses'][-1]:.4f} | "
                     + ' | '.join(f"{cell(value, spec)} | {cell(share, '.3f')}"
                                  for value, share, spec in measures) + ' |')
    return lines


def window_means(losses, width=10):
    return [statistics.fmean(losses[i:i + width]) for i in range(0, len(losses), width)]


def how_run(cfg, B, n_steps):
    if ON_A_GPU:
        return f"{describe(cfg)}; {n_steps} steps of {B} sequences; bf16 autocast, compiled"
    return (f"on a CPU: a tiny model instead ({describe(cfg)}); {n_steps} steps of {B} sequences;"
            " float32, eager: the code paths, not speed")


def train_side_by_side():
    """Part 3: the baseline, then each LIMe router with the definition and with memory.py."""
    values = preset_values(os.path.join(ROOT, preset))
    cfg = model_config(values) if ON_A_GPU else model_config(values, **ON_A_CPU)
    if ON_A_GPU:
        batches, data = training_batches(values.get('data_dir', 'data/fineweb_edu'), cfg,
                                         batch_size)
    else:  # the preset's data has more tokens than the tiny model's vocabulary
        batches, data = random_batches(cfg, batch_size, 8), 'random tokens, 8 batches'
    runs = []
    for router, fused in (('none', False), ('static', False), ('static', True),
                          ('dynamic', False), ('dynamic', True)):
        print(f"  {router}, fused={fused}...", file=sys.stderr, flush=True)
        result = train(model_config(vars(cfg), router=router), fused, batches, steps)
        runs.append((router, '-' if router == 'none' else ('memory.py' if fused else 'definition'),
                     result))
    lines = [f"{preset}'s model: {how_run(cfg, batch_size, steps)}; data: {data}", '',
             *table(runs), '']
    for definition, fast in (runs[1:3], runs[3:5]):
        gap = max(abs(a - b) for a, b in zip(window_means(definition[2]['losses']),
                                             window_means(fast[2]['losses'])))
        speed = ratio(fast[2]['tokens_per_s'], definition[2]['tokens_per_s'])
        peak = ratio(fast[2]['peak_gib'], definition[2]['peak_gib'])
        lines.append(f"- {fast[0]}: the largest gap between the two loss curves' 10-step means is "
                     f"{gap:.4f} ({'within' if gap <= BF16_NOISE else 'NOT within'} bf16 noise, "
                     f"{BF16_NOISE}); memory.py / definition: tokens/s {cell(speed, '.3f')}"
                     + ('' if peak is None else f", peak memory {peak:.3f}"))
    return '\n'.join(lines)


def deep_model():
    """Part 4: each router at 64 layers, with memory.py."""
    values = preset_values(os.path.join(ROOT, 'config', 'deep.py'))
    cfg = model_config(values, n_layer=64) if ON_A_GPU else model_config(values, **ON_A_CPU)
    batches = random_batches(cfg, batch_size, 2)
    runs = []
    for router in ('none', 'static', 'dynamic'):
        print(f"  {router}...", file=sys.stderr, flush=True)
        result = train(model_config(vars(cfg), router=router), True, batches, deep_steps)
        runs.append((router, '-' if router == 'none' else 'memory.py', result))
    return '\n'.join([f"config/deep.py's model at 64 layers: {how_run(cfg, batch_size, deep_steps)}"
                      "; data: random tokens", '', *table(runs)])


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


PARTS = {'tests': ('1. Kernel tests', run_tests),
         'self_check': ('2. Self-check at every preset', self_checks),
         'training': ('3. Training: the definition vs memory.py, and the baseline',
                      train_side_by_side),
         'deep': ('4. 64 layers: compile time and memory', deep_model)}


def main():
    config, given, _ = configure(globals(), {'path': ['preset', 'report'], 'text': ['parts'],
                                             'positive': ['steps', 'deep_steps', 'batch_size']})
    if not ON_A_GPU and 'steps' not in given:
        config['steps'] = 20  # the tiny model's runs check the code, which 20 steps do
    globals().update(config)
    if ON_A_GPU:  # float32 matmuls may use TF32, as in train.py (configurator.configure)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    chosen = parts.split(',')
    for part in chosen:
        if part not in PARTS:
            fail(f"parts: {part!r} is not one of {', '.join(PARTS)}")
    if not os.path.isfile(os.path.join(ROOT, preset)):
        fail(f"preset not found: {preset}")
    try:  # its model, checked now: part 3, which trains it, comes after minutes of the others
        model_config(preset_values(os.path.join(ROOT, preset)))
    except (TypeError, ValueError) as e:  # a value of another type, or out of its range
        fail(f"preset {preset}: {e}")
    text = ['# lab/gpu_check.py report', '', environment()]
    crashed = []
    for name in chosen:
        title, part = PARTS[name]
        print(f"{title}...", file=sys.stderr, flush=True)
        started = time.time()
        try:
            body = part()
        except Exception as e:  # the other parts' results still make the report
            body = f"FAILED: {type(e).__name__}: {last_line(e)}"
            crashed.append(name)
        text += ['', f"## {title}", '', body, '', f"({name}: {time.time() - started:.0f} s)"]
    text = '\n'.join(text) + '\n'
    print(text)
    with open(report, 'w', encoding='utf-8') as f:
        f.write(text)
    print(f"written to {report}", file=sys.stderr)
    if crashed:
        fail(f"{', '.join(crashed)}: stopped with an error (see the report)")


if __name__ == '__main__':
    main()
