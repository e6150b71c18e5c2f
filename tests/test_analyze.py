"""
Tests for analyze.py: its computations on hand-built inputs, and the script as a user runs it, on
tiny checkpoints trained here: without matplotlib and, where it is installed, with it; the linear
probe on fabricated features and, end to end, on untrained checkpoints of GPT-2's vocabulary.

    python -m pytest -q test_analyze.py
"""
import importlib.util
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch

from lab import analyze
import prepare
from lab.analyze import (layer_features, layer_values, matrix_entropy, probe_accuracy, render_routing,
                     retrieval_by_source, routing_weights, stratified_folds)
from lime import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: scripts run from there
ROUTERS = ['none', 'static', 'dynamic']
# Runs analyze.py as `python -m lab.analyze ARGS` would, but with `import matplotlib` failing.
WITHOUT_MATPLOTLIB = ("import runpy, sys; sys.modules['matplotlib'] = None; "
                      "runpy.run_module('lab.analyze', run_name='__main__', alter_sys=True)")


def save_checkpoint(out_dir, config, model, step, loss):
    """model saved to out_dir/ckpt.pt as train.py saves it (the keys load_model reads)."""
    os.makedirs(out_dir)
    torch.save({'model_args': asdict(config), 'model': model.state_dict(), 'step': step,
                'best_val_loss': loss, 'config': {}}, os.path.join(out_dir, 'ckpt.pt'))


def random_tokens(T, d, rank=None, seed=0):
    """T token vectors of width d, Gaussian, spanning `rank` directions (all of them by default)."""
    g = torch.Generator().manual_seed(seed)
    if rank is None:
        return torch.randn(T, d, generator=g)
    return torch.randn(T, rank, generator=g) @ torch.randn(rank, d, generator=g)


@pytest.mark.parametrize('alpha', [0.5, 0.99, 1.0])
def test_entropy_of_tokens_spread_over_all_directions_is_log_of_their_rank(alpha):
    # With T << d, T random vectors are nearly orthogonal: K's spectrum is nearly flat. Centering
    # removes one direction, so the rank is T - 1.
    T = 16
    entropy = matrix_entropy(random_tokens(T, 4096), alpha).item()
    assert abs(entropy - math.log(T - 1)) < 0.01, (entropy, math.log(T - 1))


@pytest.mark.parametrize('alpha', [0.5, 1.0])
def test_entropy_of_tokens_on_one_line_is_zero(alpha):
    Z = random_tokens(32, 64, rank=1) + torch.randn(64)  # an offset per feature is z-scored away
    # Not exactly 0: float32 rounding leaves other eigenvalues ~1e-14 of the largest.
    assert abs(matrix_entropy(Z, alpha).item()) < 1e-4


def test_entropy_ignores_the_scale_and_offset_of_each_feature():
    Z = random_tokens(32, 16, rank=4) + 0.1 * random_tokens(32, 16, seed=1)
    scaled = Z * torch.logspace(-3, 3, 16) + torch.randn(16)
    entropy, entropy_scaled = matrix_entropy(Z).item(), matrix_entropy(scaled).item()
    assert 1.0 < entropy < math.log(31)  # an uneven spectrum, which a missed scaling would change
    assert abs(entropy - entropy_scaled) < 1e-6, (entropy, entropy_scaled)  # float32 rounding apart


def test_entropy_near_alpha_one_approaches_the_shannon_limit_and_falls_with_alpha():
    Z = random_tokens(32, 16, rank=4) + 0.1 * random_tokens(32, 16, seed=1)
    S = {alpha: matrix_entropy(Z, alpha).item() for alpha in (0.5, 0.999, 1.0, 2.0)}
    assert abs(S[0.999] - S[1.0]) < 1e-2, S
    assert S[0.5] > S[1.0] > S[2.0], S  # Renyi entropies fall with the order for an uneven spectrum


def test_entropy_of_a_batch_is_the_entropy_of_each_sequence():
    Z = torch.stack([random_tokens(20, 8, rank=r, seed=r) for r in (1, 3, 8)])  # (3, 20, 8)
    batched = matrix_entropy(Z, 0.5)
    one_by_one = torch.stack([matrix_entropy(z, 0.5) for z in Z])
    assert batched.shape == (3,) and torch.allclose(batched, one_by_one), (batched, one_by_one)


