"""
Tests for lime.py: the model's specification. Each test pins one property that could break;
closeness checks print the largest difference when they fail. (tests/test_model_more.py
covers top-p, config errors, the optimizer groups, FLOPs and compiling.)

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


def loss_and_last_router_grads(model, idx=None):
    """(the training loss on idx, the gradient of the last router's output with respect to each
    memory entry it read), one forward pass; the loss's graph is kept for a backward after."""
    idx = torch.randint(0, 101, (2, 16)) if idx is None else idx
    seen = {}
    hook = model.routers()[-1].register_forward_hook(
        lambda r, args, out: seen.update(memory=args[1], out=out))
    _, loss = model(idx, idx)
    hook.remove()
    grads = torch.autograd.grad(seen['out'].square().sum(), seen['memory'], retain_graph=True)
    return loss, grads


@pytest.mark.parametrize('router', ['static', 'dynamic'])
def test_gradients_reach_routers_and_every_earlier_layers_kv(router):
    model = tiny_model(router=router, n_kv_head=2)
    # The last layer's routed keys/values depend directly on every layer's raw keys/values.
    loss, grads = loss_and_last_router_grads(model)
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


# -----------------------------------------------------------------------------
# Paper v1: routers over the hidden states (memory='hidden')
V1 = [('static', 1.0), ('static', 0.7), ('dynamic', 1.0)]  # (router, router_top_p)


def v1_model(router, top_p=1.0, seed=0, **overrides):
    """A v1 model with every norm gain random: at init all are ones, and a norm applied where
    another belongs would not show."""
    model = tiny_model(seed=seed, router=router, memory='hidden', router_top_p=top_p, **overrides)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('norm.weight'):
                p.uniform_(0.5, 1.5)
    return model


