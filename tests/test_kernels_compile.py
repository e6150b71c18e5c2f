"""
The fused kernels (kernels/fused.py) as a GPU builds them, without a GPU: Triton compiles for a
GPU target without one. A subprocess (TRITON_INTERPRET=0: importing the kernels on a machine
without CUDA would choose the interpreter, under which the autotuner keeps one config) puts a
stand-in driver in place that only names the target, sm_80 (A100) or sm_90 (H100). It builds each
kernel's launch with fused.py's own launch functions (the arguments, so the signature,
specialisation and constexprs a GPU run passes), asks the kernel's autotuner prune which configs
it would time, and compiles each with `kernel.warmup`, as the autotuner's warmup does. Registers,
stack frame (spills) and static shared memory come from the cubin (cuobjdump, bundled with
triton), dynamic shared memory from the compiled kernel's metadata.

Shapes: every one the repo ships, lab/bench.py's SHAPES and config/*.py (read from those files),
and tests/test_fused.py's. Integer arguments are specialised on divisibility by 16, so each shape
is compiled at a small batch x time with the same divisibility; the number of sources S is not
specialised (one compile serves every layer), so S = 2 stands for all (S = 16 and 1 are in the
full run too).

Asserted: every config compiles; none needs more shared memory per block than the GPU allows
(SMEM_LIMIT); at the default configs nothing spills (no stack frame) and, in bfloat16, at most
128 registers per thread (16 warps per SM); in bfloat16 at head sizes that are multiples of 8, no
load from global memory is narrower than 4 bytes (the sources' loads are 16-byte vectors).

CI compiles a representative part, about 100 compiles, ~20 s of CPU (ci_cases says which). All
of it, about 1,500 compiles (~5 min of CPU), and the tables in docs/performance.md:

    python tests/test_kernels_compile.py --all --table

The other tests here run on a CPU, in this process, under the interpreter: autotuning a backward
kernel allocates nothing, times the kernel alone and adds the gradients once; every launch runs
inside its tensors' device; float32 follows torch's TF32 setting; the prune never offers a tile
that cannot compile.
"""
import ast
import contextlib
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile

os.environ.setdefault('TRITON_INTERPRET', '1')  # before fused.py defines its kernels (in-process)

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == '__main__':
    sys.path.insert(0, ROOT)  # as pytest.ini's pythonpath does
ARCHS = {80: 'A100 (sm_80)', 90: 'H100 (sm_90)'}
# The most shared memory one block may use (opt-in, dynamic + static), bytes: A100 163 KB,
# H100 227 KB. Both GPUs allow 64K 32-bit registers and 64 warps per SM.
SMEM_LIMIT = {80: 166912, 90: 232448}
SMEM_PER_SM = {80: 167936, 90: 233472}  # per SM, of which 1 KB per block is reserved
MAX_REGS_DEFAULT = 128  # per thread at the default configs in bf16: 16 warps per SM at 4 warps
KERNELS = ['static_mix_fwd_kernel', 'static_mix_bwd_kernel', 'dynamic_mix_fwd_kernel',
           'dynamic_mix_bwd_kernel']

# tests/test_fused.py's shapes: (name, n_kv_head G, head size, layers, batch, time)
TEST_SHAPES = [('test:cases G12', 12, 8, 3, 2, 3), ('test:cases G2 hs6', 2, 6, 1, 2, 7),
               ('test:cases G2 hs16', 2, 16, 5, 2, 5), ('test:cases G3 hs4', 3, 4, 2, 2, 7),
               ('test:bf16', 12, 8, 4, 2, 5), ('test:model', 2, 8, 4, 2, 13),
               ('test:saved bytes', 6, 16, 6, 2, 64), ('test:train.py', 2, 16, 3, 2, 16),
               ('test:ddp', 2, 64, 4, 2, 13)]


def read_assignments(path):
    """A script's top-level `name = literal` lines (config files, train.py's defaults)."""
    values = {}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            with contextlib.suppress(ValueError, TypeError, SyntaxError):
                values[getattr(node.targets[0], 'id', None)] = ast.literal_eval(node.value)
    return values


