"""
The text experiment (lab/text.py) end to end at a tiny size: byte-level data from a small text, the
grid, the comparison at the rates chosen with a held-out seed, a resumed run; and the report over
docs/runs' records, whose numbers docs/results.md gives.
"""
import json
import os
import shutil
import sys

import pytest

from conftest import ROOT, run
from lab import plot, text

TINY_PRESET = """n_embd = 32
n_head = 2
vocab_size = 257
block_size = 32
batch_size = 2
gradient_accumulation_steps = 1
log_interval = 1
device = 'cpu'
"""


def test_grid_then_comparison_with_a_held_out_seed_then_resume(tmp_path):
    text = tmp_path / 'verse.txt'
    text.write_text("Of Man's first disobedience, and the fruit — café. " * 300, encoding='utf-8')
    run('prepare.py', '--input', str(text), '--tokenizer=bytes', f'--out_dir={tmp_path / "bytes"}',
        '--workers=1')
    (tmp_path / 'tiny.py').write_text(TINY_PRESET)
    common = [f'--preset={tmp_path / "tiny.py"}', f'--data_dir={tmp_path / "bytes"}',
              f'--out={tmp_path / "runs"}', '--grid_steps=2', '--steps=3', '--eval_interval=2',
              '--eval_iters=1', '--warmup_iters=1', '--grid_layers=1', '--grid_lrs=[3e-3]',
              '--grid_router_x=[1]', "--grid_routers=['none','static']", "--grid_inits=['identity']",
              "--chosen=[(1,'none',1e-3,0,'noisy'),(1,'static',3e-3,1,'identity')]",
              '--seeds=[1]', '--heldout_seeds=[2]']
    grid = run('lab/text.py', '--stage=all', *common).stdout
    assert '0 of 2 runs finished; running 2' in grid and '0 of 4 runs finished; running 4' in grid
    assert '| static (identity) | 1x | ' in grid and '| none | - | ' in grid
    assert "as chosen: [(1, 'none', 0.003, 0, 'noisy'), (1, 'static', 0.003, 1, 'identity')]" in grid
    runs = tmp_path / 'runs' / 'compare'
    record = json.loads((runs / 'L1_static_lr0.003_x1_identity_s2' / 'final.json').read_text())
    header = json.loads((runs / 'L1_static_lr0.003_x1_identity_s2' / 'log.txt').read_text()
                        .splitlines()[0])['config']
    assert (header['n_layer'], header['router'], header['router_init'], header['seed']) == (
        1, 'static', 'identity', 2)  # what the name says is what trained
    assert record['step'] == 3 and record['bpb'] > 0 and record['router_lr'] == 3e-3
    assert '1 layers, held out: final bits per byte' in grid
    diff = record['bpb'] - json.loads((runs / 'L1_none_lr0.001_s2' / 'final.json').read_text())['bpb']
    assert f"static (identity) - none, seed by seed: {diff:+.4f}; " in grid  # the held-out pair
    # A run stopped after its checkpoint: resumed, not started again, then scored.
    (runs / 'L1_static_lr0.003_x1_identity_s2' / 'final.json').unlink()
    again = run('lab/text.py', '--stage=compare', *common).stdout
    assert '3 of 4 runs finished; running 1' in again
    assert 'nothing to train' in (runs / 'L1_static_lr0.003_x1_identity_s2.txt').read_text()


def test_report_over_the_committed_records_gives_docs_results_numbers(tmp_path, monkeypatch, capsys):
    records = os.path.join(ROOT, 'docs', 'runs')
    for stage, source in (('grid', 'text_depth_v1/grid'), ('compare', 'text_depth_v1/compare'),
                          ('compare', 'text_depth/compare')):
        for name in os.listdir(os.path.join(records, source)):
            if name.endswith('.json') and name.startswith('L24_'):
                run_dir = tmp_path / stage / name.removesuffix('.json')
                run_dir.mkdir(parents=True, exist_ok=True)
                shutil.copy(os.path.join(records, source, name), run_dir / 'final.json')
                if stage == 'compare':
                    shutil.copy(os.path.join(records, source, name[:-5] + '.log.txt'), run_dir / 'log.txt')
    monkeypatch.setattr(plot, 'pyplot', lambda: None)  # the tables alone
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, 'argv', ['lab/text.py', 'config/lab/text_depth_v1.py', '--stage=report',
                                      f'--out={tmp_path}'])
    text.main()
    out = capsys.readouterr().out
    assert '| dynamic-v1 | 1x | 2.4216 | 2.3699 |' in out and '## compare: 24 of 24 runs finished' in out
    assert '| mean ± std | 2.2738 ± 0.0080 | 2.2747 ± 0.0090 | 2.2768 ± 0.0062 | 2.2663 ± 0.0071 |' in out
    assert ('dynamic-v1 - none, seed by seed: -0.0039, +0.0066, -0.0161, -0.0023, -0.0062, -0.0233; '
            'mean -0.0075 ± 0.0106; better in 5 of 6') in out


@pytest.mark.parametrize('args, message', [
    (["--chosen=[(8,'static',1e-2,1)]"], "chosen: expected (layers, router, learning_rate"),
    (['--stage=all', '--chosen=[]'], "chosen is empty: run the grid"),
    (['--data_dir=/nonexistent/text'], "no data in /nonexistent/text: docs/results.md"),
])
def test_bad_settings_give_one_line(args, message):
    result = run('lab/text.py', *args, check=False)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert result.stderr.startswith('error:') and result.stderr.count('\n') == 1
