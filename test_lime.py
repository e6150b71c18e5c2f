"""
Tests for lime.py: the model's specification. Each test pins one property that could break;
closeness checks print the largest difference when they fail. (tests/test_model_more.py
covers top-p, config errors, the optimizer groups, FLOPs, compiling and checkpoints.)

    python -m pytest -q
"""
import math

import pytest
import torch

import lime
from lime import GPT, GPTConfig

ROUTERS = ['none', 'static', 'dynamic']


def tiny_config(**overrides):
    args = dict(block_size=32, vocab_size=101, n_layer=4, n_head=4, n_embd=32)
    args.update(overrides)
    return GPTConfig(**args)


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(tiny_config(**overrides)).eval()


def assert_close(a, b, atol=1e-5, what='tensors'):
    diff = (a - b).abs().max().item()
    assert diff <= atol, f"{what} differ: max abs difference {diff:.3g} > {atol:.3g}"


def baseline_and_lime(router, **overrides):
    """A 'none' model and a LIMe model that shares all its weights."""
    base = tiny_model(router='none', **overrides)
    lime = tiny_model(seed=1, router=router, **overrides)
    missing, unexpected = lime.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and all('.router.' in name for name in missing)
    return base, lime


@pytest.mark.parametrize('n_kv_head', [4, 2])
def test_static_router_with_identity_weights_equals_baseline(n_kv_head):
    base, lime = baseline_and_lime('static', n_kv_head=n_kv_head)
    with torch.no_grad():
        for router in lime.routers():
            router.weight.zero_()
            router.weight[:, -n_kv_head:] = torch.eye(n_kv_head)  # read only its own layer
    idx = torch.randint(0, 101, (2, 20))
    assert_close(lime(idx)[0], base(idx)[0], what='static-identity and baseline logits')


def test_dynamic_router_forced_to_own_layer_equals_baseline():
    base, lime = baseline_and_lime('dynamic', n_kv_head=2)
    with torch.no_grad():
        for router in lime.routers():
            bias = router.proj.bias.view(router.n_kv_head, router.n_source)
            bias.zero_()
            bias[:, -1] = 1e4  # softmax puts exactly all the weight on the own layer
    idx = torch.randint(0, 101, (2, 20))
    assert_close(lime(idx)[0], base(idx)[0], what='dynamic-own-layer and baseline logits')


def test_lime_routers_change_the_output_at_init():
    # The converse of the two tests above: a router that reads other layers must matter,
    # otherwise the identity tests would pass for a router that is never applied.
    base, _ = baseline_and_lime('static')
    idx = torch.randint(0, 101, (2, 20))
    for router in ('static', 'dynamic'):
        _, lime = baseline_and_lime(router)
        diff = (lime(idx)[0] - base(idx)[0]).abs().max().item()
        assert diff > 1e-3, f"{router} router at init gives the baseline's logits (diff {diff:.3g})"


@pytest.mark.parametrize('router', ROUTERS)
def test_future_tokens_do_not_leak(router):
    model = tiny_model(router=router, n_kv_head=2)
    idx = torch.randint(0, 101, (2, 24))
    t = 11
    changed = idx.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 7) % 101
    before, after = model(idx)[0], model(changed)[0]
    assert_close(after[:, :t + 1], before[:, :t + 1], what=f'logits up to position {t}')
    assert (after[:, t + 1:] - before[:, t + 1:]).abs().max() > 1e-4, "later logits did not change"


