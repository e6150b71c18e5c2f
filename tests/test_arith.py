"""
Tests for lab/arith.py: the expressions and their solutions, the shards it writes, and its
exact-match scoring (its command end to end, with train.py between: tests/test_laptop_experiment.py).
"""
import json
import os
import random
import re
from fractions import Fraction  # noqa: F401 (the evaluated expressions name it)

import numpy as np
import pytest
import torch

from conftest import run
from lab import arith
from prepare import read_shard


def prepare(out_dir, *args):
    return run('lab/arith.py', '--mode=prepare', f'--out_dir={out_dir}', '--train_per_ops=200',
               '--val_per_ops=50', '--max_ops=3', *args)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp('data') / 'arith'
    prepare(out)
    return str(out)


def python_value(expression, p):
    """The expression's value mod p by Python's own parser and precedence, computed over the
    rationals: no divisor is 0 mod p, so the rationals' value maps onto Z_p's."""
    value = eval(re.sub(r'\d+', lambda m: f'Fraction({m.group()})', expression))
    return value.numerator * pow(value.denominator, -1, p) % p


def operator_count(expression):
    return sum(expression.count(op) for op in arith.OPS)


@pytest.mark.parametrize('p', [2, 11, 101])
def test_every_expression_and_every_step_evaluates_to_the_answer_in_python(p):
    rng = random.Random(p)
    for n_ops in range(1, 8):
        for _ in range(200):
            expression, steps = arith.make_example(rng, n_ops, p, cot=True)
            answer = int(steps[-1])
            assert python_value(expression, p) == answer, (expression, steps)
            for step in steps:
                assert python_value(step, p) == answer, (expression, step)


def test_operator_counts_one_operation_a_step_and_direct_answers():
    rng = random.Random(1)
    for n_ops in range(1, 9):
        expression, steps = arith.make_example(rng, n_ops, 11, cot=True)
        assert operator_count(expression) == n_ops, expression
        assert len(re.findall(r'\d+', expression)) == n_ops + 1, expression
        assert [operator_count(step) for step in steps] == list(range(n_ops - 1, -1, -1)), steps
        assert steps[-1].isdigit() and 0 <= int(steps[-1]) < 11
    expression, steps = arith.make_example(rng, 4, 11, cot=False)
    assert len(steps) == 1 and python_value(expression, 11) == int(steps[0])


def test_solution_steps_follow_the_papers_example():
    """Paper, Appendix B: (7 + 5) / (6 + 4 x 3 - 2 x 7); a modulus above every value keeps plain integers."""
    tokens = re.findall(r'\d+|\S', '(7+5)/(6+4*3-2*7)')
    assert arith.solve(tokens, 1009) == ['12/(6+4*3-2*7)', '12/(6+12-2*7)', '12/(18-2*7)', '12/(18-14)',
                                         '12/4', '3']


def test_encode_decode_round_trip():
    rng = random.Random(2)
    text = ''.join(arith.example_text(*arith.make_example(rng, n, 11, True)) for n in range(1, 7))
    ids = arith.encode(text)
    assert ids.max() < len(arith.VOCAB) and arith.decode(ids) == text
    assert arith.decode(arith.encode(arith.VOCAB)) == arith.VOCAB


def test_prepare_writes_shards_read_shard_accepts_with_tokens_in_the_vocabulary(data_dir):
    with open(os.path.join(data_dir, 'task.json')) as f:
        task = json.load(f)
    assert task['vocab'] == arith.VOCAB and (task['min_ops'], task['max_ops']) == (1, 3)
    for name, per_ops in (('arith_val_000000.bin', 50), ('arith_train_000001.bin', 200)):
        tokens = read_shard(os.path.join(data_dir, name))
        assert tokens.max() < len(arith.VOCAB)
        lines = arith.decode(tokens).split(arith.END)
        assert lines[-1] == ''  # the shard ends with a whole example
        counts = [operator_count(line.split('=', 1)[0]) for line in lines[:-1]]
        assert sorted(counts) == [n for n in (1, 2, 3) for _ in range(per_ops)]
        for line in lines[:-1]:
            expression, *steps = line.split('=')
            assert python_value(expression, 11) == int(steps[-1]), line


