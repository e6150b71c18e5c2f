"""
Tests for kernels/fused.py: its Triton kernels compute LIMe's mix exactly as lime.py's plain PyTorch does,
forward and every gradient, inside the model and under torch.compile, and save less for backward.
Without a GPU they run under Triton's interpreter (TRITON_INTERPRET=1, set before any kernel is
defined), which is slow: every shape here is tiny.

    python -m pytest -q tests/test_fused.py
"""
import contextlib
import copy
import importlib.util
import json
import os

import torch  # noqa: E402

# With a GPU the real kernels run; without one, Triton's interpreter (set before fused.py defines
# its kernels).
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

import pytest  # noqa: E402

import lime  # noqa: E402
from lime import GPT, GPTConfig, DynamicRouter, StaticRouter  # noqa: E402

pytest.importorskip('triton', reason="the fused kernels need triton (pip install triton)")
from kernels import fused as kernels  # noqa: E402


@contextlib.contextmanager
def mix(fused):
    """LIMe's mix in the fused kernels (fused=True) or in lime.py's plain PyTorch, for a while."""
    saved, lime.mix_kernels = lime.mix_kernels, kernels if fused else None
    try:
        yield
    finally:
        lime.mix_kernels = saved


def routers(router_class, fused_config, layer_idx):
    """The same router twice, with the same weights: plain mix and fused mix."""
    plain = router_class(GPTConfig(**fused_config), layer_idx)
    fused = router_class(GPTConfig(**fused_config), layer_idx)
    if router_class is StaticRouter:
        plain.reset_parameters()
    else:  # random, not the zero init, which would hide bugs in the probabilities' gradient
        torch.nn.init.normal_(plain.proj.weight, std=0.5)
        torch.nn.init.normal_(plain.proj.bias)
    fused.load_state_dict(plain.state_dict())
    return plain, fused


def run_mix(router, h, memory, grad, fused):
    """Output and the gradients of every source, every router parameter and h (which only the
    dynamic router reads), in float32."""
    h = h.detach().clone().requires_grad_()
    memory = [kv.detach().clone().requires_grad_() for kv in memory]
    with mix(fused):
        out = router(h, memory)
        out.backward(grad.to(out.dtype))
    grads = [*(kv.grad for kv in memory), *(p.grad for p in router.parameters())]
    assert all(g is not None for g in grads), "a source or a router weight got no gradient"
    if isinstance(router, DynamicRouter):
        grads.append(h.grad)
    return out.float(), [g.float() for g in grads]


# (n_kv_head G, head size, layer index l so S = l + 1 sources, T): G = 12 is not a power of two;
# G = 2 is GQA (8 query heads); hs = 6 is not a power of two; T = 3 and 7 leave partial tiles.
CASES = [(12, 8, 2, 3), (2, 6, 0, 7), (2, 16, 4, 5), (3, 4, 1, 7)]


@pytest.mark.parametrize('router_class', [StaticRouter, DynamicRouter])
@pytest.mark.parametrize('G,hs,layer,T', CASES)
@pytest.mark.parametrize('top_p', [1.0, 0.7])
def test_fused_mix_equals_plain_mix_forward_and_backward_in_float32(router_class, G, hs, layer, T, top_p):
    torch.manual_seed(G * 100 + layer * 10 + T)
    config = dict(n_layer=layer + 1, n_head=8 if G == 2 else G, n_kv_head=G, n_embd=(8 if G == 2 else G) * hs,
                  router_top_p=top_p)
    plain, fused = routers(router_class, config, layer)
    B = 2
    h = torch.randn(B, T, config['n_embd'])
    memory = [torch.randn(B, T, 2, G, hs) for _ in range(layer + 1)]
    grad = torch.randn(B, T, 2, G, hs)
    out_plain, grads_plain = run_mix(plain, h, memory, grad, fused=False)
    out_fused, grads_fused = run_mix(fused, h, memory, grad, fused=True)
    torch.testing.assert_close(out_fused, out_plain, rtol=1e-5, atol=1e-5)
    assert len(grads_fused) == len(grads_plain)
    for i, (a, b) in enumerate(zip(grads_fused, grads_plain)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"gradient {i} differs")


