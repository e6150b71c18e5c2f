"""
Tests of the model beyond the properties test_lime.py pins: top-p pruning, generation past
block_size, config errors, the optimizer's groups, the FLOPs count, compiling (once per router
class, hyper-connections included) and the KV cache's one-token rule.

    python -m pytest -q tests/test_model_more.py
"""
import pytest
import torch

from lime import GPTConfig, KVCache, top_p_mask
from test_lime import assert_close, tiny_model


def test_generation_goes_past_block_size_and_never_samples_padding():
    model = tiny_model(router='static')
    assert model.embed.weight.size(0) == 128  # 101 padded to a multiple of 64
    with torch.no_grad():
        model.embed.weight[101:] = 10.0  # padded rows that would win every sample if not cut off
    out = model.generate(torch.zeros(2, 3, dtype=torch.long), 3 * model.config.block_size)
    assert out.shape == (2, 3 + 3 * model.config.block_size)
    assert out.max().item() < 101


def test_top_p_mask_keeps_the_smallest_set_reaching_p_and_breaks_ties_by_index():
    torch.manual_seed(0)
    weights = torch.rand(50, 9) ** 3  # skewed, so the kept sets vary in size
    assert torch.equal(top_p_mask(weights, 1.0), torch.ones_like(weights))
    for p in (0.3, 0.6, 0.9):
        mask = top_p_mask(weights, p)
        share = weights / weights.sum(-1, keepdim=True)
        kept = (share * mask).sum(-1)
        assert torch.all(kept >= p - 1e-6), f"p={p}: kept mass {kept.min():.3f} < p"
        # Minimal: dropping the smallest kept entry falls below p.
        smallest_kept = torch.where(mask > 0, share, torch.inf).min(-1).values
        assert torch.all(kept - smallest_kept < p), f"p={p}: kept set is not the smallest"
        assert torch.all(mask.sum(-1) >= 1)
    # Ties go to the lower index; a row of zeros keeps every entry.
    assert top_p_mask(torch.ones(40), 0.5).nonzero().flatten().tolist() == list(range(20))
    assert top_p_mask(torch.tensor([0.1, 0.3, 0.3, 0.3]), 0.5).tolist() == [0.0, 1.0, 1.0, 0.0]
    # A dynamic router at init with top-p 0.95: its own layer (last) holds 85.5%, the rest tie.
    assert top_p_mask(torch.tensor([0.145 / 3] * 3 + [0.855]), 0.95).tolist() == [1, 1, 0, 1]
    assert torch.equal(top_p_mask(torch.zeros(2, 5), 0.5), torch.ones(2, 5))


def test_dynamic_top_p_renormalises_and_zeroes_the_rest():
    router = tiny_model(router='dynamic', n_layer=6, router_top_p=0.7).routers()[-1]
    with torch.no_grad():
        router.proj.weight.normal_(0, 0.3)  # varied probabilities, token by token
    h = torch.randn(2, 10, 32)
    probs = router.mix_weights(h)
    unpruned = router.proj(h).view(2, 10, router.n_kv_head, -1).softmax(-1)
    kept = probs > 0
    assert_close(probs.sum(-1), torch.ones(2, 10, 4), what='pruned probability sums')
    assert torch.all((unpruned * kept).sum(-1) >= 0.7 - 1e-6)
    assert kept.sum() < kept.numel(), "nothing was pruned at p = 0.7"
    # Kept probabilities keep their ratios: they are the originals scaled by one factor per head.
    ratio = torch.where(kept, probs / unpruned, torch.nan)
    assert_close(ratio.nanmean(-1, keepdim=True).expand_as(ratio)[kept], ratio[kept], 1e-4,
                 what='scale factors within a head')


def test_dynamic_router_with_top_p_learns_from_its_first_step():
    # The init gives the own layer 90% of p, not 90%: at the paper's p = 0.9 a top-p set of the own
    # layer alone would be renormalised to a constant 1, and the router would never get a gradient.
    for p in (1.0, 0.9, 0.6):
        model = tiny_model(router='dynamic', n_layer=4, router_top_p=p)
        idx = torch.randint(0, 101, (2, 16))
        model(idx, idx)[1].backward()
        for router in model.routers():
            own = router.proj(torch.randn(1, 32)).view(router.n_kv_head, -1).softmax(-1)[:, -1]
            assert_close(own, torch.full_like(own, 0.9 * p), 1e-5, what=f'own share at p = {p}')
            assert router.proj.weight.grad.abs().max() > 0, f"no gradient at p = {p}"


