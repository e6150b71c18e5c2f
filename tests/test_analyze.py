"""
Tests for lab/analyze.py: its computations on hand-built inputs and small models, its tables on the
shared trained checkpoints, and the probe and figures end to end on checkpoints of GPT-2's vocabulary.
"""
import math
import os

import numpy as np
import pytest
import torch

import prepare
from lab import analyze
from lab.analyze import (layer_features, matrix_entropy, probe_accuracy, render_routing, retrieval_by_source,
                         routing_weights)
from lime import GPT, GPTConfig, save_checkpoint

def random_tokens(T, d, rank=None, seed=0):
    """T token vectors of width d, Gaussian, spanning `rank` directions (all of them by default)."""
    g = torch.Generator().manual_seed(seed)
    if rank is None:
        return torch.randn(T, d, generator=g)
    return torch.randn(T, rank, generator=g) @ torch.randn(rank, d, generator=g)


@pytest.mark.parametrize('alpha', [0.5, 0.99, 1.0])
def test_entropy_is_log_rank_for_tokens_spread_evenly_and_zero_for_tokens_on_a_line(alpha):
    # T << d random vectors are nearly orthogonal: a flat spectrum; centering removes a direction.
    assert matrix_entropy(random_tokens(16, 4096), alpha).item() == pytest.approx(math.log(15), abs=0.01)
    line = random_tokens(32, 64, rank=1) + torch.randn(64)  # an offset per feature is z-scored away
    assert abs(matrix_entropy(line, alpha).item()) < 1e-4  # float32 leaves eigenvalues ~1e-14


def test_entropy_ignores_each_features_scale_and_offset_and_falls_with_alpha():
    Z = random_tokens(32, 16, rank=4) + 0.1 * random_tokens(32, 16, seed=1)
    S = {alpha: matrix_entropy(Z, alpha).item() for alpha in (0.5, 0.999, 1.0, 2.0)}
    assert 1.0 < S[1.0] < math.log(31)  # an uneven spectrum, which a missed scaling would change
    assert matrix_entropy(Z * torch.logspace(-3, 3, 16) + torch.randn(16)).item() == pytest.approx(S[1.0], abs=1e-6)
    assert abs(S[0.999] - S[1.0]) < 1e-2 and S[0.5] > S[1.0] > S[2.0], S
    batch = torch.stack([random_tokens(20, 8, rank=r, seed=r) for r in (1, 3, 8)])
    assert torch.allclose(matrix_entropy(batch, 0.5), torch.stack([matrix_entropy(z, 0.5) for z in batch]))


def hand_built_weights():
    """Routing weights (3 layers, 2 kv heads, 3 sources); layer 0 reads only itself."""
    return torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
                         [[0.2, 0.8, 0.0], [0.4, 0.6, 0.0]],
                         [[0.1, 0.3, 0.6], [0.5, 0.1, 0.4]]])


def test_retrieval_by_source_and_the_routing_text():
    # source 0: layers 1 and 2, both heads: (0.2 + 0.4 + 0.1 + 0.5) / 4; source 1: (0.3 + 0.1) / 2
    assert torch.allclose(retrieval_by_source(hand_built_weights()), torch.tensor([0.3, 0.2]))
    rows = {line.split()[0]: line for line in render_routing('tiny', hand_built_weights()).splitlines()[2:]}
    assert list(rows) == ['0.0', '0.1', '1.0', '1.1', '2.0', '2.1']
    assert rows['0.0'].split()[:2] == ['0.0', '100'] and rows['0.0'].endswith('|@  |')
    assert rows['1.0'].split()[:3] == ['1.0', '20', '80'] and rows['1.0'].endswith('|-# |')
    assert rows['2.1'].split()[:4] == ['2.1', '50', '10', '40'] and rows['2.1'].endswith('|+:=|')


@pytest.mark.parametrize('router, memory', [('none', 'kv'), ('static', 'kv'), ('dynamic', 'kv'),
                                            ('static', 'hidden'), ('dynamic', 'hidden')])
def test_routing_weights_are_each_routers_own_weights_over_earlier_layers(router, memory):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=101, n_layer=4, n_head=4, n_kv_head=2, n_embd=32,
                          router=router, memory=memory)).eval()
    for name, p in model.named_parameters():  # away from the init (and every norm gain), so it can fail
        if 'router.norm' in name:
            torch.nn.init.uniform_(p, 0.5, 1.5)
        elif 'router' in name:
            torch.nn.init.normal_(p)
    idx = torch.randint(0, 101, (2, 16))
    weights = routing_weights(model, idx)
    assert torch.allclose(weights.sum(-1), torch.ones(4, 2), atol=1e-6)
    assert torch.all(weights.permute(1, 0, 2)[:, torch.ones(4, 4).triu(1).bool()] == 0), "a later layer"
    last, seen = model.blocks[-1], {}
    if router == 'none':
        return
    # By hand, for the last layer: from its input x, as the paper writes its routers.
    hook = last.register_forward_pre_hook(lambda module, args: seen.update(x=args[0]))
    with torch.no_grad():
        model(idx)
        r = last.attn.router
        if router == 'static':
            want = r.mix_weights() if memory == 'hidden' else r.mix_weights().abs().view(2, 4, 2).sum(-1)
        else:  # v1: its norm of x (the paper's per-layer RMSNorm); v2: the layer's attn_norm of x
            want = r.mix_weights((r.norm if memory == 'hidden' else last.attn_norm)(seen['x'])).mean(dim=(0, 1))
    hook.remove()
    assert torch.allclose(weights[3], want / want.sum(-1, keepdim=True), atol=1e-6)