@pytest.mark.parametrize('router_class', [StaticRouter, DynamicRouter])
def test_fused_mix_in_bfloat16_matches_the_float32_mix_to_bfloat16_rounding(router_class):
    torch.manual_seed(1)
    G, hs, layer, T = 12, 8, 3, 5
    plain, fused = routers(router_class, dict(n_layer=4, n_head=G, n_embd=G * hs), layer)
    h = torch.randn(2, T, G * hs)
    memory = [torch.randn(2, T, 2, G, hs).bfloat16() for _ in range(layer + 1)]
    grad = torch.randn(2, T, 2, G, hs)
    # The reference: the plain mix in float32 from the same bfloat16-rounded inputs.
    out_ref, grads_ref = run_mix(plain, h, [kv.float() for kv in memory], grad.bfloat16().float(),
                                 fused=False)
    out_fused, grads_fused = run_mix(fused, h, memory, grad, fused=True)
    with mix(True):
        assert fused(h, memory).dtype == torch.bfloat16
    for a, b in zip([out_fused, *grads_fused], [out_ref, *grads_ref]):
        # bfloat16 keeps 8 bits of mantissa: outputs and source gradients are rounded once at the end.
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2 * b.abs().max().item())


@pytest.mark.parametrize('router', ['static', 'dynamic'])
@pytest.mark.parametrize('compiled', [False, True])
def test_fused_model_equals_plain_model_eager_and_compiled_to_one_graph(router, compiled):
    # Through the whole model the sources' gradients go through the shared buffer (gradient_buffer
    # in fused.py): every layer's keys/values, layer 0's included, must get all of theirs.
    torch.manual_seed(0)
    shape = dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=32, block_size=16, vocab_size=128, router=router,
                 router_top_p=0.9)
    plain = GPT(GPTConfig(**shape))
    with torch.no_grad():  # away from the init, where every token routes alike
        for p in (p for r in plain.routers() for p in r.parameters()):
            p.add_(torch.randn_like(p))
    fused = GPT(GPTConfig(**shape))
    fused.load_state_dict(plain.state_dict())  # one checkpoint format for both paths
    idx = torch.randint(0, 128, (2, 13))
    with mix(False):
        _, loss_plain = plain(idx, idx)
        loss_plain.backward()
    # fullgraph: one graph, each layer's mix a single custom-op node; aot_eager traces forward and
    # backward like inductor does, in seconds on a CPU.
    torch._dynamo.reset()
    model = torch.compile(fused, backend='aot_eager', fullgraph=True) if compiled else fused
    with mix(True):
        _, loss_fused = model(idx, idx)
        loss_fused.backward()
    torch.testing.assert_close(loss_fused, loss_plain, rtol=1e-6, atol=1e-6)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=f"{name}'s gradient differs")


def saved_bytes(model, idx):
    """Bytes the forward pass keeps for backward: every saved tensor's storage, counted once; and
    the bytes of the fused path's buffer for the memory's gradients (made in the forward pass)."""
    storages, memories = {}, []

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    hooks = [r.register_forward_hook(lambda r, args, out: memories.append(args[1])) for r in model.routers()]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx)
    for hook in hooks:
        hook.remove()
    buffers = {id(m.grad): m.grad for m in memories if getattr(m, 'grad', None) is not None}.values()
    return sum(storages.values()), sum(b.untyped_storage().nbytes() for b in buffers)


def test_fused_static_model_saves_at_most_8_percent_more_than_the_baseline():
    shape = dict(n_layer=6, n_head=6, n_embd=96, block_size=64, vocab_size=256)
    B, T = 2, 64
    idx = torch.randint(0, 256, (B, T))
    saved, grad_buffer = {}, {}
    for router, fused in [('none', False), ('static', False), ('static', True), ('dynamic', True)]:
        torch.manual_seed(0)
        with mix(fused):
            saved[router, fused], grad_buffer[router, fused] = saved_bytes(
                GPT(GPTConfig(**shape, router=router)), idx)
    base = saved['none', False]
    # The raw sources are kept alive by the memory anyway; the plain static mix also saves its
    # concatenated copy of the memory at every layer, which is what the fused op avoids.
    assert saved['static', False] / base > 1.08  # the plain mix's cost, so the test can fail
    assert saved['static', True] / base <= 1.08
    assert saved['dynamic', True] / base <= 1.08
    # The sources' gradients: one slot per layer in one buffer (what autograd would allocate at
    # the start of the backward pass anyway), not one tensor per (layer, source) pair.
    kv_bytes = B * T * 2 * shape['n_embd'] * 4
    assert grad_buffer['static', True] == grad_buffer['dynamic', True] == shape['n_layer'] * kv_bytes
    assert grad_buffer['static', False] == 0


