"""
lab/gpu_check.py on a machine without a GPU: it runs as far as a CPU allows (the self-check at
every preset, under Triton's interpreter), says why it skips the rest, and writes its report.

    python -m pytest -q tests/test_gpu_check.py
"""
import glob
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip('triton', reason="the fused kernels need triton (pip install triton)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the whole check takes minutes")
def test_gpu_check_on_a_cpu_runs_the_self_checks_and_says_why_it_skips_the_rest(tmp_path):
    report = tmp_path / 'report.md'
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    result = subprocess.run([sys.executable, '-m', 'lab.gpu_check', '--steps=2',
                             f'--report={report}'], cwd=ROOT, capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    assert text.strip() == result.stdout.strip()
    assert f"torch {torch.__version__}" in text and 'no CUDA GPU' in text
    for part in ('## 1. Kernel tests', '## 3. Training', '## 4. compute-sanitizer'):
        section = text.split(part)[1].split('##')[0]
        assert 'skipped: no CUDA GPU' in section, section
    checks = text.split('## 2.')[1].split('##')[0]
    for path in glob.glob(os.path.join(ROOT, 'config', '*.py')):
        name = os.path.relpath(path, ROOT)
        assert f"{name} " in checks and checks.count(f"{name} ") == 2, (name, checks)
    assert checks.count(': passed') == 2 * len(glob.glob(os.path.join(ROOT, 'config', '*.py')))


def test_gpu_check_refuses_a_typo_in_one_line():
    result = subprocess.run([sys.executable, '-m', 'lab.gpu_check', '--stepz=2'], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --stepz: unknown key 'stepz' (did you mean steps?)"
