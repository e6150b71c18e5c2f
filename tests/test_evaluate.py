"""
Tests for lab/evaluate.py (multiple choice under both protocols, and bits per byte) and the
evaluations train.py runs with it. No network: the tasks are files the tests write.

    python -m pytest -q tests/test_evaluate.py
"""
import json
import math
import os
import random
import subprocess
import sys
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lab import evaluate
import prepare
from lime import GPT, GPTConfig
from test_train import command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: scripts run from there
TINY = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
        '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=10', '--warmup_iters=2',
        '--learning_rate=1e-2', '--router_lr=1e-1', '--min_lr=1e-3']
# Two facts, each repeated: a model that learnt them must tell which object goes with which colour.
FACTS = "Alice has a red apple. Bob has a blue car. "
TASK = [{'context': 'Alice has a red', 'endings': ['car.', 'apple.'], 'label': 1},
        {'context': 'Bob has a blue', 'endings': ['car.', 'apple.'], 'label': 0}]


def run(script, *args, check=True):
    """script as a user runs it from the repo root (python train.py, python -m lab.evaluate)."""
    result = subprocess.run([*command(script), *args], capture_output=True, text=True, cwd=ROOT,
                            timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    if check:
        assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result


def write_jsonl(path, records):
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))
    return path


@pytest.fixture(scope='module')
def trained(tmp_path_factory, gpt2):
    """A tiny model trained on the facts, scoring the task every 20 steps, and its data and task."""
    root = tmp_path_factory.mktemp('evaluate')
    enc = gpt2
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
    assert scores['protocol'] == 'build-nanogpt', result.stdout  # the default
    assert 'task.jsonl, build-nanogpt protocol, 0-shot: acc 1.0000 | acc_norm 1.0000 (per token)' \
        in result.stdout
    assert 0 < scores['bpb'] < 1, result.stdout  # the facts are easy: far below 8 bits a byte
    records = [json.loads(line) for line in (trained / 'run' / 'log.txt').read_text().splitlines()]
    val = [r for r in records if 'val_loss' in r]
    assert [r['step'] for r in val] == [0, 20, 40] and all(r['val_bpb'] > 0 for r in val)
    assert val[-1]['mc_acc'] == val[-1]['mc_acc_norm'] == 1.0 and all('mc_acc' in r for r in val)


def test_one_shot_puts_a_solved_example_first(trained):
    result = run('lab/evaluate.py', f'--out_dir={trained / "run"}', f'--task={trained / "task.jsonl"}',
                 '--shots=1', f'--train_file={trained / "task.jsonl"}', '--protocol=harness')
    scores = json.loads(result.stdout.splitlines()[-1])
    assert scores['shots'] == 1 and scores['protocol'] == 'harness', result.stdout
    assert 'task.jsonl, harness protocol, 1-shot: acc ' in result.stdout
    assert '(per character) | 2 examples' in result.stdout
    for protocol in ('build-nanogpt', 'harness'):
        shot = evaluate.with_shots([('Q', ['a', 'b'], 0)], [('C', ['x', 'y'], 1)], 1, 0, protocol,
                                   draw='k')
        assert shot == [('C y\n\nQ', ['a', 'b'], 0)]
    # The harness's draw for HellaSwag takes k + 1: one solved example is too few for one shot.
    with pytest.raises(SystemExit, match=r'^error: --shots=1 draws 2 solved examples'):
        evaluate.with_shots([('Q', ['a', 'b'], 0)], [('C', ['x', 'y'], 1)], 1, 0)


def test_shots_drawn_from_the_task_itself_never_show_an_example_its_own_answer():
    task = [(f'Q{i}', ['a', 'b'], i % 2) for i in range(6)]
    for seed in range(20):
        for k in (1, 5):  # 5: every other example, its own left out
            shots = evaluate.with_shots(task, task, k, seed)
            for (context, _, _), (shown, _, _) in zip(task, shots):
                assert shown.endswith(context) and f'{context} ' not in shown, (seed, k, shown)
    with pytest.raises(SystemExit, match='draws 7 solved examples .--shot_draw=k.1., but there are 6'):
        evaluate.with_shots(task, task, 6, 0)
    # The scored example solved twice: both copies are left out, and the 4 others still suffice
    # (drawn again from them where both copies were among the 5 drawn).
    twice = task + task[:1]
    for seed in range(20):
        (shown, _, _), = evaluate.with_shots(task[:1], twice, 4, seed)
        assert shown.count('Q0') == 1 and shown.count('\n\n') == 4, (seed, shown)
    with pytest.raises(SystemExit, match='too few solved examples other than the one being scored'):
        for seed in range(50):  # some seed draws both copies of Q0 among 2 of 3
            evaluate.with_shots(task[:1], task[:2] + task[:1], 2, seed)


