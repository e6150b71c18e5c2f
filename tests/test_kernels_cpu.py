"""
Tests for kernels/cpu.py, the faster CPU code that lime.use_fused_kernels picks by default on a
CPU: each function gives lime.py's plain PyTorch's numbers, forward and gradients, and a model
trains to the same loss with it as without it.

    python -m pytest -q tests/test_kernels_cpu.py
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F

import lime
from kernels import cpu
from lime import GPT, GPTConfig, StaticRouter


@contextlib.contextmanager
def mix(module):
    saved, lime.mix_kernels = lime.mix_kernels, module
    try:
        yield
    finally:
        lime.mix_kernels = saved


def test_the_automatic_choice_on_a_cpu_is_this_module():
    with mix(None):
        lime.use_fused_kernels(None, 'cpu')
        assert lime.mix_kernels is cpu
        lime.use_fused_kernels(False, 'cpu')
        assert lime.mix_kernels is None


@pytest.mark.parametrize('layer, G', [(1, 1), (3, 2), (5, 4)])
def test_static_mix_equals_the_routers_plain_matmul(layer, G):
    torch.manual_seed(layer)
    router = StaticRouter(GPTConfig(n_layer=6, n_head=4, n_kv_head=G, n_embd=32), layer)
    router.reset_parameters()
    memory = [torch.randn(2, 5, 2, G, 8, requires_grad=True) for _ in range(layer + 1)]
    grad = torch.randn(2, 5, 2, G, 8)
    results = []
    for module in (None, cpu):
        router.zero_grad()
        for kv in memory:
            kv.grad = None
        with mix(module):
            out = router(None, memory)
        out.backward(grad)
        results.append([out, router.weight.grad, *(kv.grad for kv in memory)])
    for plain, fast in zip(*results):
        torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('ignored', [0, 3, 7])
def test_cross_entropy_equals_torchs_with_ignored_targets(ignored):
    torch.manual_seed(ignored)
    logits = torch.randn(150, 70, requires_grad=True)  # more than one 64-row piece
    targets = torch.randint(0, 70, (150,))
    targets[torch.randperm(150)[:ignored]] = -1
    losses, grads = [], []
    for loss_fn in (F.cross_entropy, cpu.cross_entropy):
        logits.grad = None
        loss = loss_fn(logits, targets, ignore_index=-1)
        (2.5 * loss).backward()  # an upstream gradient other than 1
        losses.append(loss)
        grads.append(logits.grad)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_a_model_trains_to_the_same_losses_with_and_without_it():
    """Five AdamW steps of a small static model: the same losses to float noise."""
    cfg = dict(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=100, router='static')
    data = torch.randint(0, 100, (4, 17), generator=torch.Generator().manual_seed(0))
    curves = []
    for module in (None, cpu):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**cfg))
        optimizer = model.configure_optimizers(0.1, 1e-2, 1e-1)
        curve = []
        with mix(module):
            for _ in range(5):
                _, loss = model(data[:, :-1], data[:, 1:])
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                curve.append(loss.item())
        curves.append(curve)
    assert curves[0] == pytest.approx(curves[1], rel=1e-5), curves
    assert curves[0][-1] < curves[0][0]