@pytest.mark.parametrize('router', ['none', 'static', 'dynamic'])
def test_layer_features_are_the_values_each_layer_reads_and_each_blocks_output(router):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=101, n_layer=3, n_head=4, n_kv_head=2, n_embd=32,
                          router=router)).eval()
    B, T, G, hs = 2, 12, 2, 8
    idx = torch.randint(0, 101, (B, T))
    values, hidden = layer_features(model, idx)
    # By hand: each layer's raw keys/values, routed where the layer has a router; v is index 1.
    x, memory, block_memory = model.embed(idx), [], [None] * 3 if router != 'none' else None
    with torch.no_grad():
        for l, block in enumerate(model.blocks):
            h = block.attn_norm(x)
            memory.append(block.attn.kv_proj(h).view(B, T, 2, G, hs))
            kv = memory[-1] if block.attn.router is None else block.attn.router(h, memory)
            assert (values[l] - kv[:, :, 1].reshape(B, T, G * hs)).abs().max() < 1e-6, f"layer {l}"
            reads_a_mix = (values[l] - memory[-1][:, :, 1].reshape(B, T, G * hs)).abs().max() > 1e-3
            assert reads_a_mix == (router != 'none' and l > 0), f"layer {l}"
            x = block(x, model.rotary, block_memory)
            assert (hidden[l] - x).abs().max() < 1e-6, f"layer {l}"
        assert torch.allclose(model.lm_head(model.final_norm(x))[..., :101], model(idx)[0], atol=1e-5)


def test_hidden_states_of_hyper_connections_are_the_mean_of_a_blocks_streams():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=101, n_layer=2, n_head=2, n_embd=16, hyper_connections=2)).eval()
    idx = torch.randint(0, 101, (2, 12))
    _, hidden = layer_features(model, idx)
    with torch.no_grad():
        x = model.embed(idx).unsqueeze(2).expand(-1, -1, 2, -1)  # (B, T, n, D), as GPT.forward starts
        for l, block in enumerate(model.blocks):
            x = block(x, model.rotary)
            assert (hidden[l] - x.mean(dim=2)).abs().max() < 1e-6, f"layer {l}"


def table_after(stdout, title_start):
    """The header and rows of the table whose title starts with title_start, split into words."""
    lines = stdout[stdout.index(title_start):].split('\n\n')[0].splitlines()
    return lines[1].split(), [line.split() for line in lines[2:]]


