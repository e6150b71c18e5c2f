"""
exercises/ablation.py: a seed's routers start from the same other weights; a tiny run trains the
repo's answer and prints the table; an unwritten router, or no file, stops it before any data.
"""
import pytest
import torch

from conftest import run
from exercises import ROOT, ablation, load

ANSWERS = ROOT / 'exercises' / 'answers.py'
needs_answers = pytest.mark.skipif(not ANSWERS.is_file(), reason="exercises/answers.py is not in "
                                   "this copy (a student's handout leaves it out)")


@needs_answers
def test_ablation_starts_every_router_of_a_seed_from_the_same_other_weights():
    models = {name: ablation.build(name, 3, load(ANSWERS).RestrictedRouter)
              for name in ablation.ROUTERS}
    for name, model in models.items():
        weights = dict(model.named_parameters())
        for key, weight in models['none'].named_parameters():  # every weight but the routers'
            assert torch.equal(weights[key], weight), (name, key)
    routers = [r.weight.shape for r in models['first'].routers()]
    assert routers[:2] == [(4, 8), (4, 12)] and routers[-1] == (4, 12)  # k = 2 earlier, and its own


@needs_answers
def test_ablation_trains_each_router_at_each_seed_and_prints_the_table(bytes_dir):
    result = run('exercises/ablation.py', f'--data_dir={bytes_dir}', '--n_layer=4', '--n_embd=32',
                 '--block_size=32', '--batch_size=4', '--max_iters=3', '--warmup_iters=1',
                 '--seeds=2', '--k=1', '--routers=none,all,first,last', f'--exercises={ANSWERS}')
    lines = result.stdout.splitlines()
    for seed in (1, 2):
        for name in ('none', 'all', 'first', 'last'):
            assert any(line.startswith(f'seed {seed}, {name}: ') for line in lines), result.stdout
    assert '| seed | none | all | first | last |' in lines and '| 2 | ' in result.stdout
    assert any(line.startswith('first - all, seed by seed: ') for line in lines), result.stdout


def test_ablation_stops_on_an_unwritten_router_or_a_missing_file_before_any_data(tmp_path):
    unwritten = tmp_path / 'unwritten.py'
    unwritten.write_text("from lime import StaticRouter\n\n\nclass RestrictedRouter(StaticRouter):"
                         "\n    def __init__(self, *args):\n        raise NotImplementedError\n")
    data = tmp_path / 'no_data_yet'  # were it made or read, the run would have gone too far
    result = run('exercises/ablation.py', f'--exercises={unwritten}', f'--data_dir={data}',
                 check=False)
    assert result.returncode == 1 and not data.exists() and result.stdout == ''
    assert result.stderr.strip() == (
        f"error: {unwritten}: RestrictedRouter (exercise 6): not written yet ({unwritten} still "
        "raises NotImplementedError); its check: LIME_EXERCISES="
        f"{unwritten} python -m pytest -q tests/test_exercises.py -k RestrictedRouter")
    missing = run('exercises/ablation.py', f'--exercises={tmp_path / "mine.py"}', check=False)
    assert missing.stderr.strip() == f"error: {tmp_path / 'mine.py'}: no exercises file at " \
                                     f"{tmp_path / 'mine.py'}"