def bench_shapes():
    """lab/bench.py's SHAPES, {name: (GPTConfig fields, batch)}, read without running it."""
    for node in ast.parse(open(os.path.join(ROOT, 'lab', 'bench.py')).read()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], 'id', '') == 'SHAPES':
            return eval(compile(ast.Expression(node.value), 'bench.py', 'eval'), {'dict': dict})
    raise AssertionError("lab/bench.py has no SHAPES")


def shipped_shapes():
    """[(name, G, head size, layers, batch, time)] for every shape the repo ships."""
    defaults = {'n_layer': 12, 'n_head': 12, 'n_kv_head': 0, 'n_embd': 768, 'block_size': 1024,
                'batch_size': 1}
    train = read_assignments(os.path.join(ROOT, 'train.py'))
    defaults.update({k: train[k] for k in defaults if k in train})

    def shape(name, fields, batch):
        c = {**defaults, **fields}
        return (name, c['n_kv_head'] or c['n_head'], c['n_embd'] // c['n_head'], c['n_layer'],
                batch, c['block_size'])
    shapes = [shape(f'bench:{name}', fields, batch)
              for name, (fields, batch) in bench_shapes().items()]
    for path in sorted(glob.glob(os.path.join(ROOT, 'config', '*.py'))):
        fields = read_assignments(path)
        name = 'config/' + os.path.basename(path)
        shapes.append(shape(name, fields, fields.get('batch_size', defaults['batch_size'])))
    return shapes + TEST_SHAPES


def cases(shapes):
    """One compile case per distinct (G, head size, batch x time divisibility, S): a batch x time
    of gcd(B*T, 16) keeps every integer argument's divisibility by 16 (what triton specialises
    on). {key: case} with the names of the shapes it stands for."""
    out = {}
    for name, G, hs, n_layer, B, T in shapes:
        bt = math.gcd(B * T, 16)
        assert B * T * 2 * G * hs < 2 ** 31, f"{name}: 64-bit offsets would compile differently"
        for S in sorted({2, 16} & set(range(2, n_layer + 1))) or [1]:  # 1: a lone router
            key = (G, hs, bt, S)
            out.setdefault(key, dict(G=G, hs=hs, bt=bt, S=S, shapes=[]))['shapes'].append(name)
    return out


GPU_SHAPES = ('bench:gpt2', 'bench:paper_1b', 'bench:paper_1b_gqa', 'bench:deep')


def ci_cases(all_cases):
    """The part compiled in CI, [(case, kernel, dtype, arch, every config or the default only)]:
    the GPU shapes (bench.py's --shape=all) at every config in bf16 for sm_90 and at the
    defaults for sm_80, and at the defaults in fp32 (TF32 off, torch's default) for sm_90; the
    static backward at every config on the smallest heads (head size 4 and 6, where a tile can
    be too narrow for tl.dot). About 100 compiles."""
    picked = []
    for case in all_cases.values():
        gpu = any(name in GPU_SHAPES for name in case['shapes']) and case['S'] == 2
        for kernel in KERNELS:
            if gpu:
                picked += [(case, kernel, 'bf16', 90, True), (case, kernel, 'bf16', 80, False),
                           (case, kernel, 'fp32', 90, False)]
            elif kernel == 'static_mix_bwd_kernel' and case['hs'] < 8 and case['S'] == 2:
                picked += [(case, kernel, 'bf16', 90, True)]
    return picked


def full_cases(all_cases):
    """Everything: every case, kernel, config, dtype (fp32 with TF32 off and on) and target."""
    dtypes = ['bf16', 'fp32', 'fp32-tf32']
    return [(case, kernel, dtype, arch, True) for case in all_cases.values() for kernel in KERNELS
            for dtype in dtypes for arch in ARCHS
            if not (dtype == 'fp32-tf32' and kernel.startswith('dynamic'))]  # no tl.dot there


# ---------------------------------------------------------------------------------------------
# The subprocess that compiles (python tests/test_kernels_compile.py --worker ...).

