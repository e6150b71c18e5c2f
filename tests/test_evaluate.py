"""
Tests for lab/evaluate.py: bits per byte (prepare.nats_and_bytes, which train.py reports with too),
multiple choice as build-nanogpt scores it, HellaSwag's download, and train.py's mc_task. No
network: the tasks are files the tests write.
"""
import json
import math
import os
import shutil
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import prepare
from conftest import TINY, run
from lab import evaluate
from lime import GPT, GPTConfig, load_model

BYTE_EOT = 256  # the byte-level vocabulary's document start, which has no bytes


def write_jsonl(path, records):
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))
    return path


@pytest.fixture
def small_bytes(tmp_path, bytes_dir):
    """A byte-level data directory whose validation shard is three short documents."""
    shutil.copy(os.path.join(bytes_dir, 'tokenizer.json'), tmp_path)
    docs = ['Café, naïve — déjà vu.', 'A second one, in ASCII.', 'Ünïcödé at the end.']
    tokens = [t for doc in docs for t in [BYTE_EOT, *doc.encode()]]
    prepare.write_shard(tmp_path / 'x_val_000000.bin', tokens)
    return tmp_path, np.array(tokens)


def test_bits_per_byte_is_the_loss_on_text_over_its_bytes(trained, small_bytes):
    data, tokens = small_bytes
    out = trained()
    result = run('lab/evaluate.py', f'--out_dir={out}', '--task=', f'--data_dir={data}',
                 '--device=cpu', '--batch_size=2')
    scores = json.loads(result.stdout.splitlines()[-1])
    # By hand, over the same whole windows of block_size + 1: <|endoftext|>'s loss left out, and
    # a byte a token otherwise (é is two).
    model, _ = load_model(os.path.join(out, 'ckpt.pt'), 'cpu')
    T = model.config.block_size
    windows = (len(tokens) - 1) // T
    x = torch.tensor(tokens[:windows * T]).view(windows, T)
    y = torch.tensor(tokens[1:windows * T + 1])
    with torch.no_grad():
        losses = F.cross_entropy(model(x)[0].flatten(0, 1), y, reduction='none')
    text = y != BYTE_EOT
    assert 0 < (~text).sum() and scores['bpb_tokens'] == windows * T == len(y)
    hand = losses[text].sum().item() / (math.log(2) * text.sum().item())
    assert math.isclose(scores['bpb'], hand, rel_tol=1e-5), (scores, hand)


@pytest.mark.parametrize('case', ['byte-level model', 'no checkpoint'])
def test_nothing_is_downloaded_for_a_model_that_cannot_score_the_task(trained, small_bytes,
                                                                     tmp_path, case):
    # Left at its default, --task=hellaswag: on a byte-level model, or a typo in --out_dir, one
    # line says why, before any download and without leaving an empty cache directory.
    out = trained() if case == 'byte-level model' else tmp_path / 'no_run'
    result = run('lab/evaluate.py', f'--out_dir={out}', f'--data_dir={small_bytes[0]}',
                 f'--cache_dir={tmp_path / "tasks"}', '--hellaswag_url=file:///nowhere',
                 '--device=cpu', check=False)
    assert result.returncode == 1 and 'downloading' not in result.stderr, result.stderr
    assert not (tmp_path / 'tasks').exists()
    error = result.stderr.strip().splitlines()[-1]
    if case == 'byte-level model':
        assert error == ("error: the model's vocab_size is 257, not GPT-2's 50257: tasks are "
                         "tokenized with GPT-2's BPE (--task= scores none)")
    else:
        assert error.startswith(f"error: no checkpoint at {out / 'ckpt.pt'}")


def test_hellaswag_is_downloaded_once_whole_into_the_cache(tmp_path, monkeypatch):
    source = tmp_path / 'source'
    source.mkdir()
    write_jsonl(source / 'hellaswag_val.jsonl', [ROOF])
    monkeypatch.setattr(evaluate, 'cache_dir', str(tmp_path / 'tasks'))
    monkeypatch.setattr(evaluate, 'hellaswag_url', source.as_uri())
    path = evaluate.task_file('hellaswag')
    assert path == str(tmp_path / 'tasks' / 'hellaswag_val.jsonl')
    assert os.listdir(tmp_path / 'tasks') == ['hellaswag_val.jsonl']  # no temporary file left
    assert evaluate.read_examples(path) == [(ROOF['ctx'], ROOF['endings'], 1)]
    (source / 'hellaswag_val.jsonl').unlink()
    assert evaluate.task_file('hellaswag') == path  # from the cache, not the source
    monkeypatch.setattr(evaluate, 'cache_dir', str(tmp_path / 'elsewhere'))
    with pytest.raises(SystemExit, match=r'^error: could not download file://.*hellaswag_val'):
        evaluate.task_file('hellaswag')
    assert not (tmp_path / 'elsewhere').exists()


# A HellaSwag line (its authors' format), and a plain line whose context ends in a space.
ROOF = {'ind': 1, 'activity_label': 'Roof shingle removal', 'ctx_a': 'Bob is on a roof.',
        'ctx_b': 'then Bob', 'ctx': 'Bob is on a roof. then Bob', 'label': 1,
        'endings': ['stops.', 'pulls the old tiles off the roof.', 'waves.', 'falls.']}
SPACE = {'context': 'He looks down and he ', 'endings': ['waves.', 'stops.'], 'label': 1}
# The fake model's costs in nats: ' stops' 4 and '.' 2; the long ending's words 2.5 each; the
# distractors 40. Any other token (say 'st', 'ops': ' stops' split) costs about 1e4.
COSTS = {'.': 2, ' stops': 4, ' waves': 40, ' falls': 40,
         **dict.fromkeys([' pulls', ' the', ' old', ' tiles', ' off', ' roof'], 2.5)}