def test_the_shots_are_the_harness_draw_one_generator_in_the_examples_order():
    # lm_eval 0.4.13's sampler: random.Random(1234) made once, then for each example in order
    # sample(solved, k + 1) with the example itself dropped, the first k kept (HellaSwag and every
    # task without a test split); for ARC, which scores its test split, sample(solved, k).
    # tests/test_lm_eval.py holds it to the harness itself; here, the rule written out.
    task = [(f'Q{i}', ['a', 'b'], i % 2) for i in range(7)]
    rng, hand = random.Random(1234), []
    for example in task:
        hand.append([s for s in rng.sample(task, 3) if s != example][:2])
    shots = evaluate.with_shots(task, task, 2, 1234)
    for (shown, _, _), drawn, example in zip(shots, hand, task):
        assert shown == ''.join(f'{c} {e[l]}\n\n' for c, e, l in drawn) + example[0]
    rng = random.Random(1234)
    hand = [rng.sample(task, 2) for _ in task]
    shots = evaluate.with_shots(task, task, 2, 1234, draw='k')
    assert [shown for shown, _, _ in shots] == [
        ''.join(f'{c} {e[l]}\n\n' for c, e, l in drawn) + example[0]
        for drawn, example in zip(hand, task)]


def test_padding_and_batching_give_the_scores_of_one_ending_at_a_time(gpt2):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=50257,
                          router='dynamic')).eval()
    enc = gpt2
    example = ('The weather today is', ['sunny.', 'cold and wet, with rain all day long.', 'x'], 0)
    rows = evaluate.encode_example(enc, example, block_size=8)
    rows += evaluate.encode_example(enc, example, block_size=8, protocol='harness')
    assert len(rows[1][0]) == 9  # the long ending is cut on the left to block_size + 1
    together = evaluate.score_endings(model, rows, 'cpu', torch.autocast('cpu', enabled=False))
    padded = evaluate.score_endings(model, rows, 'cpu', torch.autocast('cpu', enabled=False), 9, 8)
    for i, row in enumerate(rows):
        alone = evaluate.score_endings(model, [row], 'cpu', torch.autocast('cpu', enabled=False))
        for batched in (together, padded):
            torch.testing.assert_close(batched[0][i], alone[0][0])
            torch.testing.assert_close(batched[1][i], alone[1][0])


def test_bits_per_byte_equals_a_hand_computation(gpt2):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=50257)).eval()
    enc = gpt2
    docs = [enc.encode_ordinary(text) for text in ("Café naïve — déjà vu.", "A second one, in ASCII.")]
    tokens = np.array([prepare.EOT, *docs[0], prepare.EOT, *docs[1]], dtype=np.uint16)
    byte_lengths = torch.from_numpy(prepare.token_bytes(50257, '')[0])
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
    byte_lengths, _ = prepare.token_bytes(18, str(tmp_path))
    assert byte_lengths.tolist() == [1] * 18
    byte_lengths, why = prepare.token_bytes(100, str(tmp_path / 'elsewhere'))
    assert byte_lengths is None and 'not GPT-2' in why


# Two hand-made examples in HellaSwag's own format: one ActivityNet-style, one WikiHow-style with
# its [header], [title], [step] and [substeps] markers.
ROOF = {'ind': 1, 'activity_label': 'Roof shingle removal',
        'ctx_a': 'Bob climbs a ladder onto a roof.', 'ctx_b': 'then Bob',
        'ctx': 'Bob climbs a ladder onto a roof. then Bob', 'split': 'val',
        'split_type': 'indomain', 'label': 1,
        'endings': ['stops.', 'pulls the old tiles off the roof.', 'waves.', 'falls.'],
        'source_id': 'activitynet~v_handmade'}
HOWTO = '[header] How to paint a wall [title] Clean the wall. [step] Wipe it with a cloth.'
WALL = {'ind': 2, 'activity_label': 'Home and Garden', 'ctx_a': HOWTO, 'ctx_b': '', 'ctx': HOWTO,
        'split': 'val', 'split_type': 'zeroshot', 'label': 0,
        'endings': ['Paint the wall. [substeps] Use a roller.', 'Do it, then do it all over again.',
                    'Dance.', 'Sing.'],
        'source_id': 'wikihow~handmade'}