class StandInDriver:
    """Names the target and nothing else: enough for triton to specialise and compile a launch
    (kernel.warmup); nothing is launched. The device id is the target's arch, so that each
    target gets its own compile cache in every kernel."""

    def __init__(self, arch):
        from triton.backends.compiler import GPUTarget
        self.arch, self.target = arch, GPUTarget('cuda', arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return self.arch

    def get_current_stream(self, device=None):
        return 0


def resources(compiled, tool):
    """(registers, stack bytes, static shared bytes) of a compiled kernel, from its cubin."""
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(compiled.asm['cubin'])
        f.flush()
        text = subprocess.run([tool, '-res-usage', f.name], capture_output=True, text=True,
                              check=True).stdout
    usage = dict(re.findall(r'(REG|STACK|SHARED):(\d+)', text))
    return int(usage['REG']), int(usage['STACK']), int(usage['SHARED'])


@contextlib.contextmanager
def tf32(allowed):
    """torch's TF32 switch for float32 matmuls, for a while."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, 'fp32_precision'):  # torch >= 2.9
        saved, matmul.fp32_precision = matmul.fp32_precision, 'tf32' if allowed else 'ieee'
    else:
        saved, matmul.allow_tf32 = matmul.allow_tf32, allowed
    try:
        yield
    finally:
        if hasattr(matmul, 'fp32_precision'):
            matmul.fp32_precision = saved
        else:
            matmul.allow_tf32 = saved


def launch_for(fused, kernel, case, dtype):
    """The kernel's launch, (kernel, grid, args, constexprs), from fused.py's own launch
    functions, on small CPU tensors of the case's shape."""
    G, hs, bt, S = case['G'], case['hs'], case['bt'], case['S']
    t = {'bf16': torch.bfloat16, 'fp32': torch.float32, 'fp32-tf32': torch.float32}[dtype]
    fused_kernel = getattr(fused, kernel)
    kv = [torch.empty(1, bt, 2, G, hs, dtype=t) for _ in range(S)]
    grads = torch.empty(S, 1, bt, 2, G, hs, dtype=t)
    if kernel.startswith('static'):
        R = torch.empty(G, S * G)  # the router's weight, fp32 under autocast
        if kernel == 'static_mix_fwd_kernel':
            plan = fused.static_forward_launch(R, kv, torch.empty_like(kv[0]))
        else:
            GP = max(16, 1 << (G - 1).bit_length())
            plan = fused.static_backward_launch(kv[0], R, kv, grads,
                                                torch.empty(1, S, GP, GP))
    else:
        probs = torch.empty(1, bt, G, S)  # float32 softmax
        if kernel == 'dynamic_mix_fwd_kernel':
            plan = fused.dynamic_forward_launch(probs, kv, torch.empty_like(kv[0]))
        else:
            plan = fused.dynamic_backward_launch(kv[0], probs, kv, grads, torch.empty_like(probs))
    assert plan[0] is fused_kernel
    return plan


def worker(which, out_path):
    import warnings
    warnings.filterwarnings('ignore')
    import triton
    from triton.runtime.driver import driver
    assert not fused.INTERPRET, "the worker must run with TRITON_INTERPRET=0"
    tool = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump')
    all_cases = cases(shipped_shapes())
    todo = full_cases(all_cases) if which == 'all' else ci_cases(all_cases)
    rows = []
    for case, kernel, dtype, arch, every_config in todo:
        driver.set_active(StandInDriver(arch))
        with tf32(dtype == 'fp32-tf32'):
            tuner, grid, args, meta = launch_for(fused, kernel, case, dtype)
        # What Autotuner.warmup does, one config at a time so that each failure is recorded.
        configs = tuner.early_config_prune(tuner.configs, dict(zip(tuner.arg_names, args)),
                                           **meta)
        for i, config in enumerate(configs if every_config else configs[:1]):
            row = dict(kernel=kernel, shapes=case['shapes'], G=case['G'], hs=case['hs'],
                       bt=case['bt'], S=case['S'], dtype=dtype, arch=arch,
                       precision=meta.get('PRECISION'), ROWS=config.kwargs['ROWS'],
                       warps=config.num_warps, default=i == 0, error=None)
            try:
                compiled = tuner.fn.warmup(*args, grid=grid, **meta, **config.all_kwargs())
                regs, stack, static_smem = resources(compiled, tool)
                row.update(regs=regs, stack=stack, smem=compiled.metadata.shared + static_smem,
                           narrow_loads=narrow_loads(compiled.asm['ptx']))
            except Exception as e:  # recorded; the test fails on it
                row['error'] = f'{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}'
            rows.append(row)
    with open(out_path, 'w') as f:
        json.dump(rows, f)


def narrow_loads(ptx):
    """The PTX's 2-byte loads from global memory (one bf16 element each; plain loads or copies
    into shared memory): 16-byte vectors need the sources' addresses known to be aligned."""
    plain = re.findall(r'ld\.global\S*\.[bu]16\b', ptx)
    copies = re.findall(r'cp\.async\S* \[[^]]*\], \[[^]]*\], (?:0x2|2)\b', ptx)
    return len(plain) + len(copies)


def run_worker(which, out_path, cache_dir):
    env = {**os.environ, 'TRITON_INTERPRET': '0', 'TRITON_CACHE_DIR': cache_dir}
    cmd = [sys.executable, os.path.abspath(__file__), '--worker', which, out_path]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(out_path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# What a compiled kernel implies.

def warps_per_sm(row):
    """Resident warps per SM that the registers and shared memory allow (64 at most, 32 blocks):
    registers are allocated per warp in units of 256."""
    regs_per_warp = math.ceil(row['regs'] * 32 / 256) * 256
    by_regs = 65536 // (regs_per_warp * row['warps'])
    by_smem = SMEM_PER_SM[row['arch']] // (row['smem'] + 1024)
    return min(by_regs, by_smem, 32, 64 // row['warps']) * row['warps']


def problems(rows):
    """Every violation of what the module docstring asserts, as text."""
    found = []
    for r in rows:
        where = (f"{r['kernel']} {r['dtype']} sm_{r['arch']} G={r['G']} hs={r['hs']} "
                 f"S={r['S']} ROWS={r['ROWS']} warps={r['warps']} ({', '.join(r['shapes'])})")
        if r['error']:
            found.append(f"{where}: does not compile: {r['error']}")
            continue
        if r['smem'] > SMEM_LIMIT[r['arch']]:
            found.append(f"{where}: {r['smem']} B of shared memory > {SMEM_LIMIT[r['arch']]}")
        if r['default'] and r['stack']:
            found.append(f"{where}: default config spills ({r['stack']} B stack frame)")
        if r['dtype'] == 'bf16' and r['hs'] % 8 == 0 and r.get('narrow_loads'):
            found.append(f"{where}: {r['narrow_loads']} 2-byte loads (the sources' loads should "
                         "be vectors of 8 or 16 bytes)")
        if r['default'] and r['dtype'] == 'bf16' and r['regs'] > MAX_REGS_DEFAULT:
            found.append(f"{where}: default config uses {r['regs']} registers "
                         f"({warps_per_sm(r)} warps per SM)")
    return found


triton = pytest.importorskip('triton', reason="the fused kernels need triton (pip install triton)")


def compiler_missing():
    bin_dir = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin')
    tools = [os.path.join(bin_dir, t) for t in ('ptxas', 'cuobjdump')]
    missing = [t for t in tools if not os.access(t, os.X_OK)]
    return f"triton's NVIDIA tools are missing: {', '.join(missing)}" if missing else None


@pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))
def test_every_kernel_compiles_for_a100_and_h100_at_every_shape_the_repo_ships(tmp_path):
    rows = run_worker('ci', str(tmp_path / 'rows.json'), str(tmp_path / 'cache'))
    assert len(rows) >= 90
    assert {(r['kernel'], r['arch'], r['dtype']) for r in rows} >= {
        (k, a, d) for k in KERNELS for a in ARCHS for d in ('bf16',)} | {
        (k, 90, 'fp32') for k in KERNELS}
    assert not problems(rows), '\n'.join(problems(rows))


# ---------------------------------------------------------------------------------------------
# On a CPU, in this process, under the interpreter.

from kernels import fused  # noqa: E402


class Allocations(TorchDispatchMode):
    """Counts the bytes of every new tensor storage that an aten op makes while it is on, and
    notes those ops and copies between different storages. (The interpreter's own bookkeeping
    makes empty tensors and copies each argument onto itself.)"""

    def __init__(self):
        super().__init__()
        self.bytes, self.ops = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        storages = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.untyped_storage().nbytes()
                    and t.untyped_storage().data_ptr() not in storages):
                self.bytes += t.untyped_storage().nbytes()
                self.ops.append(str(func))
        if func is torch.ops.aten.copy_.default and (
                args[0].untyped_storage().data_ptr() != args[1].untyped_storage().data_ptr()):
            self.ops.append(str(func))
        return out