def test_prepare_again_keeps_the_data_set_and_refuses_to_replace_it(data_dir, monkeypatch, capsys,
                                                                  tmp_path):
    # Runs may have trained on it: the same settings keep it, others are refused, nothing changes.
    shards = {name: read_shard(os.path.join(data_dir, name)).tobytes()
              for name in ('arith_val_000000.bin', 'arith_train_000001.bin')}
    with open(os.path.join(data_dir, 'task.json')) as f:
        task = json.load(f)
    monkeypatch.setattr(arith, 'out_dir', data_dir)
    arith.run_prepare(task)
    assert 'already holds this data set: kept' in capsys.readouterr().out
    with pytest.raises(SystemExit, match='^error: .* holds another data set, which runs may have'):
        arith.run_prepare({**task, 'seed': 7})
    assert {name: read_shard(os.path.join(data_dir, name)).tobytes() for name in shards} == shards
    prepare(tmp_path / 'other', '--seed=7')  # another seed, other data
    assert read_shard(tmp_path / 'other' / 'arith_val_000000.bin')[:1000].tobytes() != shards[
        'arith_val_000000.bin'][:2000]


def test_eval_sets_are_distinct_reproducible_and_not_the_training_stream(data_dir):
    task = {'seed': 1337, 'modulus': 11, 'cot': True}  # the fixture's data: same seed
    examples = arith.eval_set(3, 100, task)
    assert len(examples) == 100 and arith.eval_set(3, 100, task) == examples
    assert all(operator_count(expression) == 3 for expression in examples)
    # millions of expressions have 3 operators and training holds 200: another stream hardly meets them
    assert len(set(examples) & arith.training_expressions(data_dir)) <= 2
    # one operator: 3 x 11 x 11 expressions with + - *, and 11 x 10 with / (no divisor 0)
    assert len(arith.eval_set(1, 1000, task)) == 3 * 11 * 11 + 11 * 10


def test_final_answer_is_what_follows_the_last_equals_sign_before_the_end():
    assert arith.final_answer('1/(7-3)=1/4=3\n5+') == '3'
    assert arith.final_answer('7\n') == '7'  # a direct answer: the prompt ended with the '='
    assert arith.final_answer('1/4=3') is None  # never ended
    assert arith.final_answer('1/4=\n') == ''


class FakeModel:
    """Stands in for GPT.generate: completes each prompt with a scripted text, padded with end tokens,
    and records the prompts of each call."""

    def __init__(self, completions):
        self.completions, self.calls = completions, []

    def generate(self, idx, max_new_tokens, temperature=1.0):
        assert temperature == 0
        prompts = [arith.decode(row) for row in idx.tolist()]
        self.calls.append(prompts)
        rows = []
        for prompt in prompts:
            assert prompt[0] == arith.END and prompt[-1] == '='
            text = (self.completions[prompt[1:-1]] + arith.END * max_new_tokens)[:max_new_tokens]
            rows.append(arith.encode(text).astype(np.int64))
        return torch.cat((idx, torch.from_numpy(np.stack(rows))), dim=1)


def test_exact_match_keeps_only_solutions_that_end_with_the_right_answer():
    examples = {'1+2': ['3'], '2*3': ['6'], '4-1': ['3'], '(1+2)*3': ['3*3', '9'], '2*(3+4)': ['2*7', '3']}
    model = FakeModel({
        '1+2': '3',  # right
        '2*3': '7',  # wrong answer
        '4-1': '3+3+3+3+3+3+3+3+3+3',  # right digits, but it never ends
        '(1+2)*3': '3*3=9',  # right, through the steps
        '2*(3+4)': '2*7=2*7=3',  # right answer after a detour: the answer is what counts
    })
    assert arith.solved(model, examples) == {'1+2', '(1+2)*3', '2*(3+4)'}
    # One call per prompt length (3 and 7 characters): the fake looks each prompt up whole, so a
    # padded one would fail.
    assert len(model.calls) == 2