# The harness's rewriting of them, by hand: "label: ctx_a Ctx_b" (str.capitalize lowers the rest,
# so "then Bob" becomes "Then bob"), " [title]" -> ". ", other [...] markers out, double spaces
# single.
ROOF_QUERY = 'Roof shingle removal: Bob climbs a ladder onto a roof. Then bob'
WALL_QUERY = 'Home and Garden: How to paint a wall. Clean the wall. Wipe it with a cloth.'
WALL_ENDINGS = ['Paint the wall. Use a roller.', *WALL['endings'][1:]]


class FixedCosts(torch.nn.Module):
    """A fake model with the same next-token distribution at every position: each piece of costs is
    one GPT-2 token, given probability exp(-cost) so that it costs exactly cost nats wherever it
    comes; token 0 ('!', in no ending) holds the rest; every other token gets a logit of -1e4 (no
    probability, yet a finite loss, which the mask zeroes on the context's tokens)."""

    def __init__(self, enc, costs):
        super().__init__()
        logits = torch.full((prepare.EOT + 1,), -1e4, dtype=torch.float64)
        for piece, cost in costs.items():
            logits[enc.encode_single_token(piece)] = -cost
        rest = 1 - logits.exp().sum()
        assert 0.1 < rest < 1
        logits[0] = rest.log()
        self.logits = logits.float()

    def forward(self, idx):
        return self.logits.expand(*idx.shape, -1), None


# The fake model's costs, in nats: a word 4, '.' and ',' 2, each piece of the " [substeps]" marker
# 6, the distractor words 40.
WORDS = [' stops', ' pulls', ' the', ' old', ' tiles', ' off', ' roof', ' Paint', ' wall', ' Use',
         ' a', ' roller', ' Do', ' it', ' then', ' do', ' all', ' over', ' again']
COSTS = {'.': 2, ',': 2, ' [': 6, 'sub': 6, 'steps': 6, ']': 6, **dict.fromkeys(WORDS, 4),
         **dict.fromkeys([' waves', ' falls', ' Dance', ' Sing'], 40)}


def test_the_two_protocols_pick_the_endings_worked_out_by_hand(tmp_path, gpt2):
    # Each ending's summed loss is the sum of its tokens' costs (the leading space rides on the
    # first word: ' stops' '.'). acc picks the least sum; acc_norm the least sum per token
    # (build-nanogpt) or per character of the ending, its leading space not counted (harness).
    #
    # ROOF, no markers, so both protocols score the same tokens; only acc_norm's divisor differs:
    #   0 ' stops' '.'                      4 + 2 =  6 nats, 2 tokens: 3.00 a token; 6 chars: 1.00
    #   1 ' pulls the old tiles off the roof' '.'
    #                                     7*4 + 2 = 30 nats, 8 tokens: 3.75 a token; 33 chars: 0.91
    #   2, 3 ' waves' '.', ' falls' '.'      40 + 2 = 42 nats, 21 a token, 7.00 a char
    #   acc: 0 in both. acc_norm: 0 per token (3.00 < 3.75), 1 per character (0.91 < 1.00).
    # WALL: build-nanogpt scores ending 0 with its marker, the harness without:
    #   0 ' Paint the wall' '.' ' [' 'sub' 'steps' ']' ' Use a roller' '.'
    #                       6*4 + 2*2 + 4*6 = 52 nats, 12 tokens: 4.33 a token
    #     harness: 'Paint the wall. Use a roller.'  6*4 + 2*2 = 28 nats, 29 chars: 0.97 a char
    #   1 ' Do it' ',' ' then do it all over again' '.'
    #                             8*4 + 2*2 = 36 nats, 10 tokens: 3.60 a token; 33 chars: 1.09
    #   2, 3 ' Dance' '.', ' Sing' '.'       42 nats, 21 a token, 7.00 and 8.40 a char
    #   build-nanogpt: acc 1 (36 < 52), acc_norm 1 (3.60 < 4.33).
    #   harness: acc 0 (28 < 36), acc_norm 0 (0.97 < 1.09): the rewriting decides both (with the
    #   marker, 52 nats, ending 0 would lose by either measure: 52 > 36, 52/40 chars = 1.30 > 1.09).
    # The labels (1, 0) make build-nanogpt right on none, the harness on 1 (acc) and 2 (acc_norm).
    path = write_jsonl(tmp_path / 'hellaswag_val.jsonl', [ROOF, WALL])
    model = FixedCosts(gpt2, COSTS)
    cases = {'build-nanogpt': ([[6, 30, 42, 42], [52, 36, 42, 42]], [(0, 0), (1, 1)], (0, 0)),
             'harness': ([[6, 30, 42, 42], [28, 36, 42, 42]], [(0, 1), (0, 0)], (1, 2))}
    for protocol, (sums, picks, counts) in cases.items():
        scorer = evaluate.TaskScorer(str(path), 2, 50257, 64, 0, 1, protocol)
        for rows, hand in zip(scorer.encoded, sums):
            summed, _ = evaluate.score_endings(model, rows, 'cpu', nullcontext())
            torch.testing.assert_close(summed, torch.tensor(hand, dtype=torch.float), atol=1e-3,
                                       rtol=0)
        assert evaluate.predictions(model, scorer.encoded, 'cpu', nullcontext()) == picks, protocol
        accuracies = tuple(c / 2 for c in counts)
        assert scorer.score(model, 'cpu', nullcontext(), compiled=False) == accuracies, protocol
        assert scorer.score(model, 'cpu', nullcontext(), compiled=True) == accuracies, protocol


