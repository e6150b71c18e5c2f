"""
What keeps kernels/fused.py's Triton kernels from running where they would be wrong, and the
failures a GPU would meet, shown on a CPU (under Triton's interpreter where a kernel must run):

1. an autotuner that ignores the do_bench hook (triton 3.2) is refused: its timing runs would add
   the gradients again, hundreds of times;
2. an old triton, or anything else that breaks importing the kernels, ends in one line: an error
   for fused=True, a note and the plain mix for fused=None;
3. a graph break inside a compiled model with the kernels on fails at compile time, in one graph
   (the gradient buffer they share cannot cross graphs);
4. a second backward through the same graph (retain_graph) gives the plain mix's gradients;
5. (the sources' 16-byte loads: tests/test_kernels_compile.py reads the compiled PTX);
6. the bf16 gradient buffer rounds the sum of 64 layers' shares no worse than autograd's own
   bf16 sums do in the plain mix (an emulation of a GPU's rounding, measured);
7. the ops are marked unsafe for CUDA graphs, and GPUs older than compute capability 8.0 get the
   plain mix;
and the startup self-check: it passes on correct kernels, and a kernel made wrong on purpose
makes fused=None fall back to the plain mix. The grid's programs, run in reversed and shuffled
order, give the same bits.

    python -m pytest -q tests/test_fused_checks.py
"""
import contextlib
import importlib
import os
import random
import subprocess
import sys

import torch

# With a GPU the real kernels run; without one, Triton's interpreter (set before fused.py defines
# its kernels).
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

import pytest  # noqa: E402

import lime  # noqa: E402
from lime import GPT, GPTConfig  # noqa: E402

triton = pytest.importorskip('triton', reason="the fused kernels need triton (pip install triton)")
import kernels  # noqa: E402
from kernels import fused  # noqa: E402
from test_kernels_cpu import mix  # noqa: E402  (lime's switch on a module, for a while)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (2, 8, torch.float32)  # kv heads, head size, dtype: tiny, for the interpreter


def tiny_model(router, seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_kv_head=2, n_embd=32, block_size=16,
                          vocab_size=64, router=router))
    for r in model.routers():  # off their init, so every source matters
        for p in r.parameters():
            torch.nn.init.normal_(p, std=0.5)
    return model


def batch():
    data = torch.randint(0, 64, (2, 14), generator=torch.Generator().manual_seed(1))
    return data[:, :-1], data[:, 1:]


# ---------------------------------------------------------------------------------------------
# Which mix runs

def test_on_cuda_the_default_is_the_plain_mix(monkeypatch):
    # Nothing here touches a GPU: the default is decided before any.
    assert kernels.FUSED_BY_DEFAULT_ON_CUDA is False
    assert kernels.choose(None, 'cuda', SHAPE) is None
    assert kernels.choose(None, 'cuda:1') is None
    assert kernels.choose(False, 'cuda') is None
    assert kernels.choose(None, 'cpu') is importlib.import_module('kernels.cpu')


@pytest.mark.parametrize('capability', [(6, 0), (7, 5)])
def test_a_gpu_older_than_ampere_gets_the_plain_mix(capability, monkeypatch, capsys):
    monkeypatch.setattr(kernels, 'FUSED_BY_DEFAULT_ON_CUDA', True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: capability)
    assert kernels.choose(None, 'cuda') is None
    note = capsys.readouterr().out
    assert note.count('\n') == 1 and f"compute capability is {capability[0]}." in note
    with pytest.raises(ValueError, match=r'^fused=True: .*compute capability'):
        kernels.choose(True, 'cuda')


@pytest.mark.parametrize('error', [
    ImportError("the fused kernels need triton >= 3.3, found 3.2.0"),
    TypeError("Autotuner.__init__() got an unexpected keyword argument 'do_bench'"),
    RuntimeError("ptxas fatal: a broken install\nwith a long message"),
])
def test_whatever_breaks_importing_the_kernels_ends_in_one_line(error, monkeypatch, capsys):
    real_import = importlib.import_module

    def import_module(name, *args):
        if name == 'kernels.fused':
            raise error
        return real_import(name, *args)
    monkeypatch.setattr(importlib, 'import_module', import_module)
    with pytest.raises(ValueError) as raised:
        lime.use_fused_kernels(True, 'cpu')
    message = str(raised.value)
    assert '\n' not in message and 'kernels/fused.py did not load' in message
    assert type(error).__name__ in message
    # fused=None where the kernels would be picked: a note, and the plain mix
    monkeypatch.setattr(kernels, 'FUSED_BY_DEFAULT_ON_CUDA', True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: (9, 0))
    with mix(fused):
        assert lime.use_fused_kernels(None, 'cuda') is None
        assert lime.mix_kernels is None
    assert capsys.readouterr().out.startswith("note: LIMe's mix runs in plain PyTorch: ")


