"""
Tests for hyper-connections (HC, arXiv 2409.19606, baselines/hyper_connections.py): the paper's
other baseline. Each test pins one property that could break.

    python -m pytest -q tests/test_hc.py
"""
import pytest
import torch

from baselines.hyper_connections import HyperConnection
from lab import analyze
from lime import GPTConfig
from test_lime import assert_close, greedy_by_full_recompute, tiny_model
from test_model_more import assert_compiles_as_one_graph
from test_train import data_dir, read_log, run, train  # noqa: F401  data_dir is a fixture

VARIANTS = [dict(hc_dynamic=True), dict(hc_dynamic=False)]  # dynamic (the default) and static HC


def baseline_and_hc(router='none', **hc):
    """A model without HC and an HC model that shares all its weights (HC's own aside)."""
    base = tiny_model(router=router)
    model = tiny_model(seed=1, router=router, hyper_connections=4, **hc)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and missing and all('.hc_' in name for name in missing)
    return base, model


@pytest.mark.parametrize('router', ['none', 'static', 'dynamic'])
@pytest.mark.parametrize('hc', VARIANTS)
def test_hc_at_init_equals_the_model_without_it(router, hc):
    # A_m = e_k, A_r = I, B = 1, W = 0: every stream is the plain residual, and their mean is too.
    base, model = baseline_and_hc(router, **hc)
    idx = torch.randint(0, 101, (2, 20))
    assert_close(model(idx)[0], base(idx)[0], atol=1e-6, what='HC-at-init and baseline logits')


def test_trained_hc_weights_change_the_output():
    # The converse: HC weights must be applied, or the test above would pass for unused ones.
    base, model = baseline_and_hc()
    with torch.no_grad():
        for hc in model.hyper_connections():
            hc.proj.weight.normal_(0, 0.5)
            hc.static_alpha.add_(0.1 * torch.randn_like(hc.static_alpha))
    idx = torch.randint(0, 101, (2, 20))
    assert (model(idx)[0] - base(idx)[0]).abs().max() > 1e-3


def test_hc_init_follows_the_paper():
    model = tiny_model(hyper_connections=3)
    for k, hc in enumerate(model.hyper_connections()):  # sub-layers in order: attn, mlp, attn, ...
        A_m, A_r = hc.static_alpha[:, 0], hc.static_alpha[:, 1:]
        assert torch.equal(A_m, torch.eye(3)[k % 3]), f"sub-layer {k} does not read stream {k % 3}"
        assert torch.equal(A_r, torch.eye(3)) and torch.equal(hc.static_beta, torch.ones(3))
        assert torch.all(hc.proj.weight == 0)
        assert hc.alpha_scale == hc.beta_scale == torch.tensor(0.01)


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
def test_hc_parameter_overhead_matches_formula(hc, n):
    extra = tiny_model(hyper_connections=n, **hc).num_params() - tiny_model().num_params()
    D, sublayers = 32, 2 * 4
    per_sublayer = n * (n + 1) + n  # [A_m | A_r] and B
    if hc['hc_dynamic']:
        per_sublayer += D * (n + 2) + 2  # W = [W_m | W_r | W_b] and the scales s_a, s_b
    assert extra == sublayers * per_sublayer
    # The HC authors' figure: ~24.6K per layer (two sub-layers) at D 2048, n 4, dynamic.
    one = HyperConnection(GPTConfig(n_embd=2048, n_head=16, hyper_connections=4), 0)
    assert 2 * sum(p.numel() for p in one.parameters()) == 24628


def test_gradients_reach_every_hc_weight():
    # At init W = 0, so s_a and s_b get no gradient (tanh(0 W) = 0): train-looking weights first.
    model = trained_looking(tiny_model(hyper_connections=4)).train()
    idx = torch.randint(0, 101, (2, 16))
    model(idx, idx)[1].backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    # And from the init itself, the paper's A_m, A_r, B and W all learn.
    model = tiny_model(hyper_connections=4).train()
    model(idx, idx)[1].backward()
    for hc in model.hyper_connections():
        for p in (hc.static_alpha, hc.static_beta, hc.proj.weight):
            assert p.grad.abs().sum() > 0