def backward_case(kind):
    """A backward op, its arguments and where its results land: (op, args, kernel)."""
    torch.manual_seed(0)
    G, hs, S, B, T = 2, 16, 3, 2, 8
    kv = [torch.randn(B, T, 2, G, hs) for _ in range(S)]
    grads = torch.randn(S, B, T, 2, G, hs)  # earlier layers' shares already in the buffer
    dout = torch.randn(B, T, 2, G, hs)
    if kind == 'static':
        return fused.static_mix_backward, (dout, torch.randn(G, S * G), kv, grads), \
            fused.static_mix_bwd_kernel
    probs = torch.randn(B, T, G, S).softmax(-1)
    return fused.dynamic_mix_backward, (dout, probs, kv, grads), fused.dynamic_mix_bwd_kernel


@pytest.mark.parametrize('kind', ['static', 'dynamic'])
def test_autotuning_a_backward_allocates_nothing_times_the_kernel_alone_and_adds_once(
        kind, monkeypatch):
    # The reference: one config, no autotuning (what the interpreter always does).
    op, args, kernel = backward_case(kind)
    d_ref = op(*args)
    grads_ref = args[3]
    # Autotuning, as on a GPU: every config the prune keeps is timed, through fused.py's own
    # do_bench and flag, by a stand-in benchmarker that runs the call once; the last is "fastest".
    op, args, kernel = backward_case(kind)
    monkeypatch.setattr(fused, 'single_config', False)
    monkeypatch.setattr(kernel, 'cache', {})  # a shape it has not seen
    timed = []

    def stand_in(kernel_call, quantiles):
        with Allocations() as during:
            kernel_call()
        timed.append(during)
        return [10.0 - len(timed)] * len(quantiles)
    monkeypatch.setattr(fused, 'benchmarker', lambda: stand_in)
    tuner_run, tuning = kernel.run, []

    def run(*a, **kw):  # the autotuner's whole run: its hooks, the trials and the real launch
        with Allocations() as during:
            result = tuner_run(*a, **kw)
        tuning.append(during)
        return result
    monkeypatch.setattr(kernel, 'run', run)
    d = op(*args)
    assert len(timed) >= 3, "the autotuner should have timed several configs"
    assert kernel.cache and list(kernel.cache.values())[0].kwargs['ROWS'] is not None
    # No gradient-sized copy (the old restore_value=['grads'] cloned the whole buffer: here
    # 6 KB, at gpt2 in bf16 1.2 GB) and nothing else either; nothing but the kernel is timed.
    assert tuning[0].bytes == 0, tuning[0].ops
    assert all(t.bytes == 0 and not t.ops for t in timed), [t.ops for t in timed]
    # The trials left the gradient buffer alone: the sources' gradients were added exactly once
    # (another tile sums in another order: the last bit may differ).
    torch.testing.assert_close(args[3], grads_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d, d_ref, rtol=1e-5, atol=1e-5)
    assert fused.trial_flag(args[0].device).item() == 1