def test_one_switch_chooses_the_mix_for_every_model(monkeypatch):
    monkeypatch.setattr(lime, 'mix_kernels', None)
    lime.use_fused_kernels(True, 'cpu')  # on a CPU, under Triton's interpreter
    assert lime.mix_kernels is kernels
    copy.deepcopy(GPT(GPTConfig(n_layer=3, n_head=4, n_embd=32, router='static')))  # no module inside
    lime.use_fused_kernels(False, 'cuda')
    assert lime.mix_kernels is None
    lime.use_fused_kernels(None, 'cpu')  # automatic: not the Triton kernels on a CPU
    assert lime.mix_kernels is not kernels


def test_fused_true_without_triton_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
    with pytest.raises(ValueError, match='need triton'):
        lime.use_fused_kernels(True, 'cpu')


def test_train_py_with_fused_kernels_logs_the_same_losses_as_the_plain_mix(tmp_path):
    # The whole path a user takes: --fused reaches the model through train.py's overrides, and a
    # run that switches paths on resume is still the same run (fused is not part of the model).
    import subprocess
    import sys

    import prepare
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = tmp_path / 'data'
    prepare.main(['--out_dir', str(data), '--workers', '1'])
    common = ['--device=cpu', '--n_layer=3', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=2',
              '--gradient_accumulation_steps=1', '--eval_iters=1', '--log_interval=1', '--warmup_iters=1',
              '--router=static', '--eval_interval=2', f'--data_dir={data}']
    losses = {}
    for name, args in [('plain', ['--fused=False', '--max_iters=3']), ('fused', ['--fused=True', '--max_iters=3']),
                       # the first 2 steps of a 3-step run: its schedule ends at 3 (a resume keeps it)
                       ('switched', ['--fused=True', '--max_iters=2', '--lr_decay_iters=3'])]:
        out = tmp_path / name
        cmd = [sys.executable, os.path.join(root, 'train.py'), *common, *args, f'--out_dir={out}']
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        if name == 'switched':  # resume the fused run with the plain mix for its last step
            cmd = [sys.executable, os.path.join(root, 'train.py'), '--init_from=resume', '--device=cpu',
                   '--max_iters=3', '--fused=False', f'--out_dir={out}']
            result = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=300)
            assert result.returncode == 0, result.stdout + result.stderr
        with open(out / 'log.txt') as f:
            records = [json.loads(line) for line in f]
        losses[name] = {(r['step'], 'val' if 'val_loss' in r else 'train'): r.get('val_loss', r.get('train_loss'))
                        for r in records if 'val_loss' in r or 'train_loss' in r}
    assert losses['plain'].keys() == losses['fused'].keys() == losses['switched'].keys()
    assert len(losses['plain']) >= 5
    for key, value in losses['plain'].items():
        assert losses['fused'][key] == pytest.approx(value, rel=1e-5), key
        assert losses['switched'][key] == pytest.approx(value, rel=1e-5), key


DDP_SCRIPT = '''
import sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path.insert(0, sys.argv[1])
import lime
dist.init_process_group('gloo')
rank = dist.get_rank()
shape = dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=256, block_size=16, vocab_size=128, router='static')
torch.manual_seed(0)
plain = lime.GPT(lime.GPTConfig(**shape))
fused = lime.GPT(lime.GPTConfig(**shape))
fused.load_state_dict(plain.state_dict())
idx = torch.randint(0, 128, (4, 13))
plain(idx, idx)[1].backward()  # the whole batch in one process, the plain mix
lime.use_fused_kernels(True, 'cpu')
# 1 MB buckets (~12 here): torch.compile splits the graph at each, as on a multi-GPU run.
model = torch.compile(DDP(fused, bucket_cap_mb=1), backend='aot_eager')
half = idx[2 * rank:2 * rank + 2]
model(half, half)[1].backward()
error = max((p.grad - q.grad).abs().max().item() for p, q in zip(plain.parameters(), fused.parameters()))
if rank == 0:
    print(f'max gradient difference {error:.3g}')
dist.barrier()
dist.destroy_process_group()
'''


def test_fused_mix_under_ddp_and_compile_split_at_gradient_buckets(tmp_path):
    # torchrun + torch.compile: DDP makes torch.compile split the graph at its gradient buckets, so
    # the gradients cannot go through one buffer shared by the pieces (see gradient_buffer).
    import subprocess
    import sys
    script = tmp_path / 'ddp_fused.py'
    script.write_text(DDP_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torchrun = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    result = subprocess.run([*torchrun, str(script), root], capture_output=True, text=True, timeout=300,
                            env={**os.environ, 'OMP_NUM_THREADS': '1', 'TRITON_INTERPRET': '1'})
    assert result.returncode == 0, result.stdout + result.stderr
    assert float(result.stdout.split('max gradient difference')[1]) < 1e-5, result.stdout
