"""
The depth experiment on text (lab/depth_text.sh with config/depth_text.py), end to end at a tiny
size: byte-level data from a small text, 1- and 2-layer runs of each router, the tables, the
figure, and a second call that keeps the finished runs.

    python -m pytest -q tests/test_depth_text.py
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--n_embd=32', '--n_head=2', '--block_size=32', '--batch_size=2', '--max_iters=2',
        '--eval_interval=2', '--eval_iters=1', '--log_interval=1', '--warmup_iters=1']


# Run once, where matplotlib is installed (.ci/run's optional half): it trains, draws the
# figure, then checks the tables with matplotlib blocked, as a user without it has them.
@pytest.mark.optional
@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None,
                    reason='needs matplotlib: draws its figure, then runs again with it blocked')
@pytest.mark.skipif(shutil.which('bash') is None, reason='lab/depth_text.sh is a bash script')
def test_depth_command_trains_every_depth_router_and_seed_tabulates_and_keeps_its_runs(tmp_path):
    text = tmp_path / 'docs.txt'
    text.write_text("Every byte is a token: café, 日本語. " * 300, encoding='utf-8')
    data = tmp_path / 'bytes'
    subprocess.run([sys.executable, 'prepare.py', '--input', str(text), '--tokenizer=bytes',
                    f'--out_dir={data}', '--workers=1'], cwd=ROOT, check=True, capture_output=True)
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', '')
    env = {**os.environ, 'PATH': path, 'DEPTHS': '1 2', 'SEEDS': '1', 'JOBS': '2',
           'OUT': str(tmp_path / 'runs'), 'DATA': str(data)}
    result = subprocess.run(['bash', 'lab/depth_text.sh', *TINY], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for depth in (1, 2):
        for router in ('none', 'static'):
            run = tmp_path / 'runs' / f'L{depth}_{router}_s1'
            header = json.loads((run / 'log.txt').read_text().splitlines()[0])
            assert header['config']['n_layer'] == depth and header['config']['router'] == router
            assert header['config']['tokenizer'] == 'bytes'
        assert f"{depth} layers: final validation loss (bits per byte)" in result.stdout
        assert f"{depth} layers: static below none in" in result.stdout
    figure = tmp_path / 'runs' / 'loss_curves.png'
    assert figure.exists()
    # Again, with `import matplotlib` failing in every python: the finished runs are kept, and
    # the tables print without the figure.
    figure.unlink(missing_ok=True)
    blocked = tmp_path / 'blocked' / 'matplotlib'
    blocked.mkdir(parents=True)
    (blocked / '__init__.py').write_text("raise ImportError('matplotlib is blocked here')\n")
    again = subprocess.run(['bash', 'lab/depth_text.sh', *TINY], capture_output=True, text=True,
                           cwd=ROOT, env={**env, 'PYTHONPATH': str(blocked.parent)}, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count('kept: ') == 4 and 'start: ' not in again.stdout
    assert "1 layers: final validation loss (bits per byte)" in again.stdout
    assert again.stdout.strip().splitlines()[-1] == (
        "no figure: matplotlib is not installed (pip install matplotlib); the tables above stand")
    assert not figure.exists()