def test_script_prints_its_tables_without_matplotlib(trained, bytes_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(analyze.plot, 'plt', None)
    runs = [trained(router) for router in ('none', 'static', 'dynamic')]
    none, static, dynamic = names = [os.path.basename(run) for run in runs]
    analyze.main([f"--out_dirs={','.join(runs)}", f'--data_dir={bytes_dir}', f'--fig_dir={tmp_path / "f"}',
                  '--batch_size=4', '--device=cpu'])
    stdout = capsys.readouterr().out
    assert f'routing of {static}' in stdout and f'routing of {dynamic}' in stdout
    assert f'routing of {none}' not in stdout  # the baseline has no router to show
    header, rows = table_after(stdout, 'mean weight that later layers')
    assert header == ['source', static, dynamic] and [row[0] for row in rows] == ['0']
    assert all(0.0 < float(w) < 1.0 for row in rows for w in row[1:]), rows
    header, rows = table_after(stdout, 'matrix entropy')
    assert header == ['layer', *names] and [row[0] for row in rows] == ['0', '1']
    assert all(0.0 < float(s) <= math.log(32 - 1) for row in rows for s in row[1:]), rows
    assert f"note: the linear probe skips {', '.join(names)}: it needs GPT-2's vocabulary" in stdout
    assert 'pip install matplotlib' in stdout and not (tmp_path / 'f').exists()


def labelled_features(n_per_class, d, separation, seed=0):
    """(X, labels), 4 balanced classes: noise around a center per class, `separation` in scale."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(4).repeat_interleave(n_per_class)
    return separation * torch.randn(4, d, generator=g)[labels] + torch.randn(len(labels), d, generator=g), labels


def test_probe_separates_separable_classes_and_is_at_chance_on_unrelated_features():
    mean, std = probe_accuracy(*labelled_features(50, 8, separation=5.0), folds=5, seed=0)
    assert mean >= 0.99 and std < 0.02, (mean, std)
    # 64 features for 160 training examples fit the training folds almost perfectly: this also
    # fails if the accuracy were measured on the examples the probe was fitted to.
    X, labels = labelled_features(50, 64, separation=0.0)
    mean, std = probe_accuracy(X, labels, folds=5, seed=0)
    assert mean < 0.5 and probe_accuracy(X, labels, folds=5, seed=0) == (mean, std)  # deterministic


def sentences(n, seed=0):
    """n short English sentences, each with one of ' is', ' are', ' was', ' were' among a few other
    words: many examples of each of the probe's tokens."""
    rng = np.random.default_rng(seed)
    text = []
    for _ in range(n):
        plural = rng.random() < 0.5
        subject = rng.choice([' The dogs', ' They', ' We'] if plural else [' The cat', ' It', ' He'])
        verb = rng.choice([' are', ' were'] if plural else [' is', ' was'])
        text.append(f"{subject}{verb}{rng.choice([' big', ' small', ' red', ' late', ' here'])}.")
    return ''.join(text)


@pytest.fixture(scope='module')
def gpt2_checkpoints(tmp_path_factory, gpt2):
    """(a validation shard's directory, comma-separated checkpoint dirs): sentences(400) in GPT-2
    tokens, ~2,000 of them, and untrained tiny models of GPT-2's vocabulary, 'none' and 'dynamic'."""
    root = tmp_path_factory.mktemp('probe')
    os.makedirs(root / 'data')
    prepare.write_shard(str(root / 'data' / 'text_val_000000.bin'), gpt2.encode_ordinary(sentences(400)))
    for router in ('none', 'dynamic'):
        torch.manual_seed(0)
        os.makedirs(root / router)
        save_checkpoint(root / router / 'ckpt.pt', GPT(GPTConfig(block_size=32, vocab_size=50257, n_layer=2,
                                                                n_head=2, n_embd=16, router=router)))
    return root / 'data', f"{root / 'none'},{root / 'dynamic'}"


def test_probe_end_to_end_on_models_of_gpt2s_vocabulary(gpt2_checkpoints, tmp_path, capsys):
    data, out_dirs = gpt2_checkpoints
    args = [f'--out_dirs={out_dirs}', f'--data_dir={data}', f'--fig_dir={tmp_path}', '--device=cpu',
            '--batch_size=4', '--probe_examples=40']
    analyze.main(args)
    stdout = capsys.readouterr().out
    assert 'note:' not in stdout and '(40 tokens each, chance 0.25), mean ± std over 5 folds' in stdout
    for kind in ('values', 'hidden states'):
        header, rows = table_after(stdout, f"linear probe on each layer's {kind}")
        assert header == ['layer', 'none', 'dynamic'] and [row[0] for row in rows] == ['0', '1']
        assert all(row[2::3] == ['±', '±'] for row in rows), rows  # layer, then 'mean ± std' a checkpoint
        cells = [[(float(row[i]), float(row[i + 2])) for i in (1, 4)] for row in rows]
        assert all(0.0 <= m <= 1.0 and 0.0 <= s <= 1.0 for row in cells for m, s in row), rows
        if kind == 'values':  # layer 0's values of a token are a function of it alone: separable
            assert cells[0] == [(1.0, 0.0), (1.0, 0.0)]
    if analyze.plot.plt is not None:  # the optional half has matplotlib: the figures too
        assert sorted(os.listdir(tmp_path)) == ['entropy.png', 'probe.png', 'retrieval.png', 'routing_dynamic.png']
        assert all((tmp_path / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' for name in os.listdir(tmp_path))


def test_probe_with_too_few_examples_of_a_token_is_skipped_with_a_note(gpt2_checkpoints, gpt2, tmp_path, capsys):
    _, out_dirs = gpt2_checkpoints
    # At the start: the shard's last tokens, short of a whole chunk, are not read.
    text = ' They were here. We were late. They were red.' + sentences(400).replace(' were', ' had')
    prepare.write_shard(str(tmp_path / 'text_val_000000.bin'), gpt2.encode_ordinary(text))
    args = [f'--out_dirs={out_dirs}', f'--data_dir={tmp_path}', '--device=cpu', '--batch_size=4']
    analyze.main(args + [f'--fig_dir={tmp_path}'])
    stdout = capsys.readouterr().out
    assert "note: the linear probe is skipped: " in stdout and " holds only 3 of one of ' is', " in stdout
    assert 'matrix entropy' in stdout and 'linear probe on' not in stdout  # the rest is there
    with pytest.raises(SystemExit, match=r'^error: probe_folds must be at least 2 [^\n]*$'):
        analyze.main(args + ['--probe_folds=1'])