def test_launches_run_on_their_tensors_device(monkeypatch):
    # Triton launches on the current CUDA device: each op enters its tensors' device first.
    # Without a GPU: the guard names the tensor's device, and every launch happens inside it.
    fake = type('FakeCudaTensor', (), {'is_cuda': True, 'device': torch.device('cuda', 1)})()
    guard = fused.on_device(fake)
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert isinstance(fused.on_device(torch.zeros(1)), contextlib.nullcontext)
    inside, launched = [], []
    real_on_device = fused.on_device

    @contextlib.contextmanager
    def recording(x):
        inside.append(x.device)
        with real_on_device(x):
            yield
        inside.pop()

    def launch(kernel, grid, args, meta):
        launched.append((kernel.fn.__name__, list(inside)))
        kernel[grid](*args, **meta)
    monkeypatch.setattr(fused, 'on_device', recording)
    monkeypatch.setattr(fused, 'launch', launch)
    G, hs = 2, 8
    kv = [torch.randn(1, 4, 2, G, hs, requires_grad=True) for _ in range(2)]
    R = torch.randn(G, 2 * G, requires_grad=True)
    probs = torch.randn(1, 4, G, 2).softmax(-1).requires_grad_()
    (fused.static_mix(R, kv).sum() + fused.dynamic_mix(probs, kv).sum()).backward()
    assert sorted(name for name, _ in launched) == sorted(KERNELS)
    assert all(devices == [torch.device('cpu')] for _, devices in launched), launched


