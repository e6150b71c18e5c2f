"""
The laptop experiment's one command (lab/laptop.sh with config/arith_laptop.py), end to end at a tiny
size: a small data set, two 2-layer runs of a few steps, their scores, the tables and the figure.

    python -m pytest -q tests/test_laptop_experiment.py
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: scripts run from there
TINY = ['--n_layer=2', '--batch_size=2', '--max_iters=4', '--eval_interval=2', '--eval_iters=1', '--log_interval=1',
        '--warmup_iters=2']


def without_matplotlib(tmp_path, env):
    """env with `import matplotlib` failing in every python the script starts."""
    blocked = tmp_path / 'blocked' / 'matplotlib'
    blocked.mkdir(parents=True)
    (blocked / '__init__.py').write_text("raise ImportError('matplotlib is blocked here')\n")
    return {**env, 'PYTHONPATH': os.pathsep.join(filter(None, [str(blocked.parent),
                                                               env.get('PYTHONPATH')]))}


# Run once, where matplotlib is installed (.ci/run's optional half): it trains, draws the
# figure, then checks the tables with matplotlib blocked, as a user without it has them.
@pytest.mark.optional
@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None,
                    reason='needs matplotlib: draws its figure, then runs again with it blocked')
@pytest.mark.skipif(shutil.which('bash') is None, reason='lab/laptop.sh is a bash script')
def test_laptop_command_trains_scores_tabulates_and_keeps_its_runs(tmp_path):
    # The script's `python` is the one running the tests (with its packages), not another on PATH.
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', '')
    env = {**os.environ, 'PATH': path, 'SEEDS': '1', 'ROUTERS': 'none static', 'JOBS': '2',
           'OUT': str(tmp_path / 'runs'),
           'DATA': str(tmp_path / 'arith'), 'PREPARE_ARGS': '--train_per_ops=100 --val_per_ops=60 --max_ops=2',
           'EVAL_ARGS': '--eval_per_ops=10'}
    result = subprocess.run(['bash', 'lab/laptop.sh', *TINY], capture_output=True, text=True, cwd=ROOT,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for router in ('none', 'static'):
        run = tmp_path / 'runs' / f'{router}_s1'
        assert json.loads((run / 'arith_eval.json').read_text())['step'] == 4
        times = json.loads((run / 'time.json').read_text())
        assert set(times) == {'train_wall_s', 'train_cpu_s'} and times['train_wall_s'] > 0
    assert 'held-out exact match at 2 operators' in result.stdout
    assert 'static beats none in' in result.stdout and 'of 1 seed pairs' in result.stdout
    figure = tmp_path / 'runs' / 'arith_accuracy.png'
    assert figure.exists()
    # Run again without matplotlib: every finished run is kept, not trained again, and the
    # tables print without the figure.
    figure.unlink(missing_ok=True)
    again = subprocess.run(['bash', 'lab/laptop.sh', *TINY], capture_output=True, text=True,
                           cwd=ROOT, env=without_matplotlib(tmp_path, env), timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count('kept: ') == 2 and 'start: ' not in again.stdout
    assert 'held-out exact match at 2 operators' in again.stdout
    assert 'static beats none in' in again.stdout and 'of 1 seed pairs' in again.stdout
    assert again.stdout.strip().splitlines()[-1] == (
        "no figure: matplotlib is not installed (pip install matplotlib); the tables above stand")
    assert not figure.exists()
