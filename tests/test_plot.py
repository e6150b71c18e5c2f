"""
Tests for lab/plot.py (its tables and figures, from log records the tests write) and lab/compare.sh
end to end at a tiny shape.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import BYTES, ROOT, TINY, run
from lab import plot

HAVE_MATPLOTLIB = importlib.util.find_spec('matplotlib') is not None


def fake_run(path, router, seed, n_layer=4, accuracy=None, final_val=2.0):
    """An out_dir as train.py (and arith.py, given accuracy {n_ops: share}, and lab/runs.py) leave it."""
    os.makedirs(path)
    config = {'router': router, 'seed': seed, 'n_layer': n_layer, 'batch_size': 2, 'block_size': 8,
              'gradient_accumulation_steps': 1}
    records = [{'config': config, 'params': 1000, 'flops_per_token': 6000}]
    for step in range(0, 101, 50):
        records += [{'step': step, 'train_loss': 3.0 - step / 100},
                    {'step': step, 'val_loss': final_val + 1 - step / 100}]
    with open(os.path.join(path, 'log.txt'), 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in records)
    with open(os.path.join(path, 'time.json'), 'w') as f:
        json.dump({'train_wall_s': 60.0 * seed, 'train_cpu_s': 30.0}, f)
    if accuracy is not None:  # of the checkpoint at step 100
        with open(os.path.join(path, 'arith_eval.json'), 'w') as f:
            json.dump({'accuracy': {str(k): v for k, v in accuracy.items()}, 'step': 100,
                       'accuracy_all': {str(k): 0.99 for k in accuracy}}, f)
    return str(path)


@pytest.fixture
def runs(tmp_path):
    """none and static, two seeds each, at 4 layers; static also at 8 layers."""
    return [fake_run(tmp_path / f'L{n}_{router}_s{seed}', router, seed, n, {1: None, 6: six},
                     final_val=2.0 + seed / 10 - (router == 'static') * seed / 5)
            for router, seed, n, six in [('none', 1, 4, 0.10), ('none', 2, 4, 0.20),
                                         ('static', 1, 4, 0.50), ('static', 2, 4, 0.15),
                                         ('static', 1, 8, 0.90)]]


def test_seed_table_gives_each_seed_the_mean_and_the_pairs_with_the_baseline():
    lines = plot.seed_table({'none': {1: 2.5, 2: 2.6, 3: 2.55}, 'static': {1: 2.4, 2: 2.65, 3: 2.5},
                             'dynamic': {1: 2.3, 3: 2.4}}, baseline='none')
    assert lines[:3] == ['| seed | none | static | dynamic |', '|---|---|---|---|',
                         '| 1 | 2.5000 | 2.4000 | 2.3000 |']
    assert lines[3] == '| 2 | 2.6000 | 2.6500 | - |'
    assert lines[5] == '| mean ± std | 2.5500 ± 0.0500 | 2.5167 ± 0.1258 | 2.3500 ± 0.0707 |'
    assert lines[7:] == [
        'static - none, seed by seed: -0.1000, +0.0500, -0.0500; mean -0.0333 ± 0.0764; better in 2 of 3',
        'dynamic - none, seed by seed: -0.2000, -0.1500; mean -0.1750 ± 0.0354; better in 2 of 2']
    higher = plot.seed_table({'none': {1: 10.0}, 'static': {1: 50.0}}, 'none', True, digits=1)
    assert higher[-1] == 'static - none, seed by seed: +40.0; mean +40.0 ± 0.0; better in 1 of 1'


def test_without_matplotlib_the_tables_print_and_the_command_succeeds(runs, tmp_path):
    four = ','.join(runs[:4])
    code = ("import sys, runpy; sys.modules['matplotlib'] = None; "
            "runpy.run_module('lab.plot', run_name='__main__', alter_sys=True)")
    result = subprocess.run([sys.executable, '-c', code, f'--runs={four}', f'--out={tmp_path / "c.png"}'],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert '| L4_none seed 1 | ' in out and '2.1000 (step 100)' in out  # a row per run
    assert '| mean ± std | 2.1500 ± 0.0707 | 1.8500 ± 0.0707 |' in out  # last val loss by setting
    assert 'L4_static - L4_none, seed by seed: -0.2000, -0.4000; ' in out
    assert out.endswith("no figure: matplotlib is not installed (pip install matplotlib); the "
                        "tables above stand\n") and not (tmp_path / 'c.png').exists()


def test_arith_tables_and_runs_named_by_their_directories(runs, capsys, monkeypatch):
    monkeypatch.setattr(plot, 'pyplot', lambda: None)  # the tables alone
    assert plot.plot_arith(runs[:4]) is None
    out = capsys.readouterr().out
    assert '| operators | L4_none: % (seeds) | L4_static: % (seeds) |' in out
    assert '| 1 | 99.0 ± 0.0 (2) | 99.0 ± 0.0 (2) |' in out  # no held-out expressions: over all
    assert 'held-out exact match at 6 operators, %, by seed' in out
    assert 'L4_static - L4_none, seed by seed: +40.0, -5.0; mean +17.5 ± 31.8; better in 1 of 2' in out
    assert '| mean ± std | 0.5 ± 0.0 | 1.5 ± 0.7 | 0.5 ± 0.0 | 1.5 ± 0.7 |' in out  # minutes
    plot.plot_arith(runs, 6)  # by depth
    assert '| 8 | - | 90.0 ± 0.0 (1) |' in capsys.readouterr().out  # the static line at 8 layers
    with pytest.raises(SystemExit, match='are one setting.s seed 1 twice'):
        plot.by_setting([runs[0], runs[0] + '/.'])


def test_an_evaluation_of_another_checkpoint_is_refused(runs):
    path = os.path.join(runs[0], 'arith_eval.json')
    with open(path) as f:
        result = json.load(f)
    with open(path, 'w') as f:
        json.dump({**result, 'step': 50}, f)  # the log evaluated again after it
    with pytest.raises(SystemExit, match='arith_eval.json scored another checkpoint'):
        plot.read_eval(runs[0])


@pytest.mark.optional
@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='matplotlib is not installed')
def test_every_mode_draws_its_figure(runs, tmp_path):
    for mode, extra in (('curves', '--n_ops=6'), ('arith', '--n_ops=6'), ('depth', '--n_ops=6')):
        out = tmp_path / f'{mode}.png'
        result = run('lab/plot.py', f'--mode={mode}', f"--runs={','.join(runs)}", f'--out={out}', extra)
        assert result.stdout.endswith(f"wrote {out}\n")
        assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_compare_sh_trains_each_router_then_keeps_them(bytes_dir, tmp_path):
    args = ['config/small_text.py', *TINY, BYTES, f'--data_dir={bytes_dir}', '--max_iters=2',
            '--eval_interval=2']
    # the script's `python` is the one running the tests
    env = {**os.environ, 'OUT': str(tmp_path / 'cmp'),
           'PATH': os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH']}
    first, again = (subprocess.run(['bash', 'lab/compare.sh', *args], capture_output=True, text=True,
                                   cwd=ROOT, env=env, timeout=600) for _ in range(2))
    assert first.returncode == 0, first.stdout + first.stderr
    assert '0 of 3 runs finished; running 3, 1 at a time' in first.stdout
    for router in ('none', 'static', 'dynamic'):
        assert f'| {router} | {tmp_path}/cmp/{router} |' in first.stdout
    assert '3 of 3 runs finished; running 0' in again.stdout, again.stdout + again.stderr
