"""
Tests for evaluate.py (multiple choice and bits per byte) and the evaluations train.py runs with it.
No network: the tasks are files the tests write.

    python -m pytest -q test_evaluate.py
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lab import evaluate
import prepare
from lime import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: scripts run from there
TINY = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
        '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=10', '--warmup_iters=2',
        '--learning_rate=1e-2', '--router_lr=1e-1', '--min_lr=1e-3']
# Two facts, each repeated: a model that learnt them must tell which object goes with which colour.
FACTS = "Alice has a red apple. Bob has a blue car. "
TASK = [{'context': 'Alice has a red', 'endings': ['car.', 'apple.'], 'label': 1},
        {'context': 'Bob has a blue', 'endings': ['car.', 'apple.'], 'label': 0}]


def run(script, *args, check=True):
    result = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True,
                            text=True, cwd=ROOT, timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    if check:
        assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result


def write_jsonl(path, records):
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))
    return path


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A tiny model trained on the facts, scoring the task every 20 steps, and its data and task."""
    root = tmp_path_factory.mktemp('evaluate')
    enc = prepare.gpt2_encoding()
    tokens = [prepare.EOT] + enc.encode_ordinary(FACTS * 60)
    (root / 'data').mkdir()
    prepare.write_shard(root / 'data' / 'facts_val_000000.bin', tokens[:300])
    prepare.write_shard(root / 'data' / 'facts_train_000001.bin', tokens)
    task = write_jsonl(root / 'task.jsonl', TASK)
    run('train.py', *TINY, f'--data_dir={root / "data"}', f'--out_dir={root / "run"}', '--max_iters=40',
        '--eval_interval=20', f'--mc_task={task}', '--mc_interval=20')
    return root


def test_a_trained_model_prefers_the_right_endings_and_train_py_logs_it(trained):
    result = run('lab/evaluate.py', f'--out_dir={trained / "run"}', f'--task={trained / "task.jsonl"}',
                 f'--data_dir={trained / "data"}')
    scores = json.loads(result.stdout.splitlines()[-1])
    assert scores['acc'] == scores['acc_norm'] == 1.0 and scores['examples'] == 2, result.stdout
    assert 0 < scores['bpb'] < 1, result.stdout  # the facts are easy: far below 8 bits a byte
    records = [json.loads(line) for line in (trained / 'run' / 'log.txt').read_text().splitlines()]
    val = [r for r in records if 'val_loss' in r]
    assert [r['step'] for r in val] == [0, 20, 40] and all(r['val_bpb'] > 0 for r in val)
    assert val[-1]['mc_acc'] == val[-1]['mc_acc_norm'] == 1.0 and all('mc_acc' in r for r in val)


def test_one_shot_puts_a_solved_example_first(trained):
    result = run('lab/evaluate.py', f'--out_dir={trained / "run"}', f'--task={trained / "task.jsonl"}',
                 '--shots=1', f'--train_file={trained / "task.jsonl"}')
    assert json.loads(result.stdout.splitlines()[-1])['shots'] == 1
    shot = evaluate.with_shots([('Q', ['a', 'b'], 0)], [('C', ['x', 'y'], 1)], 1, seed=0)
    assert shot == [('C y\n\nQ', ['a', 'b'], 0)]


def test_padding_and_batching_give_the_scores_of_one_ending_at_a_time():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=50257,
                          router='dynamic')).eval()
    enc = prepare.gpt2_encoding()
    example = ('The weather today is', ['sunny.', 'cold and wet, with rain all day long.', 'x'], 0)
    rows = evaluate.encode_example(enc, example, block_size=8)
    assert len(rows[1][0]) == 9  # the long ending is cut on the left to block_size + 1
    together = evaluate.score_endings(model, rows, 'cpu', torch.autocast('cpu', enabled=False))
    padded = evaluate.score_endings(model, rows, 'cpu', torch.autocast('cpu', enabled=False), 9, 5)
    for i, row in enumerate(rows):
        alone = evaluate.score_endings(model, [row], 'cpu', torch.autocast('cpu', enabled=False))
        for batched in (together, padded):
            torch.testing.assert_close(batched[0][i], alone[0][0])
            torch.testing.assert_close(batched[1][i], alone[1][0])


def test_bits_per_byte_equals_a_hand_computation():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=50257)).eval()
    enc = prepare.gpt2_encoding()
    docs = [enc.encode_ordinary(text) for text in ("Café naïve — déjà vu.", "A second one, in ASCII.")]
    tokens = np.array([prepare.EOT, *docs[0], prepare.EOT, *docs[1]], dtype=np.uint16)
    byte_lengths, why = evaluate.token_byte_lengths(50257, '')
    bpb, n = evaluate.bits_per_byte(model, tokens, byte_lengths, 8, 2, 'cpu',
                                    torch.autocast('cpu', enabled=False))
    # By hand: the windows' targets, their text's bytes (<|endoftext|> excluded) and their losses.
    windows = (len(tokens) - 1) // 8
    x = torch.tensor(tokens[:windows * 8].astype(np.int64)).view(windows, 8)
    y = torch.tensor(tokens[1:windows * 8 + 1].astype(np.int64)).view(windows, 8)
    text = y.flatten()[y.flatten() != prepare.EOT]
    nbytes = len(enc.decode_bytes(text.tolist()))
    losses = F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten(), reduction='none')
    nats = losses[y.flatten() != prepare.EOT].sum().item()
    assert n == windows * 8 and nbytes > len(text)  # some tokens hold several bytes
    assert math.isclose(bpb, nats / (math.log(2) * nbytes), rel_tol=1e-6)


def test_arith_characters_are_one_byte_and_an_unknown_vocabulary_has_no_bpb(tmp_path):
    (tmp_path / 'task.json').write_text(json.dumps({'vocab': '\n0123456789+-*/()='}))
    byte_lengths, _ = evaluate.token_byte_lengths(18, str(tmp_path))
    assert byte_lengths.tolist() == [1] * 18
    byte_lengths, why = evaluate.token_byte_lengths(100, str(tmp_path / 'elsewhere'))
    assert byte_lengths is None and 'not GPT-2' in why


def test_hellaswag_lines_are_read_as_they_are(tmp_path):
    path = write_jsonl(tmp_path / 'hs.jsonl', [{'ctx': 'A man', 'endings': ['a', 'b', 'c', 'd'], 'label': 2,
                                               'activity_label': 'x'}])
    assert evaluate.read_examples(str(path)) == [('A man', ['a', 'b', 'c', 'd'], 2)]


def test_two_processes_share_the_examples_and_log_the_scores_of_one(trained, tmp_path):
    task = write_jsonl(tmp_path / 'task3.jsonl', TASK + TASK[:1])  # 3 examples: 2 on one process, 1 on one
    torchrun = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                os.path.join(ROOT, 'train.py')]
    result = subprocess.run([*torchrun, *TINY, f'--data_dir={trained / "data"}', f'--out_dir={tmp_path}',
                             '--max_iters=4', '--eval_interval=4', '--gradient_accumulation_steps=2',
                             f'--mc_task={task}', '--mc_interval=4'],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert result.returncode == 0, result.stdout + result.stderr
    logged = [json.loads(line) for line in (tmp_path / 'log.txt').open()][-1]
    # The checkpoint holds the weights of that last evaluation: one process scores all 3 examples alike.
    result = run('lab/evaluate.py', f'--out_dir={tmp_path}', f'--task={task}')
    scores = json.loads(result.stdout.splitlines()[-1])
    assert (logged['mc_acc'], logged['mc_acc_norm']) == (scores['acc'], scores['acc_norm']), (logged, scores)