def hand_built_weights():
    """Routing weights (3 layers, 2 kv heads, 3 sources); layer 0 reads only itself."""
    return torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
                         [[0.2, 0.8, 0.0], [0.4, 0.6, 0.0]],
                         [[0.1, 0.3, 0.6], [0.5, 0.1, 0.4]]])


def test_retrieval_by_source_averages_over_later_layers_and_their_heads():
    # source 0: layers 1 and 2, both heads: (0.2 + 0.4 + 0.1 + 0.5) / 4; source 1: layer 2: (0.3 + 0.1) / 2
    retrieval = retrieval_by_source(hand_built_weights())
    assert torch.allclose(retrieval, torch.tensor([0.3, 0.2])), retrieval


def test_routing_text_shows_percentages_and_leaves_later_sources_blank():
    lines = render_routing('tiny', hand_built_weights()).splitlines()
    rows = {line.split()[0]: line for line in lines[2:]}
    assert list(rows) == ['0.0', '0.1', '1.0', '1.1', '2.0', '2.1']
    assert rows['0.0'].split()[:2] == ['0.0', '100'] and rows['0.0'].endswith('|@  |')
    assert rows['1.0'].split()[:3] == ['1.0', '20', '80'] and rows['1.0'].endswith('|-# |')
    assert rows['2.1'].split()[:4] == ['2.1', '50', '10', '40'] and rows['2.1'].endswith('|+:=|')


@pytest.mark.parametrize('router', ROUTERS)
def test_routing_weights_are_distributions_over_earlier_layers(router):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=101, n_layer=4, n_head=4, n_embd=32, router=router)).eval()
    for block in model.blocks[1:] if router != 'none' else []:  # away from the init, so the test can fail
        torch.nn.init.normal_(block.attn.router.proj.weight if router == 'dynamic' else block.attn.router.weight)
    idx = torch.randint(0, 101, (2, 16))
    weights = routing_weights(model, idx)
    L = model.config.n_layer
    assert weights.shape == (L, 4, L)
    assert torch.allclose(weights.sum(-1), torch.ones(L, 4), atol=1e-6), 'rows must sum to 1'
    later = torch.ones(L, L).triu(diagonal=1).bool()  # [l, m] is True where m > l
    assert torch.all(weights.permute(1, 0, 2)[:, later] == 0), "a layer reads a later layer"
    if router == 'dynamic':  # by hand for the last layer: its router's probabilities, averaged over the tokens
        h, memory = model.embed(idx), [None] * len(model.blocks)  # as GPT.forward makes it
        with torch.no_grad():
            for block in model.blocks[:-1]:
                h = block(h, model.rotary, memory)
            probs = model.blocks[-1].attn.router.mix_weights(model.blocks[-1].attn_norm(h)).mean(dim=(0, 1))
        assert torch.allclose(weights[-1], probs, atol=1e-6)


