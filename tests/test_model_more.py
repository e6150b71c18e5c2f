"""
Tests of the model beyond the properties test_lime.py pins: top-p pruning, generation past
block_size, config errors, the optimizer's groups, the FLOPs count, compiling, and checkpoints
(save, load, and a clear error for one that does not fit).

    python -m pytest -q tests/test_model_more.py
"""
import math
from dataclasses import asdict

import pytest
import torch

from lime import GPTConfig, StaticRouter, load_model, save_checkpoint, top_p_mask
from test_lime import ROUTERS, assert_close, tiny_model


def test_generation_goes_past_block_size_and_never_samples_padding():
    model = tiny_model(router='static')
    assert model.embed.weight.size(0) == 128  # 101 padded to a multiple of 64
    with torch.no_grad():
        model.embed.weight[101:] = 10.0  # padded rows that would win every sample if not cut off
    out = model.generate(torch.zeros(2, 3, dtype=torch.long), 3 * model.config.block_size)
    assert out.shape == (2, 3 + 3 * model.config.block_size)
    assert out.max().item() < 101


def test_top_p_mask_keeps_the_smallest_set_reaching_p():
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


def test_top_p_mask_breaks_ties_toward_the_lower_index_and_keeps_all_of_a_zero_row():
    assert top_p_mask(torch.ones(40), 0.5).nonzero().flatten().tolist() == list(range(20))
    assert top_p_mask(torch.tensor([0.1, 0.3, 0.3, 0.3]), 0.5).tolist() == [0.0, 1.0, 1.0, 0.0]
    # A dynamic router at init with top-p 0.95: its own layer (last) holds 85.5%, the rest tie.
    assert top_p_mask(torch.tensor([0.145 / 3] * 3 + [0.855]), 0.95).tolist() == [1, 1, 0, 1]
    assert torch.equal(top_p_mask(torch.zeros(2, 5), 0.5), torch.ones(2, 5))


def test_dynamic_top_p_renormalises_and_zeroes_the_rest():
    model = tiny_model(router='dynamic', n_layer=6, router_top_p=0.7)
    with torch.no_grad():
        for router in model.routers():
            router.proj.weight.normal_(0, 0.3)  # varied probabilities, token by token
    router = model.routers()[-1]
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
    too_low = r"router_top_p must be in \(0.53, 1\] for 'dynamic', got 0.5"
    with pytest.raises(ValueError, match=too_low):
        # Layer 1 has two sources, 0.9p and 1 - 0.9p at init: the second holds p alone when
        # p <= 1/1.9 (and at p <= 0.5 one of any two always does), hence the bound 0.53.
        GPTConfig(router='dynamic', router_top_p=0.5)


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


def test_bad_config_raises_a_clear_error():
    with pytest.raises(ValueError, match='router must be one of'):
        GPTConfig(router='statc')
    with pytest.raises(ValueError, match='multiple of n_kv_head'):
        GPTConfig(n_head=12, n_kv_head=5)
    with pytest.raises(ValueError, match='router_top_p'):
        GPTConfig(router_top_p=0.0)
    with pytest.raises(ValueError, match='router_init must be one of'):
        GPTConfig(router='static', router_init='zeros')
    with pytest.raises(ValueError, match="for the static router of memory='kv' only"):  # never silently ignored
        GPTConfig(router='dynamic', router_init='identity')


def test_optimizer_groups_follow_the_paper():
    model = tiny_model(router='static')
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, router_lr=1e-2)
    group_of = {p: g for g in opt.param_groups for p in g['params']}
    assert len(group_of) == len(list(model.parameters()))
    for name, p in model.named_parameters():
        g = group_of[p]
        is_router = isinstance(dict(model.named_modules())[name.rsplit('.', 1)[0]], StaticRouter)
        assert g['lr'] == (1e-2 if is_router else 1e-3), name
        assert g['weight_decay'] == (0.1 if p.dim() >= 2 and not is_router else 0.0), name
    dyn = tiny_model(router='dynamic')
    opt = dyn.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, router_lr=1e-2)
    group_of = {p: g for g in opt.param_groups for p in g['params']}
    router = dyn.routers()[0]
    assert (group_of[router.proj.weight]['lr'], group_of[router.proj.weight]['weight_decay']) == (1e-2, 0.1)
    assert (group_of[router.proj.bias]['lr'], group_of[router.proj.bias]['weight_decay']) == (1e-2, 0.0)


