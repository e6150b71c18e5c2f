"""
The laptop experiment's command (lab/laptop.sh: lab/arith.py's data, train.py through lab/runs.py,
lab/arith.py's scoring, lab/plot.py's tables) end to end at a tiny size, then again: kept.
"""
import json
import os
import subprocess
import sys

from conftest import ROOT

SMALL = ['--n_layer=2', '--batch_size=2', '--max_iters=4', '--eval_interval=2', '--eval_iters=1',
        '--log_interval=1', '--warmup_iters=2']


def test_laptop_command_trains_scores_tabulates_and_keeps_its_runs(tmp_path):
    # The script's `python` is the one running the tests (with its packages), not another on PATH.
    env = {**os.environ, 'PATH': os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'],
           'SEEDS': '1', 'ROUTERS': 'none static', 'OUT': str(tmp_path / 'runs'),
           'DATA': str(tmp_path / 'arith'), 'EVAL_ARGS': '--eval_per_ops=10',
           'PREPARE_ARGS': '--train_per_ops=100 --val_per_ops=60 --max_ops=2'}
    first, again = (subprocess.run(['bash', 'lab/laptop.sh', *SMALL], capture_output=True, text=True,
                                   cwd=ROOT, env=env, timeout=600) for _ in range(2))
    assert first.returncode == 0, first.stdout + first.stderr
    assert '0 of 2 runs finished; running 2, 2 at a time' in first.stdout
    for router in ('none', 'static'):
        run = tmp_path / 'runs' / f'{router}_s1'
        result = json.loads((run / 'arith_eval.json').read_text())
        assert result['step'] == 4 and set(result['n']) == {'1', '2'}
        assert json.loads((run / 'time.json').read_text())['train_wall_s'] > 0
    assert 'held-out exact match at 2 operators, %, by seed' in first.stdout
    assert 'static - none, seed by seed: ' in first.stdout and 'better in ' in first.stdout
    assert '| seed | none cpu | none wall | static cpu | static wall |' in first.stdout
    assert again.returncode == 0 and '2 of 2 runs finished; running 0' in again.stdout, again.stderr
