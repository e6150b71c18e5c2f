"""
lab/gpu_check.py on a machine without a GPU: every part but the kernel tests (which the suite runs
anyway) small, one report printed and written; the pass rule on the gradients, which a router
whose gradient is lost must fail, compiled in bf16 as on a GPU; the time limit, which leaves
pieces out and says so; a typo in a key, in one line.

    python -m pytest -q tests/test_gpu_check.py
"""
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADINGS = ['## Self-check at every preset', '## Gradients at every preset',
            '## Training step: each mix', "## Profile: the mix's kernels alone",
            '## 64 layers: each mix', '## train.py under torchrun']
MIXES = [['none', '-'], ['static', 'before'], ['static', 'definition'],
         ['dynamic', 'definition'], ['static', 'memory.py'], ['dynamic', 'memory.py']]


def gpu_check(*args, timeout=600):
    return subprocess.run([sys.executable, '-m', 'lab.gpu_check', *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def section(text, heading):
    return text.split(heading)[1].split('\n## ')[0]


def rows(text):
    """A markdown table's rows under the header, as lists of cells."""
    lines = [line for line in text.splitlines() if line.startswith('| ')]
    return [[c.strip() for c in line.split('|')[1:-1]] for line in lines[1:]]


def bullets(text):
    return [line for line in text.splitlines() if line.startswith('- ')]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the check takes minutes")
def test_gpu_check_on_a_cpu_runs_every_part_small_into_one_report(tmp_path):
    report = tmp_path / 'report.md'
    result = gpu_check('--parts=self_check,gradients,training,profile,deep,train_py',
                       '--presets=config/gpt2.py', '--steps=2', f'--report={report}')
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    assert text.strip() == result.stdout.strip()
    assert text.startswith('# lab/gpu_check.py report\n')
    assert f"torch {torch.__version__}" in text and 'no CUDA GPU' in text and 'commit ' in text
    assert [line for line in text.splitlines() if line.startswith('## ')] == HEADINGS
    assert 'Left out' not in text and 'FAILED' not in text  # all within the time given
    assert all(row[1:] == ['passed', 'passed'] for row in rows(section(text, HEADINGS[0])))
    # every mix's first step's gradients against the eager definition's, the baseline first
    for heading, mixes in ((HEADINGS[1], MIXES[1:]), (HEADINGS[2], MIXES), (HEADINGS[4], MIXES)):
        table = rows(section(text, heading))
        assert [row[1:3] for row in table] == mixes, table
        assert all(row[3].startswith('passed') for row in table), table  # (not which kernel)
    assert [row[0] for row in rows(section(text, HEADINGS[4]))] == ['config/deep.py'] * 6
    # the mix's ops, each router, against the floor
    profile = section(text, HEADINGS[3])
    ops = rows(profile)
    # (which aten ops a mix becomes is torch's choice, by shape and build: only that it names some)
    assert {row[0] for row in ops} == {'static', 'dynamic'} and all(row[1] for row in ops), ops
    assert [line.split(',')[0] for line in bullets(profile)] == ['- static', '- dynamic']
    # train.py under torchrun: the definition and memory.py to the same losses (float32)
    training = section(text, HEADINGS[5])
    runs = rows(training)
    assert [row[:2] for row in runs] == [['none', 'None'], ['static', 'False'],
                                         ['static', 'True'], ['dynamic', 'False'],
                                         ['dynamic', 'True']], training
    for definition, fast in (runs[1:3], runs[3:5]):  # val loss, losses, val loss: to 4 places
        assert definition[2:6] == fast[2:6], training
    assert all(float(run[5]) < float(run[2]) for run in runs), training  # the loss moved
    assert [line.split(':')[0] for line in bullets(training)] == ['- static', '- dynamic']
    assert all('(within 0.05)' in line for line in bullets(training)), training


@pytest.mark.parametrize('router, parameter', [('static', 'blocks.3.attn.router.weight'),
                                               ('dynamic', 'blocks.1.attn.router.proj.weight')])
def test_the_gradients_pass_rule_fails_a_router_whose_gradient_is_lost(router, parameter):
    # A rule that loss curves could not be: they agreed with a router's gradient replaced by
    # zeros. One compiled bf16 step's gradients with lime.py's definition (a GPU's default), as on
    # a GPU, judged as they are, then with that zero.
    from lab import gpu_check
    cfg = replace(gpu_check.preset_model('config/gpt2.py')[0], router=router)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size + 1))
    reference, alone = gpu_check.reference_gradients(cfg, x)
    torch._dynamo.reset()
    with gpu_check.mix('definition'):
        model = gpu_check.seeded_model(cfg)
        with torch.autocast('cpu', torch.bfloat16):
            _, loss = torch.compile(model)(x[:, :-1], x[:, 1:])
        loss.backward()
    fast = gpu_check.gradients(model)
    errors, failed = gpu_check.judge(reference, alone, fast)
    assert failed == [] and len(errors) == len(reference), gpu_check.verdict(errors, failed)
    fast[parameter] = torch.zeros_like(fast[parameter])
    assert gpu_check.judge(reference, alone, fast)[1] == [parameter]


def test_the_static_definition_before_the_head_major_change_gives_lime_pys_numbers():
    # The training part's comparison is of two codes for the same numbers; the old one is swapped
    # in for the comparison, and lime.py's put back after it
    from lab import gpu_check
    from lime import StaticRouter
    cfg = replace(gpu_check.preset_model('config/gpt2.py')[0], router='static')
    x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
    forward = StaticRouter.forward
    logits = {}
    for mix in ('definition', 'before'):
        with gpu_check.mix(mix):
            logits[mix] = gpu_check.seeded_model(cfg)(x)[0]
    assert StaticRouter.forward is forward
    torch.testing.assert_close(logits['before'], logits['definition'])


def test_gpu_check_leaves_out_what_its_time_does_not_allow_and_says_so(tmp_path):
    # --minutes shorter than the report's last seconds: no piece may start
    result = gpu_check('--parts=training', '--minutes=0.01', f'--report={tmp_path / "r.md"}')
    assert result.returncode == 0, result.stderr
    left = [line for line in result.stdout.splitlines() if line.startswith('Left out')]
    assert left == ["Left out, the time spent: config/gpt2.py static before, config/gpt2.py "
                    "static definition, config/gpt2.py none, config/gpt2.py dynamic definition, "
                    "config/gpt2.py static memory.py, config/gpt2.py dynamic memory.py."]


def test_gpu_check_refuses_a_typo_in_one_line():
    result = gpu_check('--stepz=2')
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --stepz: unknown key 'stepz' (did you mean steps?)"
    result = gpu_check('--parts=training,speed')
    assert result.stderr.strip() == ("error: parts: 'speed' is not one of self_check, gradients, "
                                     "training, profile, deep, tests, train_py")