def test_hc_optimizer_groups_follow_the_authors():
    model = tiny_model(router='static', hyper_connections=4)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, router_lr=1e-2)
    group_of = {p: g for g in opt.param_groups for p in g['params']}
    assert len(group_of) == len(list(model.parameters()))
    for hc in model.hyper_connections():
        for p in (hc.static_alpha, hc.static_beta, hc.alpha_scale, hc.beta_scale):
            assert (group_of[p]['lr'], group_of[p]['weight_decay']) == (1e-3, 0.0)
        assert (group_of[hc.proj.weight]['lr'], group_of[hc.proj.weight]['weight_decay']) == (1e-3, 0.1)


def test_hc_flops_count_the_stream_mixing():
    base, model = tiny_model(), tiny_model(hyper_connections=4, hc_dynamic=False)
    # Static: per sub-layer and token, n (n + 1) + n multiply-adds per channel, 6 FLOPs each.
    assert model.flops_per_token() - base.flops_per_token() == 6 * 32 * 24 * 8
    dyn = tiny_model(hyper_connections=4)
    assert dyn.flops_per_token() - base.flops_per_token() == 6 * 32 * 48 * 8


@pytest.mark.parametrize('router', ['none', 'static'])
def test_hc_compiles_as_one_graph_and_matches_eager(router):
    assert_compiles_as_one_graph(trained_looking(tiny_model(router=router, n_kv_head=2, hyper_connections=4)))


def test_bad_hc_config_raises_a_clear_error():
    with pytest.raises(ValueError, match='hyper_connections'):
        GPTConfig(hyper_connections=-1)


def test_train_sample_and_analyze_take_an_hc_model(data_dir, tmp_path, capsys):
    out = tmp_path / 'hc'
    train(data_dir, out, '--router=none', '--hyper_connections=4', '--max_iters=10', '--eval_interval=10')
    _, val_loss = read_log(out)
    assert val_loss[10] < val_loss[0] - 0.1, val_loss  # it learns; test_train.py checks how well
    checkpoint = torch.load(out / 'ckpt.pt', weights_only=True)
    assert checkpoint['model_args']['hyper_connections'] == 4 and checkpoint['model_args']['hc_dynamic']
    result = run('sample.py', f'--out_dir={out}', '--start=The list', '--num_samples=1', '--max_new_tokens=8',
                 '--device=cpu')
    assert result.stdout.startswith('The list'), result.stdout
    analyze.main([f'--out_dirs={out}', f'--data_dir={data_dir}', '--device=cpu', '--batch_size=2',
                  f'--fig_dir={tmp_path / "figs"}'])
    assert 'matrix entropy' in capsys.readouterr().out
    # A checkpoint from before HC (no such fields) still loads, as the model without it.
    for key in ('hyper_connections', 'hc_dynamic'):
        del checkpoint['model_args'][key], checkpoint['config'][key]
    checkpoint['model'] = {k: v for k, v in checkpoint['model'].items() if '.hc_' not in k}
    old = tmp_path / 'old'
    old.mkdir()
    torch.save(checkpoint, old / 'ckpt.pt')
    assert run('sample.py', f'--out_dir={old}', '--num_samples=1', '--max_new_tokens=4', '--device=cpu')
    # Resuming it with HC asked for contradicts the model it holds (made before HC, so without it).
    result = run('train.py', f'--out_dir={old}', '--init_from=resume', '--device=cpu', '--hyper_connections=4',
                 check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert "--hyper_connections=4 would make another run than the checkpoint's " \
        "(hyper_connections=0)" in result.stderr, result.stderr


def test_bench_times_hc_rows_beside_the_baseline():
    result = run('lab/bench.py', '--device=cpu', '--steps=2', '--warmup=1', '--routers=static-hc,hc,none')
    rows = [[c.strip() for c in line.split('|')[1:-1]] for line in result.stdout.splitlines()
            if line.startswith('| tiny ')]
    assert [row[1] for row in rows] == ['none', 'static-hc', 'hc'], result.stdout
    assert all(float(row[5]) > 0 for row in rows)
    assert 'hc-plain' in run('lab/bench.py', '--device=cpu', '--routers=hc-plain', check=False).stderr