def test_hellaswag_lines_are_rewritten_by_the_harness_only_and_shots_follow_it(tmp_path):
    path = str(write_jsonl(tmp_path / 'hs.jsonl', [ROOF, WALL]))
    assert evaluate.read_examples(path) == [(ROOF['ctx'], ROOF['endings'], 1),
                                            (WALL['ctx'], WALL['endings'], 0)]
    harness = evaluate.read_examples(path, 'harness')
    assert harness == [(ROOF_QUERY, ROOF['endings'], 1), (WALL_QUERY, WALL_ENDINGS, 0)]
    # One shot: the solved example's query, a space, its right ending, a blank line, then the query.
    shot = evaluate.with_shots(harness[:1], harness[1:], 1, 0, 'harness', draw='k')
    solved = f'{WALL_QUERY} Paint the wall. Use a roller.'
    assert shot == [(f'{solved}\n\n{ROOF_QUERY}', ROOF['endings'], 1)]
    # The harness builds HellaSwag's query from fields a line without them cannot give.
    line = {'ctx': 'A man', 'endings': ['a', 'b'], 'label': 0}
    bare = str(write_jsonl(tmp_path / 'bare.jsonl', [line]))
    assert evaluate.read_examples(bare) == [('A man', ['a', 'b'], 0)]
    with pytest.raises(SystemExit, match=r'^error: .*bare.jsonl:1: --protocol=harness builds a'):
        evaluate.read_examples(bare, 'harness')


def test_a_context_ending_in_whitespace_scores_the_word_with_its_space(gpt2):
    enc = gpt2
    example = ('Bob climbs the ladder and he ', ['starts', 'stops'], 0)

    def scored(protocol):  # the context's tokens and the first ending's scored pieces
        tokens, mask, _ = evaluate.encode_example(enc, example, 64, protocol)[0]
        return ([t for t, m in zip(tokens, mask) if not m],
                [enc.decode([t]) for t, m in zip(tokens, mask) if m])

    context = enc.encode_ordinary('Bob climbs the ladder and he')
    assert scored('build-nanogpt') == (context, [' starts'])  # not 'st', 'arts'
    # The harness puts its own space before every ending, after the context's moved one.
    assert scored('harness') == (context, [' ', ' starts'])


def test_a_missing_checkpoint_is_said_before_any_download(tmp_path):
    # A newcomer's typo in --out_dir: one line about the checkpoint, not a download of HellaSwag.
    result = run('lab/evaluate.py', f'--out_dir={tmp_path / "no_run"}', '--task=hellaswag',
                 f'--cache_dir={tmp_path / "tasks"}', '--hellaswag_url=file:///nowhere/hs',
                 check=False)
    assert result.returncode == 1 and 'download' not in result.stderr, result.stderr
    checkpoint = tmp_path / 'no_run' / 'ckpt.pt'
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: no checkpoint at {checkpoint} (train.py writes one to its out_dir)")


def test_an_unknown_protocol_is_one_line(monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['evaluate', '--protocol=eleuther'])
    with pytest.raises(SystemExit, match="^error: protocol must be one of 'build-nanogpt', 'harn"):
        evaluate.main()


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