@pytest.mark.parametrize('router', ROUTERS)
def test_layer_values_are_the_values_each_layer_attends_over(router):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=101, n_layer=3, n_head=4, n_kv_head=2, n_embd=32,
                          router=router)).eval()
    B, T, G, hs = 2, 12, 2, 8
    idx = torch.randint(0, 101, (B, T))
    values = layer_values(model, idx)
    # By hand: each layer's raw keys/values, routed where the layer has a router; v is index 1.
    x, memory, expected, raw = model.embed(idx), [], [], []
    block_memory = [None] * 3 if router != 'none' else None  # what GPT.forward passes the blocks
    with torch.no_grad():
        for block in model.blocks:
            h = block.attn_norm(x)
            memory.append(block.attn.kv_proj(h).view(B, T, 2, G, hs))
            kv = memory[-1] if block.attn.router is None else block.attn.router(h, memory)
            raw.append(memory[-1][:, :, 1].reshape(B, T, G * hs))
            expected.append(kv[:, :, 1].reshape(B, T, G * hs))
            x = block(x, model.rotary, block_memory)  # the next layer's input
    assert [tuple(v.shape) for v in values] == [(B, T, G * hs)] * 3
    for l in range(3):
        diff = (values[l] - expected[l]).abs().max().item()
        assert diff < 1e-6, f"layer {l}: max abs difference {diff:.3g}"
    for l in range(3):  # a LIMe layer past the first reads a mix, not its own raw values
        reads_a_mix = router != 'none' and l > 0
        assert ((values[l] - raw[l]).abs().max().item() > 1e-3) == reads_a_mix, f"layer {l}"


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    """(data_dir, comma-separated checkpoint dirs): a tiny model per router, trained for 10 steps and
    saved as train.py saves it. The data is a random 300-token passage over a 128-token vocabulary,
    repeated: learnable (by copying from the previous repeat) and fast, as GPT-2's 50K-token
    vocabulary would make each step ten times slower."""
    root = tmp_path_factory.mktemp('analyze')
    tokens = torch.randint(0, 128, (300,), generator=torch.Generator().manual_seed(0)).repeat(20)
    prepare.write_shard(str(root / 'tiny_val_000000.bin'), tokens.numpy())
    B, T = 4, 32
    out_dirs = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains several times faster on one thread
    try:
        for router in ROUTERS:
            torch.manual_seed(0)
            config = GPTConfig(block_size=T, vocab_size=128, n_layer=3, n_head=2, n_embd=32, router=router)
            model = GPT(config)
            optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, router_lr=3e-2)
            for step in range(10):
                chunk = tokens[step * B * T:(step + 1) * B * T + 1]
                _, loss = model(chunk[:-1].view(B, T), chunk[1:].view(B, T))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            out_dirs.append(str(root / router))
            save_checkpoint(out_dirs[-1], config, model, 10, loss.item())
    finally:
        torch.set_num_threads(threads)
    return str(root), ','.join(out_dirs)


