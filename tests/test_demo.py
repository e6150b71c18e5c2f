"""
Tests for lab/demo.py, the class demonstration, at a tiny size: both runs train side by side and
their validation losses print as they come and at the end; the figure is drawn with matplotlib,
and without it one line says so (the numbers are printed before); a bad key is one line. (Whether
LIMe ends below the baseline at the full size is docs/teaching.md's measurement, not a test's.)

    python -m pytest -q tests/test_demo.py
"""
import importlib.util
import os
import subprocess
import sys

import pytest

from lab import demo as demo_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def arith(tmp_path_factory):
    data = tmp_path_factory.mktemp('arith') / 'data'
    subprocess.run([sys.executable, '-m', 'lab.arith', '--mode=prepare', f'--out_dir={data}',
                    '--train_per_ops=300', '--val_per_ops=150', '--max_ops=2'], cwd=ROOT,
                   check=True, capture_output=True)
    return data


def demo(*args, env=None):
    return subprocess.run([sys.executable, '-m', 'lab.demo', '--max_iters=4', *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


# Run once, where matplotlib is installed (.ci/run's optional half); the figure's absence
# without it is the next test's.
@pytest.mark.optional
@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None,
                    reason='needs matplotlib: draws its figure')
def test_demo_trains_both_side_by_side_and_prints_their_losses(arith, tmp_path):
    result = demo(f'--data_dir={arith}', f'--out_dir={tmp_path}')
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for step in (0, 4):
        assert any(line.startswith(f'step {step:>5}: validation loss none ') and ', static ' in line
                   for line in lines), result.stdout
    assert any(line.startswith('after 4 steps (') for line in lines), result.stdout
    for router in ('none', 'static'):
        assert (tmp_path / f'{router}_s1' / 'log.txt').is_file()
    assert (tmp_path / 'demo_s1.png').stat().st_size > 0


def test_demo_without_matplotlib_says_so_in_one_line_and_draws_nothing(monkeypatch, capsys,
                                                                        tmp_path):
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # `import matplotlib` fails
    demo_module.draw({'none': {0: 2.0, 4: 1.5}, 'static': {0: 2.0, 4: 1.4}}, tmp_path / 'd.png')
    assert capsys.readouterr().out == ("no figure: matplotlib is not installed (pip install "
                                       "matplotlib); the numbers above are the whole result\n")
    assert not (tmp_path / 'd.png').exists()


def test_demo_refuses_an_unknown_key_in_one_line():
    result = demo('--sed=3')
    assert result.returncode == 1 and result.stdout == ''
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --sed: unknown key 'sed'")