@pytest.mark.parametrize('version', ['3.2.0', '3.1.0'])
def test_an_old_triton_is_refused_when_the_kernels_load(version):
    # A fresh process: fused.py checks the version before it defines a kernel.
    code = (f"import triton; triton.__version__ = '{version}'\n"
            "import kernels\n"
            "print(kernels.why_not_fused('cpu', None))")
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, 'TRITON_INTERPRET': '1'})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("kernels/fused.py did not load (ImportError: the fused "
                                     f"kernels need triton >= 3.3, found {version})")


# ---------------------------------------------------------------------------------------------
# 1. The autotuner's do_bench hook

def test_a_tuner_that_drops_the_do_bench_hook_is_refused(monkeypatch):
    # Every backward kernel was built with fused.py's own hook...
    for kernel in (fused.static_mix_bwd_kernel, fused.dynamic_mix_bwd_kernel):
        assert kernel._do_bench is not None and kernel._do_bench.__module__ == fused.__name__

    # ...and a tuner that accepts the hook but keeps triton's default (what triton 3.2 does)
    # is refused when the kernels are defined.
    real_autotune = triton.autotune

    def autotune_dropping_the_hook(configs, key, do_bench=None, **kwargs):
        return real_autotune(configs, key, **kwargs)
    monkeypatch.setattr(triton, 'autotune', autotune_dropping_the_hook)

    @triton.jit
    def kernel(x, G, HS, ROWS: triton.language.constexpr):
        pass
    with pytest.raises(ImportError, match='does not use the do_bench hook'):
        fused.autotuned(lambda configs, named_args, **meta: configs[:1])(kernel)


# ---------------------------------------------------------------------------------------------
# 3. A graph break

def test_a_graph_break_with_the_kernels_on_fails_at_compile_in_one_graph(monkeypatch):
    assert fused.NEEDS_ONE_GRAPH  # train.py compiles with fullgraph=True while they are on
    model = tiny_model('static')
    block_forward = lime.Block.forward

    def forward_with_a_break(self, *args, **kwargs):
        torch._dynamo.graph_break()
        return block_forward(self, *args, **kwargs)
    monkeypatch.setattr(lime.Block, 'forward', forward_with_a_break)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend='aot_eager', fullgraph=True)
    x, y = batch()
    with mix(fused), pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(x, y)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# 4. A second backward

