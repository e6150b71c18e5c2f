"""
The text experiment (lab/text.py), end to end at a tiny size: byte-level data from a small text,
the learning-rate grid, the comparison at the rates chosen, its tables of paired differences, a
resumed run, and the one-line refusals.

    python -m pytest -q tests/test_text.py
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_PRESET = """n_embd = 32
n_head = 2
vocab_size = 257
block_size = 32
batch_size = 2
gradient_accumulation_steps = 1
log_interval = 1
device = 'cpu'
"""
SCHEDULE = ['--grid_steps=2', '--steps=3', '--eval_interval=2', '--eval_iters=1', '--warmup_iters=1', '--jobs=2']


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('text')
    text = tmp / 'verse.txt'
    text.write_text("Of Man's first disobedience, and the fruit — café. " * 300, encoding='utf-8')
    data = tmp / 'bytes'
    subprocess.run([sys.executable, 'prepare.py', '--input', str(text), '--tokenizer=bytes',
                    f'--out_dir={data}', '--workers=1'], cwd=ROOT, check=True, capture_output=True)
    (tmp / 'tiny.py').write_text(TINY_PRESET)
    common = [f'--preset={tmp / "tiny.py"}', f'--data_dir={data}', f'--out={tmp / "runs"}', *SCHEDULE]
    return tmp, common


def text(*args):
    return subprocess.run([sys.executable, '-m', 'lab.text', *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_grid_then_comparison_with_held_out_seeds_then_resume(setup):
    # One set of tiny runs for every stage: each router tuned, the static router from both
    # starts; compared at the rates and the start chosen, a seed held out. (Rates chosen for one
    # depth alone: test_held_out_seeds_run_after_every_other_run.)
    tmp, common = setup
    runs = tmp / 'runs' / 'grid'
    grid_keys = ['--grid_layers=1', '--grid_lrs=3e-3', '--grid_router_x=1',
                 '--grid_inits=noisy,identity']
    grid = text('--stage=grid', *common, *grid_keys)
    assert grid.returncode == 0, grid.stdout + grid.stderr
    assert '0 of 4 runs finished; running 4' in grid.stdout
    lines = grid.stdout.splitlines()
    assert '| router | router_lr | lr 0.003 |' in lines
    assert '| static (identity) | 1x |' in grid.stdout
    for router, init in (('none', ''), ('static', ''), ('static', 'identity'), ('dynamic', '')):
        name = f'L1_{router}_lr0.003' + ('' if router == 'none' else '_x1') + (
            f'_{init}' if init else '') + '_s1'
        record = json.loads((runs / name / 'final.json').read_text())
        header = json.loads((runs / name / 'log.txt').read_text().splitlines()[0])['config']
        # what the name says is what trained, and the score is of the last step
        assert (header['n_layer'], header['router'], header['learning_rate']) == (1, router, 3e-3)
        assert router != 'static' or header['router_init'] == (init or 'noisy')
        assert header['min_lr'] == pytest.approx(3e-4) and header['max_iters'] == 2
        assert record['step'] == 2 and record['bpb'] > 0 and record['seed'] == 1
        assert any(line.startswith(f"best {router}: lr ") for line in lines), grid.stdout
    bpb = {name: json.loads((runs / name / 'final.json').read_text())['bpb'] for name in
           ('L1_static_lr0.003_x1_s1', 'L1_static_lr0.003_x1_identity_s1')}
    start = ':identity' if bpb['L1_static_lr0.003_x1_identity_s1'] < bpb[
        'L1_static_lr0.003_x1_s1'] else ''
    assert f'1/static:0.003:1{start}' in grid.stdout, grid.stdout

    # The comparison, longer than the grid's runs; the held-out seed runs last, reported apart
    runs = tmp / 'runs' / 'compare'
    keys = ['--chosen=none:1e-3:0,static:3e-3:1:identity', '--depths=1', '--seeds=1',
            '--heldout_seeds=2']
    compare = text('--stage=compare', *common, *keys)
    assert compare.returncode == 0, compare.stdout + compare.stderr
    assert '0 of 4 runs finished; running 4' in compare.stdout, compare.stdout
    assert json.loads((runs / 'L1_none_lr0.001_s2' / 'final.json').read_text())['step'] == 3
    out = compare.stdout
    assert '1 layers: final bits per byte on the whole validation split' in out
    assert '| seed | none | static (identity) |' in out and '| 2 (held out) |' in out
    assert '1 layers, held out, static (identity) - none, seed by seed: ' in out
    pair = [line for line in out.splitlines()
            if line.startswith('1 layers, all, static (identity) - none')][0]
    finals = {s: {r: json.loads((runs / f"L1_{r}_lr{lr}{x}_s{s}" / 'final.json').read_text())['bpb']
                  for r, lr, x in (('none', '0.001', ''), ('static', '0.003', '_x1_identity'))}
              for s in (1, 2)}
    for s in (1, 2):  # the paired differences are these runs' own
        assert f"{finals[s]['static'] - finals[s]['none']:+.4f}" in pair
    if importlib.util.find_spec('matplotlib'):
        assert (runs / 'curves_L1.png').stat().st_size > 0

    # A run killed after its checkpoint: resumed, not started again, then scored.
    (runs / 'L1_static_lr0.003_x1_identity_s2' / 'final.json').unlink()
    again = text('--stage=compare', *common, *keys)
    assert again.returncode == 0 and '3 of 4 runs finished; running 1' in again.stdout, again.stdout
    output = (runs / 'output' / 'L1_static_lr0.003_x1_identity_s2.txt').read_text()
    assert 'nothing to train' in output
    report = text('--stage=report', *common, *keys, *grid_keys)
    assert report.returncode == 0, report.stderr
    assert '## grid: 4 of 4 runs finished' in report.stdout
    assert '## compare: 4 of 4 runs finished' in report.stdout

    # Runs of other settings are never mixed into a set.
    other = text('--stage=compare', *common, '--steps=4', *keys)
    assert other.returncode == 1 and 'steps 3, not 4' in other.stderr, other.stderr
    assert 'give another --out' in other.stderr


def test_held_out_seeds_run_after_every_other_run(monkeypatch):
    from lab import text as experiment
    for key, value in dict(chosen='none:1e-2:0,24/static:3e-3:1:identity,static:1e-2:1',
                           depths='24,8', seeds='1,2', heldout_seeds='5').items():
        monkeypatch.setattr(experiment, key, value)
    runs = [(name, seed) for name, _, _, _, _, seed, _ in experiment.compare_runs()]
    assert [seed for _, seed in runs] == [1, 1, 2, 2, 1, 1, 2, 2, 5, 5, 5, 5]
    assert [name for name, _ in runs[:2]] == ['L24_none_lr0.01_s1',
                                              'L24_static_lr0.003_x1_identity_s1']
    assert runs[7][0] == 'L8_static_lr0.01_x1_s2'  # 8 layers: the rates for every depth


@pytest.mark.parametrize('args, message', [
    (['--stage=tune'], "stage must be one of"),
    (['--chosen=static:fast:1'], "chosen: expected router:learning_rate:router_lr_multiple"),
    (['--chosen=dynamic:1e-2:3:identity'], "chosen: expected router:learning_rate"),
    (['--chosen=x/static:1e-2:1'], "chosen: expected router:learning_rate"),
    (['--grid_inits=noisy,zeros'], "grid_inits: expected comma-separated names from noisy, "),
    (['--stage=all', '--chosen='], "chosen is empty: run the grid"),
    (['--chosen=none:1e-3:0', '--deep_routers=static'], "deep_routers: 'static' has no rates"),
    (['--grid_lrs=1e-3,x'], "grid_lrs: expected comma-separated numbers"),
    (['--seeds=0'], "seeds: every value must be positive"),
    (['--data_dir=/nonexistent/text'], "no data in /nonexistent/text: docs/results.md"),
])
def test_bad_settings_give_one_line(args, message):
    result = text(*args)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert result.stderr.startswith('error:') and result.stderr.count('\n') == 1