def v1_by_the_formula(model, idx):
    """The v1 model's logits, written out head by head from its weights: layer l's input x_l is
    memory entry l; kv head g mixes RMSNorm_l(x_0..x_l) with its softmax (or its top-p share),
    and its keys and values are that mix times W_g."""
    cfg = model.config
    G, hs = cfg.n_kv_head, cfg.n_embd // cfg.n_head
    x = model.embed(idx)
    states = []
    for l, block in enumerate(model.blocks):
        states.append(x)
        h = block.attn_norm(x)
        attn = block.attn
        if l == 0:
            k, v = attn.kv_proj(h).view(*h.shape[:2], 2, G, hs).unbind(2)
        else:
            r = attn.router
            normed = [r.norm(s) for s in states]
            if isinstance(r, lime.HiddenStaticRouter):
                weights = r.mix_weights()  # (G, S): its softmax and top-p have their own tests
                weights = weights[None, None].expand(*h.shape[:2], G, l + 1)
            else:
                weights = (normed[-1] @ r.proj.weight.t()).view(*h.shape[:2], G, l + 1).softmax(-1)
            ks, vs = [], []
            for g in range(G):
                m = sum(weights[..., g, s, None] * normed[s] for s in range(l + 1))  # (B, T, D)
                ks.append(m @ r.kv_weight[g, :, :hs])
                vs.append(m @ r.kv_weight[g, :, hs:])
            k, v = torch.stack(ks, dim=2), torch.stack(vs, dim=2)  # (B, T, G, hs)
        q = attn.q_proj(h).view(*h.shape[:2], cfg.n_head, hs)
        q, k = model.rotary(q), model.rotary(k)
        k = k.repeat_interleave(cfg.n_head // G, dim=2)
        v = v.repeat_interleave(cfg.n_head // G, dim=2)
        y = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + attn.o_proj(y.transpose(1, 2).flatten(2))
        x = x + block.mlp(block.mlp_norm(x))
    return model.lm_head(model.final_norm(x))[..., :cfg.vocab_size]


@pytest.mark.parametrize('router, top_p', V1)
@pytest.mark.parametrize('n_kv_head', [4, 2])
def test_v1_model_equals_its_per_head_formula(router, top_p, n_kv_head):
    model = v1_model(router, top_p, n_kv_head=n_kv_head)
    if router == 'dynamic':
        for r in model.routers():
            torch.nn.init.normal_(r.proj.weight, std=0.5)  # a routing that varies by token
    idx = torch.randint(0, 101, (2, 20))
    assert_close(model(idx)[0], v1_by_the_formula(model, idx), atol=2e-5, what='v1 logits')


@pytest.mark.parametrize('router', ['static', 'dynamic'])
def test_v1_routed_to_the_own_layer_with_the_baselines_kv_weights_is_the_baseline(router):
    base = tiny_model(router='none', n_kv_head=2)
    model = v1_model(router, n_kv_head=2)
    model.load_state_dict(base.state_dict(), strict=False)  # all but the routers' weights
    G, hs = 2, 8
    with torch.no_grad():
        for block in model.blocks[1:]:
            r = block.attn.router
            own = block.attn_norm.weight  # the baseline norms x_l with the layer's input norm
            r.norm.weight.copy_(own)
            k, v = base.blocks[block.attn.layer_idx].attn.kv_proj.weight.view(2, G, hs, -1)
            r.kv_weight.copy_(torch.cat([k.transpose(1, 2), v.transpose(1, 2)], dim=-1))
            if router == 'static':
                r.weight.fill_(float('-inf'))
                r.weight[:, -1] = 0.0  # the softmax: all on the own layer
            else:  # every token's softmax on the own layer
                r.mix_weights = lambda x, r=r: torch.eye(r.n_source)[-1].expand(
                    *x.shape[:2], r.n_kv_head, r.n_source)
    idx = torch.randint(0, 101, (2, 20))
    assert_close(model(idx)[0], base(idx)[0], what='v1 own-layer and baseline logits')


@pytest.mark.parametrize('router, top_p', V1)
def test_v1_future_tokens_do_not_leak_and_the_cache_equals_recomputation(router, top_p):
    model = v1_model(router, top_p, n_kv_head=2)
    idx = torch.randint(0, 101, (2, 24))
    changed = idx.clone()
    changed[:, 12:] = (changed[:, 12:] + 7) % 101
    assert_close(model(changed)[0][:, :12], model(idx)[0][:, :12], what='logits before 12')
    prompt = idx[:, :5]
    steps = model.config.block_size - 5
    assert torch.equal(model.generate(prompt, steps, temperature=0),
                       greedy_by_full_recompute(model, prompt, steps))


@pytest.mark.parametrize('router, top_p', V1)
def test_v1_every_source_and_parameter_gets_a_gradient_and_top_p_trains(router, top_p):
    model = v1_model(router, top_p, n_kv_head=2).train()
    idx = torch.randint(0, 101, (2, 16))
    loss, grads = loss_and_last_router_grads(model, idx)
    last = model.routers()[-1]
    kept = last.mix_weights().sum(0) > 0 if top_p < 1 else [True] * len(grads)  # top-p prunes
    for m, (g, read) in enumerate(zip(grads, kept)):
        assert (g.abs().sum() > 0) == read, f"layer {m}'s state: {'no' if read else 'a'} gradient"
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    # Past one step (the authors' top-p mask kept the graph of its first forward): three steps
    optimizer = model.configure_optimizers(0.0, 1e-2, 1e-1)
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        _, loss = model(idx, idx)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_v1_parameters_flops_and_optimizer_groups():
    L, G, D = 5, 2, 32
    base = tiny_model(router='none', n_layer=L, n_kv_head=G)
    sources = sum(l + 1 for l in range(1, L))
    for router, per_source in (('static', G), ('dynamic', D * G)):
        model = tiny_model(router=router, memory='hidden', n_layer=L, n_kv_head=G)
        # per routed layer an extra norm; its K/V projections replace the layer's own
        assert model.num_params() - base.num_params() == (L - 1) * D + per_source * sources
        mixing = 6 * D * G * sources  # a multiply-add per kv head, source and channel of D
        logits = G * sources if router == 'static' else 0  # weights that are no matmul's
        assert model.flops_per_token() - base.flops_per_token() == \
            6 * (model.num_params() - base.num_params() - logits) + mixing
        groups = model.configure_optimizers(0.1, 1e-3, 1e-2).param_groups
        group_of = {p: (g['lr'], g['weight_decay']) for g in groups for p in g['params']}
        for r in model.routers():
            assert group_of[r.kv_weight] == (1e-3, 0.1) and group_of[r.norm.weight] == (1e-3, 0.0)
            routing = r.weight if router == 'static' else r.proj.weight
            assert group_of[routing] == (1e-2, 0.0 if router == 'static' else 0.1)


@pytest.mark.parametrize('settings, message', [
    (dict(router='none'), "give router='static' or 'dynamic' with it"),
    (dict(router='dynamic', router_top_p=0.9), "v1 dynamic router has no top-p"),
    (dict(router='static', router_init='identity'), "of memory='kv' only"),
    (dict(router='static', hyper_connections=2), "hyper_connections with memory='hidden'"),
    (dict(router='static', memory='states'), "memory must be one of"),
])
def test_v1_settings_it_does_not_have_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{'memory': 'hidden', **settings})