@pytest.mark.parametrize('router', ['static', 'dynamic'])
def test_a_second_backward_gives_the_plain_mixs_gradients(router):
    x, y = batch()
    grads = []
    for module in (None, fused):
        model = tiny_model(router)
        with mix(module):
            _, loss = model(x, y)
            loss.backward(retain_graph=True)
            loss.backward()  # the gradients of 2 * loss
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, plain in grads[0].items():
        torch.testing.assert_close(grads[1][name], plain, rtol=1e-4, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------
# 6 and 7. The buffer's dtype, CUDA graphs

def layer0_gradient_errors(n_layer, seed, G=2, hs=8, rows=128):
    """Relative error (norm) of layer 0's key/value gradient summed over n_layer - 1 static mixes
    in bf16, against float64: (the kernels' bf16 buffer: each layer's fp32 share added and the sum
    rounded once, the last layer's written first; autograd's sums in the plain mix: each share
    rounded (the matmul's bf16 output), then added in bf16). Emulated with torch's rounding to
    nearest, as a GPU rounds: Triton's interpreter truncates on a cast to bf16, so a CPU run of
    the kernels would overstate the error."""
    gen = torch.Generator().manual_seed(seed)
    shares = []  # layer l's share of source 0's gradient: R_l[:, :G]^T dout_l, exact
    for l in range(1, n_layer):
        R = (torch.rand(G, (l + 1) * G, generator=gen) * 2 - 1) * (3 / ((l + 1) * G)) ** 0.5
        R[:, -G:] += torch.eye(G)
        dout = torch.randn(rows, G, hs, generator=gen).bfloat16().double()
        shares.append(torch.einsum('gh,rgd->rhd', R[:, :G].bfloat16().double(), dout))
    exact = sum(shares)
    bf16 = lambda x: x.float().bfloat16().double()  # noqa: E731
    buffer = bf16(shares[-1])
    autograd = bf16(shares[-1])
    for share in reversed(shares[:-1]):  # backward: the last layer first
        buffer = bf16(buffer + share.float().double())
        autograd = bf16(autograd + bf16(share))
    error = lambda g: ((g - exact).norm() / exact.norm()).item()  # noqa: E731
    return error(buffer), error(autograd)


def test_the_bf16_gradient_buffer_rounds_no_worse_than_autograd_does_at_64_layers():
    # docs/performance.md states these numbers: ~0.7% at 64 layers, for both.
    for seed in range(3):
        buffer, autograd = layer0_gradient_errors(64, seed)
        assert buffer <= autograd < 0.01, (buffer, autograd)


def test_the_ops_are_marked_unsafe_for_cuda_graphs():
    for op in (torch.ops.lime.static_mix, torch.ops.lime.static_mix_backward,
               torch.ops.lime.dynamic_mix, torch.ops.lime.dynamic_mix_backward):
        assert torch.Tag.cudagraph_unsafe in op.default.tags, op


# ---------------------------------------------------------------------------------------------
# The self-check

@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_the_self_check_passes_on_the_kernels(dtype):
    assert fused.self_check(2, 8, dtype, 'cpu') is None


def wrong_forward(monkeypatch):
    """The static forward made to skip its last row."""
    launch = fused.static_forward_launch

    def short(R, sources, out):
        kernel, grid, args, meta = launch(R, sources, out)
        args = (*args[:3], args[3] - 1, *args[4:])  # n_rows - 1
        return kernel, grid, args, meta
    monkeypatch.setattr(fused, 'static_forward_launch', short)


def adds_twice(monkeypatch):
    """The dynamic backward made to add the sources' gradients twice."""
    real = fused.launch

    def launch(kernel, grid, args, meta):
        real(kernel, grid, args, meta)
        if kernel is fused.dynamic_mix_bwd_kernel and not meta['FIRST']:
            real(kernel, grid, args, meta)
    monkeypatch.setattr(fused, 'launch', launch)


@pytest.mark.parametrize('breakage, found', [(wrong_forward, "static mix .* output"),
                                             (adds_twice, "dynamic mix .* source 0's gradient")])
def test_a_wrong_kernel_fails_the_self_check_and_the_plain_mix_runs(breakage, found,
                                                                    monkeypatch, capsys):
    breakage(monkeypatch)
    why = fused.self_check(2, 8, torch.float32, 'cpu')
    assert why is not None and '\n' not in why
    assert __import__('re').search(found, why), why
    with pytest.raises(ValueError, match='^fused=True: the self-check'):
        kernels.choose(True, 'cpu', SHAPE)
    # Where fused=None would pick the kernels (a GPU of today, once they are the default there),
    # the same failure leaves the plain mix, with a note. The check itself runs on the CPU here.
    monkeypatch.setattr(kernels, 'FUSED_BY_DEFAULT_ON_CUDA', True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: (9, 0))
    check = fused.self_check
    monkeypatch.setattr(fused, 'self_check', lambda G, hs, dtype, device: check(G, hs, dtype, 'cpu'))
    capsys.readouterr()
    assert kernels.choose(None, 'cuda', SHAPE) is None
    note = capsys.readouterr().out
    assert note.startswith("note: LIMe's mix runs in plain PyTorch: the self-check"), note


# ---------------------------------------------------------------------------------------------
# The grid's programs in any order

@contextlib.contextmanager
def programs_in_order(order):
    """Under the interpreter, run the grid's programs along dimension 0 in the given order
    ('reversed' or 'shuffled') instead of 0, 1, 2, ..."""
    from triton.runtime import interpreter
    builder = interpreter.interpreter_builder
    set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
    perm = []

    def grid_dim(x, y, z):
        perm[:] = list(range(x))[::-1] if order == 'reversed' else random.Random(0).sample(
            range(x), x)
        set_dim(x, y, z)
    builder.set_grid_dim = grid_dim
    builder.set_grid_idx = lambda x, y, z: set_idx(perm[x], y, z)
    try:
        yield
    finally:
        builder.set_grid_dim, builder.set_grid_idx = set_dim, set_idx


@pytest.mark.skipif(not fused.INTERPRET, reason="reorders the interpreter's programs")
@pytest.mark.parametrize('order', ['reversed', 'shuffled'])
def test_programs_in_another_order_give_the_same_bits(order):
    x, y = batch()
    results = []
    for reorder in (contextlib.nullcontext(), programs_in_order(order)):
        model = tiny_model('static')
        model2 = tiny_model('dynamic')
        with mix(fused), reorder:
            _, loss = model(x, y)
            _, loss2 = model2(x, y)
            (loss + loss2).backward()
        results.append([loss, loss2] + [p.grad for p in model.parameters()]
                       + [p.grad for p in model2.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)
