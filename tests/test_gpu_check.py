"""
lab/gpu_check.py on a machine without a GPU: its parts small (but its last, the kernel tests,
which the suite runs anyway), the report printed and written; the gradients part's pass rule,
which a router whose gradient is lost must fail; a typo in a key.

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


def bullets(text):
    return [line for line in text.splitlines() if line.startswith('- ')]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the check takes minutes")
def test_gpu_check_on_a_cpu_runs_every_part_small_and_both_mixes_agree(tmp_path):
    report = tmp_path / 'report.md'
    result = subprocess.run([sys.executable, '-m', 'lab.gpu_check',
                             '--parts=self_check,gradients,training,profile,deep', '--steps=2',
                             f'--report={report}'], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    assert text.strip() == result.stdout.strip()
    assert f"torch {torch.__version__}" in text and 'no CUDA GPU' in text
    assert '## 6.' not in text and 'Left out' not in text  # not asked for; all within the budget
    presets = sorted(os.path.relpath(path, ROOT) for path in glob.glob(f'{ROOT}/config/*.py'))
    checks = rows(section(text, '## 1. Self-check'))
    assert [row[0] for row in checks] == presets
    assert all(row[3].startswith('passed') and row[4].startswith('passed') for row in checks)
    # compiled memory.py against the eager definition: every parameter within bf16's bounds
    gradients = rows(section(text, '## 2. Gradients'))
    assert [row[1] for row in gradients] == ['static', 'dynamic']
    assert all(row[3].startswith('passed') for row in gradients), gradients
    assert all('graph breaks' in row[8] for row in gradients)
    # train.py under torchrun: the definition and memory.py to the same losses (float32 on a CPU)
    training = section(text, '## 3. Training')
    runs = rows(training)
    assert [row[:2] for row in runs] == [['none', '-'], ['static', 'definition'],
                                         ['static', 'memory.py'], ['dynamic', 'definition'],
                                         ['dynamic', 'memory.py']], training
    for definition, fast in (runs[1:3], runs[3:5]):  # val loss, losses, val loss: to 4 places
        assert definition[2:6] == fast[2:6], training
    assert all(float(run[5]) < float(run[2]) for run in runs), training  # the loss moved
    gaps = bullets(training)
    assert [line.split(':')[0] for line in gaps] == ['- static', '- dynamic']
    assert all('(within 0.05' in line for line in gaps), gaps
    # the mix's ops, each router, and attention's backend
    profile = section(text, '## 4. Profile')
    ops = rows(profile)
    assert {'aten::mm', 'aten::baddbmm_'} <= {row[1] for row in ops if row[0] == 'static'}, ops
    assert 'aten::bmm' in {row[1] for row in ops if row[0] == 'dynamic'}, ops
    lines = bullets(profile)
    assert lines[0].startswith('- static, all its ops') and lines[1].startswith('- dynamic')
    assert lines[2].startswith('- SDPA') and 'flash ran' in lines[2], lines
    assert [row[0] for row in rows(section(text, '## 5. 64 layers'))] == ['static', 'dynamic',
                                                                          'none']
    for name in ('self_check', 'gradients', 'training', 'profile', 'deep'):
        assert f"\n({name}: " in text


@pytest.mark.parametrize('router, parameter', [('static', 'blocks.1.attn.router.weight'),
                                               ('dynamic', 'blocks.1.attn.router.proj.weight')])
def test_the_gradients_pass_rule_fails_a_router_whose_gradient_is_lost(router, parameter):
    # The rule the training part's loss curves could not be: they agreed with a router's gradient
    # replaced by zeros. One compiled step's gradients, judged as they are, then with that zero.
    # (The report's tiny model: its compiled graphs are in inductor's cache from the test above.)
    from lab import gpu_check
    cfg = gpu_check.model_config(gpu_check.ON_A_CPU, router=router)
    reference, alone, fast, _ = gpu_check.gradient_sets(cfg)
    errors, failed = gpu_check.judge(reference, alone, fast)
    assert failed == [] and len(errors) == len(reference), errors
    fast[parameter] = torch.zeros_like(fast[parameter])
    assert gpu_check.judge(reference, alone, fast)[1] == [parameter]


def test_gpu_check_refuses_a_typo_in_one_line():
    result = subprocess.run([sys.executable, '-m', 'lab.gpu_check', '--stepz=2'], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --stepz: unknown key 'stepz' (did you mean steps?)"