def greedy_by_full_recompute(model, idx, steps):
    for _ in range(steps):
        logits, _ = model(idx)
        idx = torch.cat((idx, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    return idx


@pytest.mark.parametrize('router', ROUTERS)
@pytest.mark.parametrize('n_kv_head', [4, 1])
def test_cached_greedy_generation_equals_full_recompute(router, n_kv_head):
    model = tiny_model(router=router, n_kv_head=n_kv_head)
    prompt = torch.randint(0, 101, (3, 5))
    steps = model.config.block_size - prompt.size(1)  # fill the context exactly
    expected = greedy_by_full_recompute(model, prompt, steps)
    assert torch.equal(model.generate(prompt, steps, temperature=0), expected)
    assert torch.equal(model.generate(prompt, steps, top_k=1), expected)


@pytest.mark.parametrize('router', ['static', 'dynamic'])
def test_gradients_reach_routers_and_every_earlier_layers_kv(router):
    model = tiny_model(router=router, n_kv_head=2)
    last = model.routers()[-1]
    seen = {}
    last.register_forward_hook(lambda r, args, out: seen.update(memory=args[1], out=out))
    idx = torch.randint(0, 101, (2, 16))
    _, loss = model(idx, idx)
    # The last layer's routed keys/values depend directly on every layer's raw keys/values.
    grads = torch.autograd.grad(seen['out'].square().sum(), seen['memory'], retain_graph=True)
    for m, g in enumerate(grads):
        assert g.abs().sum() > 0, f"no gradient from the last router to layer {m}'s keys/values"
    loss.backward()
    for name, p in model.named_parameters():
        if '.router.' in name or 'kv_proj' in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"


@pytest.mark.parametrize('router', ['static', 'dynamic'])
@pytest.mark.parametrize('n_kv_head', [4, 2])
def test_parameter_overhead_matches_formula(router, n_kv_head):
    cfg = dict(n_layer=5, n_kv_head=n_kv_head)
    base = tiny_model(router='none', **cfg).num_params()
    extra = tiny_model(router=router, **cfg).num_params() - base
    L, G, D = 5, n_kv_head, 32
    sources = sum(l + 1 for l in range(1, L))  # layer l >= 1 reads layers 0..l
    expected = G * G * sources if router == 'static' else (D + 1) * G * sources  # R; or Wr and bias
    assert extra == expected


def test_static_router_init_matches_paper():
    model = tiny_model(router='static', n_layer=8, n_kv_head=4)
    for l, router in enumerate(model.routers(), start=1):
        R = router.weight.detach()
        assert R.shape == (4, 4 * (l + 1))
        assert torch.equal(R[:, -4:], torch.eye(4)), f"layer {l}: own block is not the identity"
        others = R[:, :-4]
        bound = math.sqrt(3 / (4 * (l + 1)))
        assert others.abs().max() <= bound, f"layer {l}: entry outside U(-{bound:.3f}, {bound:.3f})"
        assert others.std() > 0.3 * bound, f"layer {l}: off-diagonal blocks are not random"


def test_identity_start_is_the_baseline_exactly_and_every_router_weight_learns():
    # router_init='identity': the authors' noise zeroed. Routers are initialised last, so a
    # seed gives both models the same other weights: the same logits, to the bit.
    base = tiny_model(seed=3, router='none', n_kv_head=2)
    identity = tiny_model(seed=3, router='static', router_init='identity', n_kv_head=2)
    idx = torch.randint(0, 101, (2, 20))
    assert torch.equal(identity(idx)[0], base(idx)[0]), "the identity start is not the baseline"
    identity(idx, idx)[1].backward()
    for l, router in enumerate(identity.routers(), start=1):
        assert torch.equal(router.weight[:, :-2], torch.zeros(2, 2 * l)), f"layer {l}: noise"
        grad = router.weight.grad[:, :-2]  # the other layers' entries: zero, yet they learn
        assert (grad != 0).all(), f"layer {l}: a router weight gets no gradient"


def test_router_init_leaves_the_other_weights_of_a_seed_alone():
    noisy = tiny_model(seed=3, router='static')
    identity = tiny_model(seed=3, router='static', router_init='identity')
    for (name, a), b in zip(noisy.named_parameters(), identity.parameters()):
        if '.router.' not in name:
            assert torch.equal(a, b), f"{name} differs between the two starts"


def test_dynamic_router_starts_close_to_baseline():
    model = tiny_model(router='dynamic', n_kv_head=2)
    h = torch.randn(2, 16, model.config.n_embd)  # any input: the router's weights start at zero
    for l, router in enumerate(model.routers(), start=1):
        own = router.mix_weights(h)[..., -1]  # (B, T, G): the share of the layer's own keys/values
        assert_close(own, torch.full_like(own, 0.9), what=f'layer {l} own-layer weight')
