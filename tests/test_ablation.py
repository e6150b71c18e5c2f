"""
Tests for exercises/ablation.py, exercise 6's experiment: every router of a seed starts from the
same weights, and a tiny run trains each router at each seed and prints the table. They train the
repo's answer, exercises/answers.py, named on the command line (never LIME_EXERCISES, which names
a student's file for the checks), and skip in a student's copy, which has no answers.py.

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
# A RestrictedRouter as exercises/student.py hands it out, whatever a student has made of theirs.
UNWRITTEN = '''from lime import StaticRouter


class RestrictedRouter(StaticRouter):
    def __init__(self, config, layer_idx, k, which):
        super().__init__(config, layer_idx)
        raise NotImplementedError
'''


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
    env = {key: value for key, value in os.environ.items() if key != 'LIME_EXERCISES'}
    env['OMP_NUM_THREADS'] = '1'
    result = subprocess.run([sys.executable, '-m', 'exercises.ablation', *tiny,
                             '--routers=none,all,first,last', f'--exercises={ANSWERS}'],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for seed in (1, 2):
        for name in ('none', 'all', 'first', 'last'):
            assert any(line.startswith(f'seed {seed}, {name}: ') for line in lines), result.stdout
    assert '| seed | none | all | first | last |' in lines and '| 2 | ' in result.stdout
    assert any(line.startswith('first vs all: lower in ') for line in lines), result.stdout
    unwritten = tmp_path / 'unwritten.py'
    unwritten.write_text(UNWRITTEN)
    result = subprocess.run([sys.executable, '-m', 'exercises.ablation', *tiny,
                             f'--exercises={unwritten}'], capture_output=True, text=True, cwd=ROOT,
                            env=env, timeout=300)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        f"error: {unwritten}: RestrictedRouter is not written yet (exercise 6)")