def run_analyze(checkpoints, fig_dir, matplotlib=True):
    data_dir, out_dirs = checkpoints
    command = ['-m', 'lab.analyze'] if matplotlib else ['-c', WITHOUT_MATPLOTLIB]
    result = subprocess.run([sys.executable, *command, f'--out_dirs={out_dirs}', f'--data_dir={data_dir}',
                             f'--fig_dir={fig_dir}', '--batch_size=4', '--device=cpu'],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, f"analyze.py failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def table_after(stdout, title_start):
    """The rows of numbers of the table whose title starts with title_start, as lists of strings."""
    lines = stdout[stdout.index(title_start):].split('\n\n')[0].splitlines()
    return lines[1].split(), [line.split() for line in lines[2:]]


def test_script_prints_routing_retrieval_and_entropy_tables_without_matplotlib(checkpoints, tmp_path):
    stdout = run_analyze(checkpoints, tmp_path / 'figures', matplotlib=False)
    assert 'routing of static' in stdout and 'routing of dynamic' in stdout
    assert 'routing of none' not in stdout  # the baseline has no router to show
    header, rows = table_after(stdout, 'mean weight that later layers')
    assert header == ['source', 'static', 'dynamic'] and [row[0] for row in rows] == ['0', '1']
    assert all(0.0 < float(w) < 1.0 for row in rows for w in row[1:]), rows
    header, rows = table_after(stdout, 'matrix entropy')
    assert header == ['layer', 'none', 'static', 'dynamic'] and [row[0] for row in rows] == ['0', '1', '2']
    assert all(0.0 < float(s) <= math.log(32 - 1) for row in rows for s in row[1:]), rows
    assert 'pip install matplotlib' in stdout
    assert not (tmp_path / 'figures').exists()


@pytest.mark.optional
@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None, reason='matplotlib is not installed')
def test_script_writes_the_figures_with_matplotlib(checkpoints, tmp_path):
    stdout = run_analyze(checkpoints, tmp_path)
    for name in ('routing_static.png', 'routing_dynamic.png', 'retrieval.png', 'entropy.png'):
        assert f'wrote {tmp_path / name}' in stdout
        with open(tmp_path / name, 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n', name
    assert sorted(os.listdir(tmp_path)) == ['entropy.png', 'retrieval.png', 'routing_dynamic.png',
                                            'routing_static.png']
    assert 'matrix entropy' in stdout  # the tables are printed either way


def test_missing_checkpoint_or_validation_shard_stops_with_one_line(checkpoints, tmp_path):
    data_dir, out_dirs = checkpoints
    with pytest.raises(SystemExit, match=r'^error: no checkpoint at .*nowhere.ckpt\.pt [^\n]*$'):
        analyze.main([f'--out_dirs={out_dirs},{tmp_path}/nowhere', f'--data_dir={data_dir}', '--device=cpu'])
    with pytest.raises(SystemExit, match=r'^error: no \*_val_\*\.bin shards in [^\n]*$'):
        analyze.main([f'--out_dirs={out_dirs}', f'--data_dir={tmp_path}', '--device=cpu'])


def test_a_checkpoint_of_block_size_1_is_named_not_measured_as_nan(checkpoints, tmp_path):
    data_dir, out_dirs = checkpoints
    config = GPTConfig(block_size=1, vocab_size=128, n_layer=2, n_head=2, n_embd=32)
    save_checkpoint(tmp_path / 'one', config, GPT(config), 1, 5.0)
    with pytest.raises(SystemExit, match=r'^error: one: block_size 1, but the values. entropy'):
        analyze.main([f'--out_dirs={out_dirs},{tmp_path / "one"}', f'--data_dir={data_dir}',
                      '--device=cpu', '--probe=False'])


def test_entropy_of_a_large_order_is_the_min_entropy_not_inf():
    Z = random_tokens(16, 8, rank=5)
    lam = torch.linalg.svdvals((Z - Z.mean(0)) / Z.std(0, correction=0).double()) ** 2
    min_entropy = -math.log((lam / lam.sum()).max().item())
    assert matrix_entropy(Z, 1e308).item() == pytest.approx(min_entropy, rel=1e-6)
    assert matrix_entropy(Z, 1e4).item() == pytest.approx(min_entropy, rel=1e-3)


# -----------------------------------------------------------------------------
# the linear probe


def labelled_features(n_per_class, d, separation, seed=0):
    """(X, labels) for 4 balanced classes: Gaussian noise of width d around a random center per
    class, the centers `separation` apart in scale (0: the features say nothing of the label)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(4).repeat_interleave(n_per_class)
    centers = separation * torch.randn(4, d, generator=g)
    return centers[labels] + torch.randn(len(labels), d, generator=g), labels


def test_stratified_folds_share_every_class_evenly_and_depend_on_the_seed():
    labels = torch.arange(4).repeat_interleave(23)
    fold = stratified_folds(labels, 5, seed=0)
    for c in range(4):  # 23 of each class dealt to 5 folds: 5, 5, 5, 4, 4
        assert sorted(torch.bincount(fold[labels == c], minlength=5).tolist()) == [4, 4, 5, 5, 5]
    assert torch.equal(fold, stratified_folds(labels, 5, seed=0))
    assert not torch.equal(fold, stratified_folds(labels, 5, seed=1))


def test_probe_tells_linearly_separable_classes_apart():
    X, labels = labelled_features(50, 8, separation=5.0)
    mean, std = probe_accuracy(X, labels, folds=5, seed=0)
    assert mean >= 0.99 and std < 0.02, (mean, std)


def test_probe_of_features_unrelated_to_the_labels_is_near_chance():
    # 64 features for 160 training examples: enough to fit the training folds almost perfectly, so
    # this also fails if the accuracy were measured on examples the probe was fitted to.
    X, labels = labelled_features(50, 64, separation=0.0)
    mean, std = probe_accuracy(X, labels, folds=5, seed=0)
    assert mean < 0.5, (mean, std)
    assert probe_accuracy(X, labels, folds=5, seed=0) == (mean, std)  # deterministic


@pytest.mark.parametrize('hyper_connections', [0, 2])
def test_hidden_states_are_each_blocks_output_and_the_last_gives_the_logits(hyper_connections):
    torch.manual_seed(0)
    n = hyper_connections
    model = GPT(GPTConfig(block_size=16, vocab_size=101, n_layer=3, n_head=2, n_embd=16, router='static',
                          hyper_connections=n)).eval()
    idx = torch.randint(0, 101, (2, 12))
    _, hidden = layer_features(model, idx)
    assert [tuple(h.shape) for h in hidden] == [(2, 12, 16)] * 3
    with torch.no_grad():
        logits, _ = model(idx)
        x, memory = model.embed(idx), [None] * len(model.blocks)  # as GPT.forward makes it
        if n:
            x = x.unsqueeze(2).expand(-1, -1, n, -1)  # (B, T, n, D), as GPT.forward starts them
        for l, block in enumerate(model.blocks):
            x = block(x, model.rotary, memory)
            expected = x.mean(dim=2) if n else x
            assert (hidden[l] - expected).abs().max().item() < 1e-6, f"layer {l}"
        # The last hidden state is what the model reads its logits from.
        assert torch.allclose(model.lm_head(model.final_norm(hidden[-1]))[..., :101], logits, atol=1e-5)


def sentences(n, seed=0):
    """n short English sentences, each with one of ' is', ' are', ' was', ' were' (as agreement
    wants it) among a few other words: many examples of each of the probe's tokens."""
    rng = np.random.default_rng(seed)
    singular, plural = [' The cat', ' It', ' He', ' The house'], [' The dogs', ' They', ' We']
    adjectives = [' big', ' small', ' red', ' late', ' here', ' tired']
    text = []
    for _ in range(n):
        subjects, verbs = (singular, [' is', ' was']) if rng.random() < 0.5 else (plural, [' are', ' were'])
        text.append(f"{rng.choice(subjects)}{rng.choice(verbs)}{rng.choice(adjectives)}.")
    return ''.join(text)


@pytest.fixture(scope='module')
def gpt2_checkpoints(tmp_path_factory, gpt2):
    """(root, comma-separated checkpoint dirs): untrained tiny models of GPT-2's vocabulary (routers
    'none' and 'dynamic'), and in root/data a validation shard of sentences(400), ~2,000 tokens."""
    root = tmp_path_factory.mktemp('probe')
    enc = gpt2
    os.makedirs(root / 'data')
    prepare.write_shard(str(root / 'data' / 'text_val_000000.bin'), enc.encode_ordinary(sentences(400)))
    out_dirs = []
    for router in ('none', 'dynamic'):
        torch.manual_seed(0)
        config = GPTConfig(block_size=32, vocab_size=50257, n_layer=2, n_head=2, n_embd=16, router=router)
        out_dirs.append(str(root / router))
        save_checkpoint(out_dirs[-1], config, GPT(config), 0, 10.0)
    return root, ','.join(out_dirs)


def test_probe_end_to_end_on_models_of_gpt2s_vocabulary(gpt2_checkpoints, tmp_path, capsys):
    root, out_dirs = gpt2_checkpoints
    args = [f'--out_dirs={out_dirs}', f'--data_dir={root / "data"}', f'--fig_dir={tmp_path}', '--device=cpu',
            '--batch_size=4', '--probe_examples=40']
    analyze.main(args)
    stdout = capsys.readouterr().out
    assert 'note:' not in stdout and 'matrix entropy' in stdout
    tables = {}
    for kind in ("the values each layer's attention reads", 'the hidden state (residual stream)'):
        header, rows = table_after(stdout, f'linear probe on {kind}')
        assert f'(40 tokens each, chance 0.25), mean ± std over 5 folds' in stdout
        assert header == ['layer', 'none', 'dynamic'] and [row[0] for row in rows] == ['0', '1']
        # A row: layer, then 'mean ± std' per checkpoint.
        assert all(row[2::3] == ['±', '±'] for row in rows), rows
        cells = [[(float(row[i]), float(row[i + 2])) for i in (1, 4)] for row in rows]
        assert all(0.0 <= m <= 1.0 and 0.0 <= s <= 1.0 for row in cells for m, s in row), rows
        tables[kind] = cells
    # Layer 0's values of a token are a function of that token alone: 4 points, always separable.
    assert tables["the values each layer's attention reads"][0] == [(1.0, 0.0), (1.0, 0.0)]
    if analyze.plot.plt is not None:
        with open(tmp_path / 'probe.png', 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    analyze.main(args + ['--probe=False', f'--fig_dir={tmp_path / "off"}'])
    stdout = capsys.readouterr().out
    assert 'linear probe' not in stdout and 'matrix entropy' in stdout
    assert analyze.plot.plt is None or not (tmp_path / 'off' / 'probe.png').exists()


def test_probe_skips_checkpoints_of_another_vocabulary_with_a_note(checkpoints, tmp_path, capsys):
    data_dir, out_dirs = checkpoints
    analyze.main([f'--out_dirs={out_dirs}', f'--data_dir={data_dir}', f'--fig_dir={tmp_path}', '--device=cpu',
                  '--batch_size=4'])
    stdout = capsys.readouterr().out
    notes = [line for line in stdout.splitlines() if line.startswith('note:')]
    assert notes == ["note: the linear probe skips none (vocab_size 128), static (vocab_size 128), dynamic "
                     "(vocab_size 128): it needs GPT-2's vocabulary, for the tokens ' is', ' are', ' was', ' were'"]
    assert 'linear probe on' not in stdout
    assert 'routing of static' in stdout and 'matrix entropy' in stdout  # the rest is all there
    assert not (tmp_path / 'probe.png').exists()


def test_probe_with_too_few_examples_of_a_token_is_skipped_with_a_note(gpt2_checkpoints, tmp_path, capsys):
    root, out_dirs = gpt2_checkpoints
    enc = prepare.gpt2_encoding()  # cached: gpt2_checkpoints skips the test where it is not
    # At the start: the shard's last tokens, short of a whole chunk, are not read.
    text = ' They were here. We were late. They were red.' + sentences(400).replace(' were', ' had')
    prepare.write_shard(str(tmp_path / 'text_val_000000.bin'), enc.encode_ordinary(text))
    args = [f'--out_dirs={out_dirs}', f'--data_dir={tmp_path}', '--device=cpu', '--batch_size=4']
    analyze.main(args + [f'--fig_dir={tmp_path}'])
    stdout = capsys.readouterr().out
    assert re.search(r"^note: the linear probe is skipped: .*text_val_000000\.bin holds only 3 ' were' tokens "
                     r"[^\n]*probe_folds=5[^\n]*$", stdout, re.M), stdout
    assert 'matrix entropy' in stdout and 'linear probe on' not in stdout  # the rest of the analysis is there
    with pytest.raises(SystemExit, match=r'^error: probe_folds must be at least 2 [^\n]*$'):
        analyze.main(args + ['--probe_folds=1'])
    with pytest.raises(SystemExit, match=r'^error: probe_examples \(3\) must be at least probe_folds [^\n]*$'):
        analyze.main(args + ['--probe_examples=3'])


@pytest.mark.parametrize('router', ['static', 'dynamic'])
def test_v1_routing_weights_are_its_softmax_per_head_and_source(router):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_kv_head=2, n_embd=32, vocab_size=50,
                          block_size=16, router=router, memory='hidden')).eval()
    idx = torch.randint(0, 50, (2, 16))
    weights = routing_weights(model, idx)
    assert torch.allclose(weights.sum(-1), torch.ones(4, 2))
    last = model.routers()[-1]
    if router == 'static':
        want = last.mix_weights()
    else:  # the last layer's input, through its router's norm: the tokens' mean probabilities
        seen = {}
        hook = last.register_forward_hook(lambda r, args, out: seen.update(x=args[1][-1]))
        model(idx)
        hook.remove()
        want = last.mix_weights(last.norm(seen['x'])).mean(dim=(0, 1))
    assert torch.allclose(weights[3], want.detach(), atol=1e-6)
    # and the values layer_features reads are v1's projections of its mix (B, T, G * hs)
    assert layer_features(model, idx)[0][3].shape == (2, 16, 16)
