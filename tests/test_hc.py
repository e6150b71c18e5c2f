"""
Tests for hyper-connections (HC, arXiv 2409.19606, baselines/hyper_connections.py): the paper's
other baseline. Each test pins one property that could break.

    python -m pytest -q tests/test_hc.py
"""
import pytest
import torch

from baselines.hyper_connections import HyperConnection
from conftest import BYTES, TINY, run
from lab import analyze
from lime import GPTConfig
from test_lime import assert_close, greedy_by_full_recompute, tiny_model

VARIANTS = [dict(hc_dynamic=True), dict(hc_dynamic=False)]  # dynamic (the default) and static HC


def trained_looking(model):
    """Non-trivial HC weights, so that streams, tokens and the dynamic part all differ."""
    torch.manual_seed(2)
    with torch.no_grad():
        for hc in model.hyper_connections():
            hc.static_alpha.add_(0.2 * torch.randn_like(hc.static_alpha))
            hc.static_beta.add_(0.2 * torch.randn_like(hc.static_beta))
            if hc.proj is not None:
                hc.proj.weight.normal_(0, 0.5)
                hc.alpha_scale.fill_(0.3)
    return model


@pytest.mark.parametrize('router', ['none', 'static', 'dynamic'])
@pytest.mark.parametrize('hc', VARIANTS)
def test_hc_starts_as_the_model_without_it_and_its_weights_then_count(router, hc):
    # The paper's init: A_m = e_k, A_r = I, B = 1, W = 0: every stream is the plain residual.
    base = tiny_model(router=router)
    model = tiny_model(seed=1, router=router, hyper_connections=4, **hc)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and missing and all('.hc_' in name for name in missing)
    for k, c in enumerate(model.hyper_connections()):  # sub-layers in order: attn, mlp, ...
        assert torch.equal(c.static_alpha[:, 0], torch.eye(4)[k % 4]), f"sub-layer {k}'s stream"
        assert torch.equal(c.static_alpha[:, 1:], torch.eye(4))
        assert torch.equal(c.static_beta, torch.ones(4))
        assert c.proj is None or c.alpha_scale == c.beta_scale == torch.tensor(0.01)
    idx = torch.randint(0, 101, (2, 20))
    assert_close(model(idx)[0], base(idx)[0], atol=1e-6, what='HC-at-init and baseline logits')
    # the converse: HC's weights are applied, or unused ones would pass the above
    assert (trained_looking(model)(idx)[0] - base(idx)[0]).abs().max() > 1e-3


@pytest.mark.parametrize('router', ['none', 'dynamic'])
def test_hc_future_tokens_do_not_leak(router):
    model = trained_looking(tiny_model(router=router, hyper_connections=4))
    idx = torch.randint(0, 101, (2, 24))
    changed = idx.clone()
    changed[:, 12:] = (changed[:, 12:] + 7) % 101
    before, after = model(idx)[0], model(changed)[0]
    assert_close(after[:, :12], before[:, :12], what='logits up to position 11')
    assert (after[:, 12:] - before[:, 12:]).abs().max() > 1e-4, "later logits did not change"


@pytest.mark.parametrize('hc', VARIANTS)
def test_hc_cached_greedy_generation_equals_full_recompute(hc):
    model = trained_looking(tiny_model(router='static', n_kv_head=2, hyper_connections=4, **hc))
    prompt = torch.randint(0, 101, (3, 5))
    steps = 12  # the streams are per position: nothing about HC depends on filling the context
    assert torch.equal(model.generate(prompt, steps, temperature=0),
                       greedy_by_full_recompute(model, prompt, steps))


@pytest.mark.parametrize('hc', VARIANTS)
@pytest.mark.parametrize('n', [4, 2])
def test_hc_parameters_and_flops_match_their_formulas(hc, n):
    base, model = tiny_model(), tiny_model(hyper_connections=n, **hc)
    D, sublayers = 32, 2 * 4
    per_sublayer = n * (n + 1) + n  # [A_m | A_r] and B
    if hc['hc_dynamic']:
        per_sublayer += D * (n + 2) + 2  # W = [W_m | W_r | W_b] and the scales s_a, s_b
    assert model.num_params() - base.num_params() == sublayers * per_sublayer
    # per sub-layer and token, n (n + 1) + n multiply-adds per channel (twice that if dynamic)
    mixing = (n * (n + 1) + n) * (2 if hc['hc_dynamic'] else 1)
    assert model.flops_per_token() - base.flops_per_token() == 6 * D * mixing * sublayers
    # The HC authors' figure: ~24.6K per layer (two sub-layers) at D 2048, n 4, dynamic.
    one = HyperConnection(GPTConfig(n_embd=2048, n_head=16, hyper_connections=4), 0)
    assert 2 * sum(p.numel() for p in one.parameters()) == 24628


def test_every_hc_weight_learns():
    # At init W = 0, so s_a and s_b get no gradient (tanh(0 W) = 0): train-looking weights first.
    model = trained_looking(tiny_model(router='static', hyper_connections=4)).train()
    idx = torch.randint(0, 101, (2, 16))
    model(idx, idx)[1].backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    # And from the init itself, the paper's A_m, A_r, B and W all learn.
    model = tiny_model(router='static', hyper_connections=4).train()
    model(idx, idx)[1].backward()
    for hc in model.hyper_connections():
        for p in (hc.static_alpha, hc.static_beta, hc.proj.weight):
            assert p.grad.abs().sum() > 0


def test_train_sample_and_analyze_take_an_hc_model(bytes_dir, tmp_path, capsys):
    out = tmp_path / 'hc'
    run('train.py', *TINY, BYTES, f'--data_dir={bytes_dir}', f'--out_dir={out}', '--router=none',
        '--hyper_connections=4', '--max_iters=2', '--eval_interval=2')
    checkpoint = torch.load(out / 'ckpt.pt', weights_only=True)
    assert checkpoint['model_args']['hyper_connections'] == 4 and checkpoint['model_args']['hc_dynamic']
    result = run('sample.py', f'--out_dir={out}', '--start=The list', '--num_samples=1',
                 '--max_new_tokens=8', '--device=cpu')
    assert result.stdout.startswith('The list'), result.stdout
    analyze.main([f'--out_dirs={out}', f'--data_dir={bytes_dir}', '--device=cpu', '--batch_size=2',
                  f'--fig_dir={tmp_path / "figs"}'])
    assert 'matrix entropy' in capsys.readouterr().out