def test_flops_per_token_counts_routing():
    base, static = tiny_model(router='none'), tiny_model(router='static')
    L, D, T, hs = 4, 32, 32, 8
    n = base.num_params()
    assert base.flops_per_token() == 6 * n + 12 * L * D * T
    R = sum(r.weight.numel() for r in static.routers())
    assert static.flops_per_token() - base.flops_per_token() == 6 * 2 * hs * R
    assert math.isclose(static.estimate_mfu(1e6, peak_flops=1e12), static.flops_per_token() * 1e6 / 1e12)


@pytest.mark.parametrize('router', ROUTERS)
def test_compiles_as_one_graph_and_matches_eager(router):
    assert_compiles_as_one_graph(tiny_model(router=router, n_kv_head=2,
                                            router_top_p=0.9 if router != 'none' else 1.0))


@pytest.mark.parametrize('router, top_p', [('static', 0.9), ('dynamic', 1.0)])
def test_v1_compiles_as_one_graph_and_matches_eager(router, top_p):
    assert_compiles_as_one_graph(tiny_model(router=router, memory='hidden', n_kv_head=2,
                                            router_top_p=top_p))


def assert_compiles_as_one_graph(model):
    # fullgraph=True fails on any graph break; the aot_eager backend traces forward and backward
    # like inductor does, without the minutes of C++ compilation a CPU run of inductor costs.
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend='aot_eager')
    idx = torch.randint(0, 101, (2, 16))
    logits, loss = compiled(idx, idx)
    loss.backward()
    assert_close(logits, model(idx)[0], what='compiled and eager logits')
    assert all(p.grad is not None for p in model.parameters())


def test_compiled_model_takes_a_second_sequence_length():
    # After two lengths torch.compile makes T dynamic: nothing may then turn it into a Python bool.
    torch._dynamo.reset()
    model = tiny_model(router='static')
    compiled = torch.compile(model, fullgraph=True, backend='aot_eager')
    for T in (8, 12):
        idx = torch.randint(0, 101, (2, T))
        assert_close(compiled(idx)[0], model(idx)[0], what=f'compiled and eager logits at T={T}')


def test_a_checkpoint_loads_back_into_the_same_model(tmp_path):
    model = tiny_model(router='static', n_kv_head=2)
    save_checkpoint(tmp_path / 'ckpt.pt', model, step=3, best_val_loss=2.5)
    loaded, checkpoint = load_model(tmp_path / 'ckpt.pt', 'cpu')
    assert checkpoint['step'] == 3 and loaded.config == model.config
    idx = torch.randint(0, 101, (2, 20))
    assert_close(loaded(idx)[0], model(idx)[0], what='saved and loaded logits')


def test_a_checkpoint_of_another_shape_fails_with_one_line_naming_the_weight(tmp_path):
    model = tiny_model(router='dynamic')
    weights = model.state_dict()
    del weights['blocks.1.attn_norm.weight']
    torch.save({'model': weights, 'model_args': asdict(model.config), 'step': 1, 'best_val_loss': 3.0},
               tmp_path / 'ckpt.pt')
    with pytest.raises(ValueError, match=r'ckpt.pt: its model does not load .*blocks.1.attn_norm[^\n]*$'):
        load_model(tmp_path / 'ckpt.pt', 'cpu')


def test_a_cache_that_holds_a_prompt_refuses_several_new_tokens_at_once():
    # SDPA's causal mask is aligned to the first key: with tokens already cached, a block of new
    # queries would see the wrong keys, silently. One token at a time is what generate() feeds.
    from lime import KVCache
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
