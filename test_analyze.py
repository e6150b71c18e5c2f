"""
Tests for analyze.py: its computations on hand-built inputs, and the script as a user runs it, on
tiny checkpoints trained here: without matplotlib and, where it is installed, with it.

    python -m pytest -q test_analyze.py
"""
import importlib.util
import math
import os
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch

import analyze
import prepare
from analyze import layer_values, matrix_entropy, render_routing, retrieval_by_source
from lime import GPT, GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROUTERS = ['none', 'static', 'dynamic']
# Runs analyze.py as `python analyze.py ARGS` would, but with `import matplotlib` failing.
WITHOUT_MATPLOTLIB = ("import runpy, sys; sys.modules['matplotlib'] = None; "
                      "runpy.run_path('analyze.py', run_name='__main__')")


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
def test_layer_values_are_the_values_each_layer_attends_over(router):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=101, n_layer=3, n_head=4, n_kv_head=2, n_embd=32,
                          router=router)).eval()
    B, T, G, hs = 2, 12, 2, 8
    idx = torch.randint(0, 101, (B, T))
    values = layer_values(model, idx)
    # By hand: each layer's raw keys/values, routed where the layer has a router; v is index 1.
    x, memory, expected, raw = model.wte(idx), [], [], []
    block_memory = [] if router != 'none' else None  # what GPT.forward passes the blocks
    with torch.no_grad():
        for block in model.blocks:
            h = block.ln_1(x)
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
            os.makedirs(out_dirs[-1])
            torch.save({'model_args': asdict(config), 'model': model.state_dict(), 'step': 10,
                        'best_val_loss': loss.item(), 'config': {}}, os.path.join(out_dirs[-1], 'ckpt.pt'))
    finally:
        torch.set_num_threads(threads)
    return str(root), ','.join(out_dirs)


def run_analyze(checkpoints, fig_dir, matplotlib=True):
    data_dir, out_dirs = checkpoints
    command = ['analyze.py'] if matplotlib else ['-c', WITHOUT_MATPLOTLIB]
    result = subprocess.run([sys.executable, *command, f'--out_dirs={out_dirs}', f'--data_dir={data_dir}',
                             f'--fig_dir={fig_dir}', '--batch_size=4', '--device=cpu'],
                            capture_output=True, text=True, cwd=HERE, timeout=120)
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
    with pytest.raises(SystemExit, match=r'^error: no \*_val_\*\.bin shard in [^\n]*$'):
        analyze.main([f'--out_dirs={out_dirs}', f'--data_dir={tmp_path}', '--device=cpu'])
