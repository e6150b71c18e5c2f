"""
Tests for exercises/ablation.py, exercise 6's experiment: every router of a seed starts from the
same weights, a tiny run trains each router at each seed and prints the table, and a router not
written yet, or a file not there, stops it in one line before any data or training. The runs
train the repo's answer, exercises/answers.py, named on the command line (never LIME_EXERCISES,
which names a student's file for the checks), and skip in a student's copy, which has no
answers.py.

    python -m pytest -q tests/test_ablation.py
"""
import os
import subprocess
import sys

import pytest
import torch

import prepare
from exercises import ROOT, ablation, load

ANSWERS = ROOT / 'exercises' / 'answers.py'
needs_answers = pytest.mark.skipif(
    not ANSWERS.is_file(), reason="exercises/answers.py is not in this copy (a student's handout "
    "leaves it out): the ablation's tests train the repo's RestrictedRouter")
# A RestrictedRouter not written yet, whatever a student has made of theirs.
UNWRITTEN = '''from lime import StaticRouter


class RestrictedRouter(StaticRouter):
    def __init__(self, *args):
        raise NotImplementedError
'''


def run_ablation(*args, env=None):
    """python -m exercises.ablation args, run from the repo root without LIME_EXERCISES."""
    env = {key: value for key, value in os.environ.items() if key != 'LIME_EXERCISES'} | (env or {})
    env['OMP_NUM_THREADS'] = '1'
    return subprocess.run([sys.executable, '-m', 'exercises.ablation', *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)


@needs_answers
def test_ablation_starts_every_router_of_a_seed_from_the_same_other_weights():
    RestrictedRouter = load(ANSWERS).RestrictedRouter
    models = {name: ablation.build(name, 3, RestrictedRouter) for name in ablation.ROUTERS}
    baseline = dict(models['none'].named_parameters())  # every weight but the routers'
    for name, model in models.items():
        weights = dict(model.named_parameters())
        for key, weight in baseline.items():
            assert torch.equal(weights[key], weight), (name, key)
    routers = [r.weight.shape for r in models['first'].routers()]
    assert routers[:2] == [(4, 8), (4, 12)] and routers[-1] == (4, 12)  # k = 2 earlier, and its own


@needs_answers
def test_ablation_trains_each_router_at_each_seed_and_compares_them(tmp_path):
    data = tmp_path / 'data'
    prepare.main(['--out_dir', str(data), '--workers', '1', '--tokenizer', 'bytes'])
    tiny = [f'--data_dir={data}', '--n_layer=4', '--n_embd=32', '--block_size=32', '--batch_size=4',
            '--max_iters=3', '--warmup_iters=1', '--seeds=2', '--k=1']
    result = run_ablation(*tiny, '--routers=none,all,first,last', f'--exercises={ANSWERS}')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for seed in (1, 2):
        for name in ('none', 'all', 'first', 'last'):
            assert any(line.startswith(f'seed {seed}, {name}: ') for line in lines), result.stdout
    assert '| seed | none | all | first | last |' in lines and '| 2 | ' in result.stdout
    assert any(line.startswith('first vs all: lower in ') for line in lines), result.stdout


def test_ablation_reports_an_unwritten_router_before_any_data_or_training(tmp_path):
    unwritten = tmp_path / 'unwritten.py'
    unwritten.write_text(UNWRITTEN)
    data = tmp_path / 'no_data_yet'  # were it made or read, the run would have gone too far
    result = run_ablation(f'--exercises={unwritten}', f'--data_dir={data}')
    assert result.returncode == 1 and not data.exists() and result.stdout == ''
    assert result.stderr.strip().splitlines() == [
        f"error: {unwritten}: RestrictedRouter (exercise 6): not written yet ({unwritten} still "
        "raises NotImplementedError); its check: LIME_EXERCISES="
        f"{unwritten} python -m pytest -q tests/test_exercises.py -k RestrictedRouter"]


def test_ablation_blames_only_what_named_a_missing_file(tmp_path):
    missing = tmp_path / 'mine.py'
    by_flag = run_ablation(f'--exercises={missing}')
    assert by_flag.stderr.strip() == f"error: --exercises={missing}: no exercises file at {missing}"
    by_env = run_ablation(env={'LIME_EXERCISES': str(missing)})
    assert by_env.stderr.strip() == (f"error: LIME_EXERCISES={missing}: no exercises file at "
                                     f"{missing}")
