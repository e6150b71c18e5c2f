"""
lab/gpu_check.py on a machine without a GPU: the self-check at every preset on the CPU, and the
training parts with a tiny model (float32, eager), the report printed and written. Its first part
runs tests/test_kernels.py, which the suite runs anyway: not asked for here.

    python -m pytest -q tests/test_gpu_check.py
"""
import glob
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def section(text, heading):
    return text.split(heading)[1].split('\n## ')[0]


def rows(text):
    """A markdown table's rows under the header, as lists of cells."""
    lines = [line for line in text.splitlines() if line.startswith('| ')]
    return [[c.strip() for c in line.split('|')[1:-1]] for line in lines[1:]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the check takes minutes")
def test_gpu_check_on_a_cpu_checks_every_preset_and_trains_both_mixes_to_the_same_losses(tmp_path):
    report = tmp_path / 'report.md'
    result = subprocess.run([sys.executable, '-m', 'lab.gpu_check',
                             '--parts=self_check,training,deep', '--steps=12', '--deep_steps=2',
                             '--batch_size=2', f'--report={report}'], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    assert text.strip() == result.stdout.strip()
    assert f"torch {torch.__version__}" in text and 'no CUDA GPU' in text
    assert '## 1.' not in text  # not asked for
    presets = sorted(os.path.relpath(path, ROOT) for path in glob.glob(f'{ROOT}/config/*.py'))
    checks = rows(section(text, '## 2. Self-check'))
    assert [row[0] for row in checks] == presets
    assert all(row[3].startswith('passed') and row[4].startswith('passed') for row in checks)
    training = section(text, '## 3. Training')
    runs = rows(training)
    assert [row[:2] for row in runs] == [['none', '-'], ['static', 'definition'],
                                         ['static', 'memory.py'], ['dynamic', 'definition'],
                                         ['dynamic', 'memory.py']]
    for definition, fast in (runs[1:3], runs[3:5]):  # the same first and last loss, to 4 places
        assert definition[2:4] == fast[2:4], training
    gaps = [line for line in training.splitlines() if line.startswith('- ')]
    assert [line.split(':')[0] for line in gaps] == ['- static', '- dynamic']
    assert all('(within bf16 noise' in line for line in gaps), gaps
    assert [row[:2] for row in rows(section(text, '## 4. 64 layers'))] == [
        ['none', '-'], ['static', 'memory.py'], ['dynamic', 'memory.py']]
    for name in ('self_check', 'training', 'deep'):
        assert f"\n({name}: " in text


def test_gpu_check_refuses_a_typo_in_one_line():
    result = subprocess.run([sys.executable, '-m', 'lab.gpu_check', '--stepz=2'], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --stepz: unknown key 'stepz' (did you mean steps?)"