class FixedCosts(torch.nn.Module):
    """A fake model with one next-token distribution at every position: each piece of costs, one
    GPT-2 token, has probability exp(-cost), so it costs exactly that; token 0 holds the rest."""

    def __init__(self, enc, costs):
        super().__init__()
        logits = torch.full((prepare.EOT + 1,), -1e4, dtype=torch.float64)
        for piece, cost in costs.items():
            logits[enc.encode_single_token(piece)] = -cost
        logits[0] = (1 - logits.exp().sum()).log()
        self.logits = logits.float()

    def forward(self, idx):
        return self.logits.expand(*idx.shape, -1), None


def test_the_picks_worked_out_by_hand(tmp_path, gpt2):
    # ROOF: ' stops' '.' = 6 nats, 3 a token; ' pulls the old tiles off the roof' '.' = 7 * 2.5 +
    # 2 = 19.5 nats, 2.44 a token; ' waves' '.' and ' falls' '.' = 42. acc picks 0 (wrong: the
    # label is 1), acc_norm picks 1 (right). SPACE: the context's space moves to the ending, which
    # scores ' stops' '.' (6 nats, right by both), not 'st' 'ops' '.'.
    path = write_jsonl(tmp_path / 'task.jsonl', [ROOF, SPACE])
    model = FixedCosts(gpt2, COSTS)
    scorer = evaluate.TaskScorer(str(path), 2, prepare.EOT + 1, 64)
    summed, norm = evaluate.score_endings(model, scorer.encoded[0], 'cpu', nullcontext())
    torch.testing.assert_close(summed, torch.tensor([6, 19.5, 42, 42]), atol=1e-3, rtol=0)
    torch.testing.assert_close(norm, torch.tensor([3, 19.5 / 8, 21, 21]), atol=1e-3, rtol=0)
    summed, _ = evaluate.score_endings(model, scorer.encoded[1], 'cpu', nullcontext())
    torch.testing.assert_close(summed, torch.tensor([42., 6]), atol=1e-3, rtol=0)
    for compiled in (False, True):  # True: every forward padded to block_size + 1 and 4 rows
        assert scorer.score(model, 'cpu', nullcontext(), compiled) == (0.5, 1.0)
    # Two processes' shares, one example each, over the task's 2: all_reduce adds them up.
    shares = [evaluate.TaskScorer(str(path), 2, prepare.EOT + 1, 64, rank, 2).score(
        model, 'cpu', nullcontext(), False) for rank in (0, 1)]
    assert shares == [(0.0, 0.5), (0.5, 0.5)]


def test_padding_and_a_cut_context_leave_each_endings_score_as_alone(gpt2):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=50257)).eval()
    example = ('The weather today is', ['sunny.', 'cold and wet, with rain all day long.', 'x'], 0)
    rows = evaluate.encode_example(gpt2, example, block_size=8)
    assert len(rows[1][0]) == 9  # the long ending is cut on the left to block_size + 1
    together = evaluate.score_endings(model, rows, 'cpu', nullcontext())
    padded = evaluate.score_endings(model, rows, 'cpu', nullcontext(), 9, 5)
    for i, row in enumerate(rows):
        alone = evaluate.score_endings(model, [row], 'cpu', nullcontext())
        for batched in (together, padded):
            torch.testing.assert_close(batched[0][i], alone[0][0])
            torch.testing.assert_close(batched[1][i], alone[1][0])


# Two facts, each repeated: a model that learnt them tells which object goes with which colour.
FACTS = "Alice has a red apple. Bob has a blue car. "
TASK = [{'context': 'Alice has a red', 'endings': ['car.', 'apple.'], 'label': 1},
        {'context': 'Bob has a blue', 'endings': ['car.', 'apple.'], 'label': 0}]


def test_train_py_logs_the_task_scores_that_evaluate_gives_its_checkpoint(tmp_path, gpt2):
    tokens = [prepare.EOT] + gpt2.encode_ordinary(FACTS * 60)
    (tmp_path / 'data').mkdir()
    prepare.write_shard(tmp_path / 'data' / 'facts_val_000000.bin', tokens[:300])
    prepare.write_shard(tmp_path / 'data' / 'facts_train_000001.bin', tokens)
    task = write_jsonl(tmp_path / 'task.jsonl', TASK)
    run('train.py', *TINY, f'--data_dir={tmp_path / "data"}', f'--out_dir={tmp_path / "run"}',
        '--learning_rate=1e-2', '--router_lr=1e-1', '--min_lr=1e-3', '--max_iters=40',
        '--eval_interval=20', f'--mc_task={task}', '--mc_interval=20')
    result = run('lab/evaluate.py', f'--out_dir={tmp_path / "run"}', f'--task={task}',
                 f'--data_dir={tmp_path / "data"}', '--device=cpu')
    assert 'task.jsonl: acc 1.0000 | acc_norm 1.0000 | 2 examples' in result.stdout
    scores = json.loads(result.stdout.splitlines()[-1])
    assert scores['acc'] == scores['acc_norm'] == 1.0 and 0 < scores['bpb'] < 1, result.stdout
    log = [json.loads(line) for line in (tmp_path / 'run' / 'log.txt').read_text().splitlines()]
    val = [r for r in log if 'val_loss' in r]
    assert [r['step'] for r in val] == [0, 20, 40] and all(r['val_bpb'] > 0 for r in val)
    assert (val[-1]['mc_acc'], val[-1]['mc_acc_norm']) == (1.0, 1.0)  # the checkpoint's weights