def test_static_top_p_zeroes_weights_and_gradients_outside_the_kept_set():
    model = tiny_model(router='static', n_layer=6, router_top_p=0.5)
    router = model.routers()[-1]
    R, used = router.weight, router.mix_weights()
    kept = used != 0
    assert kept.sum() < kept.numel(), "nothing was pruned at p = 0.5"
    assert torch.equal(used[kept], R[kept]), "static weights must be zeroed, not rescaled"
    assert torch.all((R.abs() * kept).sum(-1) >= 0.5 * R.abs().sum(-1))
    idx = torch.randint(0, 101, (2, 16))
    model(idx, idx)[1].backward()
    assert torch.all(R.grad[~kept] == 0) and R.grad[kept].abs().min() > 0


@pytest.mark.parametrize('settings, message', [
    (dict(router='statc'), 'router must be one of'),
    (dict(n_head=12, n_kv_head=5), 'multiple of n_kv_head'),
    (dict(router_top_p=0.0), 'router_top_p'),
    (dict(router='static', router_init='zeros'), 'router_init must be one of'),
    (dict(hyper_connections=-1), 'hyper_connections'),
    # Layer 1 has two sources, 0.9p and 1 - 0.9p at init: the second holds p alone when
    # p <= 1/1.9 (and at p <= 0.5 one of any two always does), hence the bound 0.53.
    (dict(router='dynamic', router_top_p=0.5), r"must be in \(0.53, 1\] for 'dynamic', got 0.5"),
])
def test_bad_config_raises_a_clear_error(settings, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**settings)


@pytest.mark.parametrize('router', ['static', 'dynamic'])
def test_optimizer_groups_follow_the_paper_and_the_hc_authors(router):
    # (lr, weight decay): matrices decay and vectors do not; routers train at router_lr, and the
    # static R and HC's static weights do not decay.
    model = tiny_model(router=router, hyper_connections=4)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, router_lr=1e-2)
    group_of = {p: (g['lr'], g['weight_decay']) for g in opt.param_groups for p in g['params']}
    assert len(group_of) == len(list(model.parameters()))
    undecayed = {p for r in model.routers() if router == 'static' for p in r.parameters()}
    undecayed |= {p for c in model.hyper_connections() for p in (c.static_alpha, c.static_beta)}
    routers = {p for r in model.routers() for p in r.parameters()}
    for name, p in model.named_parameters():
        decay = 0.1 if p.dim() >= 2 and p not in undecayed else 0.0
        assert group_of[p] == (1e-2 if p in routers else 1e-3, decay), name


def test_flops_per_token_counts_routing():
    base, static = tiny_model(router='none'), tiny_model(router='static')
    L, D, T, hs = 4, 32, 32, 8
    assert base.flops_per_token() == 6 * base.num_params() + 12 * L * D * T
    R = sum(r.weight.numel() for r in static.routers())
    assert static.flops_per_token() - base.flops_per_token() == 6 * 2 * hs * R
    assert static.estimate_mfu(1e6, peak_flops=1e12) == pytest.approx(static.flops_per_token() / 1e6)


@pytest.mark.parametrize('settings', [
    dict(router='static', router_top_p=0.9), dict(router='dynamic', router_top_p=0.9),
    dict(router='static', memory='hidden', router_top_p=0.9), dict(router='dynamic', memory='hidden'),
    dict(router='none', hyper_connections=4),
], ids=['static', 'dynamic', 'static-v1', 'dynamic-v1', 'hc'])
def test_compiles_as_one_graph_and_matches_eager(settings):
    # fullgraph=True fails on any graph break; the aot_eager backend traces forward and backward
    # like inductor does, without the minutes of C++ compilation a CPU run of inductor costs.
    model = tiny_model(n_kv_head=2, **settings).train()
    with torch.no_grad():  # weights away from their start, where HC's dynamic part is zero
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    torch._dynamo.reset()
    idx = torch.randint(0, 101, (2, 16))
    outputs = []  # the logits, then every parameter's gradient
    for forward in (torch.compile(model, fullgraph=True, backend='aot_eager'), model):
        model.zero_grad()
        logits, loss = forward(idx, idx)
        loss.backward()
        outputs.append([logits, *(p.grad.clone() for p in model.parameters())])
    names = ['logits', *(name for name, _ in model.named_parameters())]
    for name, compiled, eager in zip(names, *outputs):
        assert_close(compiled, eager, what=f'compiled and eager {name}')


def test_a_cache_that_holds_a_prompt_refuses_several_new_tokens_at_once():
    # SDPA's causal mask is aligned to the first key: with tokens already cached, a block of new
    # queries would see the wrong keys, silently. One token at a time is what generate() feeds.
    model = tiny_model(router='static').eval()
    idx = torch.randint(0, model.config.vocab_size, (1, 6))
    cache = KVCache(model.config.n_layer, model.config.block_size)
    with torch.no_grad():
        full, _ = model(idx)
        model(idx[:, :4], cache=cache)
        with pytest.raises(ValueError, match='one new token at a time'):
            model(idx[:, 4:], cache=cache)
        step, _ = model(idx[:, 4:5], cache=cache)
    assert_close(step[:, -1], full[:, 4])