def test_float32_follows_torchs_tf32_setting_and_16_bit_types_are_exact(monkeypatch):
    monkeypatch.setattr(fused, 'INTERPRET', False)  # as on a GPU
    with tf32(False):
        assert fused.dot_precision(torch.float32) == 'ieee'  # torch's default: exact float32
        assert fused.dot_precision(torch.bfloat16) == 'ieee'
    with tf32(True):
        assert fused.dot_precision(torch.float32) == 'tf32'
        G, S = 4, 2
        kv = [torch.empty(1, 2, 2, G, 8) for _ in range(S)]
        meta = fused.static_forward_launch(torch.empty(G, S * G), kv, kv[0])[3]
        assert meta['PRECISION'] == 'tf32'
        assert fused.dot_precision(torch.bfloat16) == 'ieee'
    monkeypatch.setattr(fused, 'INTERPRET', True)
    with tf32(True):
        assert fused.dot_precision(torch.float32) == 'ieee'  # the interpreter computes exactly


@pytest.mark.parametrize('single', [False, True])
def test_the_prune_offers_only_tiles_that_compile_and_the_default_first(single, monkeypatch):
    # Every (G, head size) up to 64 x 128, every dtype: the static backward's tl.dot runs over
    # the tile's ROWS * head size columns, which must be >= 16 in 16-bit types (8 in float32).
    import triton.language as tl
    monkeypatch.setattr(fused, 'single_config', single)
    static_fwd, static_bwd, dynamic = (fused.static_mix_fwd_kernel.early_config_prune,
                                       fused.static_mix_bwd_kernel.early_config_prune,
                                       fused.dynamic_mix_bwd_kernel.early_config_prune)
    for dtype, least in [(tl.bfloat16, 16), (tl.float16, 16), (tl.float32, 8)]:
        for G in range(1, 65):
            for hs in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128):
                HSP, GP = triton.next_power_of_2(hs), max(16, triton.next_power_of_2(G))
                meta = dict(G=G, HS=hs, GP=GP, HSP=HSP, DTYPE=dtype)
                for prune in (static_fwd, static_bwd, dynamic):
                    configs = prune(fused.CANDIDATES, {}, **meta)
                    assert len(configs) == 1 if single else 2 <= len(configs) <= 4
                    # 8 warps only for a 16-bit static tile that fills its budget at one row
                    budget = 2048 if prune is static_bwd else 4096
                    wide = prune is not dynamic and dtype != tl.float32 and GP * HSP * max(
                        1, -(-least // HSP)) >= budget
                    assert configs[0].num_warps == (8 if wide else 4), meta
                    assert len({(c.kwargs['ROWS'], c.num_warps) for c in configs}) == len(configs)
                    if prune is not dynamic:
                        assert all(c.kwargs['ROWS'] * HSP >= least for c in configs), meta


# ---------------------------------------------------------------------------------------------
# The tables in docs/performance.md: python tests/test_kernels_compile.py --all --table

H100_BANDWIDTH = 3.35e12  # bytes/s, H100 SXM HBM3


def step_bytes(kernel, G, hs, n_layer, B, T, element=2):
    """Bytes one training step's calls of kernel move to and from memory, over all its layers:
    each source, the output (gradient) and the gradient slots once per call; the probabilities
    (float32) for the dynamic kernels."""
    N = B * T * 2 * G * hs
    total = 0
    for S in range(2, n_layer + 1):  # layer l = S - 1 >= 1
        per_source = {'fwd': 1, 'bwd': 3}[kernel.split('_')[2]]  # bwd: source, slot read + write
        total += (per_source * S + 1) * N * element
        if kernel.startswith('dynamic'):
            total += B * T * G * S * 4 * (1 if 'fwd' in kernel else 2)
    return total


def partial_sum_bytes(G, n_layer, B, T, rows):
    """The static backward's traffic to its per-program slices of R's gradient (float32, (G
    padded)^2 per source, read and written once per tile): L2, not memory, if they fit."""
    GP = max(16, 1 << (G - 1).bit_length())
    tiles = -(-B * T * 2 // rows)
    return sum(S * tiles * GP * GP * 4 * 2 for S in range(2, n_layer + 1))


def table(rows, shapes):
    """Markdown: the default configs in bf16 at every shipped shape (sm_90 | sm_80), then the
    worst of every config tried, per kernel and dtype."""
    by = {}
    for r in rows:
        if r['default'] and r['dtype'] == 'bf16' and r['S'] == 2 and not r['error']:
            for name in r['shapes']:
                by.setdefault((name, r['kernel']), {})[r['arch']] = r
    lines = ['| shape | kernel | tile (ROWS, warps) | registers | spills (B) | smem (KB) | '
             'warps/SM | GB per step | ms at 3.35 TB/s |', '|' + '---|' * 9]
    for name, G, hs, n_layer, B, T in shapes:
        if name.startswith('test:'):
            continue
        for kernel in KERNELS:
            pair = by.get((name, kernel))
            if not pair or set(pair) != set(ARCHS):
                continue
            h, a = pair[90], pair[80]
            gb = step_bytes(kernel, G, hs, n_layer, B, T) / 1e9
            l2 = (f" (+{partial_sum_bytes(G, n_layer, B, T, h['ROWS']) / 1e9:.2f} L2)"
                  if kernel == 'static_mix_bwd_kernel' else '')
            lines.append(
                f"| {name} (G {G}, hs {hs}, L {n_layer}, B {B}, T {T}) | {kernel} | "
                f"{h['ROWS']}, {h['warps']} | {h['regs']} / {a['regs']} | "
                f"{h['stack']} / {a['stack']} | {h['smem'] / 1024:.1f} / {a['smem'] / 1024:.1f} | "
                f"{warps_per_sm(h)} / {warps_per_sm(a)} | {gb:.2f}{l2} | "
                f"{gb * 1e9 / H100_BANDWIDTH * 1e3:.2f} |")
    lines += ['', '| kernel | dtype | configs compiled | failed | most registers | '
              'spilling (any config) | most smem (KB) |', '|' + '---|' * 7]
    for kernel in KERNELS:
        for dtype in ('bf16', 'fp32', 'fp32-tf32'):
            some = [r for r in rows if r['kernel'] == kernel and r['dtype'] == dtype]
            if not some:
                continue
            ok = [r for r in some if not r['error']]
            spilling = sorted({f"G {r['G']} hs {r['hs']} ROWS {r['ROWS']} w{r['warps']} "
                               f"sm_{r['arch']}: {r['stack']} B" for r in ok if r['stack']})
            lines.append(f"| {kernel} | {dtype} | {len(some)} | {len(some) - len(ok)} | "
                         f"{max(r['regs'] for r in ok)} | {'; '.join(spilling) or 'none'} | "
                         f"{max(r['smem'] for r in ok) / 1024:.1f} |")
    return '\n'.join(lines)


def main(argv):
    """--all: compile everything (several minutes); --table: print docs/performance.md's tables;
    --rows=FILE: reuse (or keep) the compile results."""
    opts = dict(a.split('=', 1) if '=' in a else (a, True) for a in argv)
    out = opts.get('--rows') or os.path.join(tempfile.mkdtemp(), 'rows.json')
    if not os.path.exists(out):
        run_worker('all' if '--all' in opts else 'ci', out, tempfile.mkdtemp())
    with open(out) as f:
        rows = json.load(f)
    print(f"{len(rows)} compiles, rows in {out}")
    print('\n'.join(problems(rows)) or 'no problems')
    if '--table' in opts:
        print(table(rows, shipped_shapes()))


if __name__ == '__main__' and sys.argv[1:2] == ['--worker']:
    worker(sys.argv[2], sys.argv[3])
elif __name__ == '__main__':
    main(sys.argv[1:])
