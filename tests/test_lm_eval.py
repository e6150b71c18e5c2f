"""
Tests for lab/harness.py and lab/table1.py (the LM Evaluation Harness scoring a lime checkpoint),
and for the agreement of lab/evaluate.py's --protocol=harness with the harness's own hellaswag.
They need lm-eval (pip install lm-eval==0.4.13) and skip, saying so, without it. No network: the
harness runs offline, its tasks pointed at JSON-lines files the tests write.

    python -m pytest -q tests/test_lm_eval.py
"""
import atexit
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

# Offline, and the data sets the harness builds from the tests' files cached apart from the
# user's: set before datasets is first imported, which reads them once.
os.environ['HF_DATASETS_OFFLINE'] = os.environ['HF_HUB_OFFLINE'] = '1'
if 'datasets' not in sys.modules:
    os.environ['HF_DATASETS_CACHE'] = tempfile.mkdtemp(prefix='lime-test-datasets-')
    atexit.register(shutil.rmtree, os.environ['HF_DATASETS_CACHE'], ignore_errors=True)

import lime  # noqa: E402
import prepare  # noqa: E402
from lab import evaluate  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_LM_EVAL = importlib.util.find_spec('lm_eval') is not None
needs_lm_eval = pytest.mark.skipif(not HAVE_LM_EVAL, reason="lm-eval is not installed (optional: "
                                   "pip install lm-eval==0.4.13)")
BLOCK_SIZE = 64


def write_jsonl(path, records):
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))
    return path


# Hand-made HellaSwag lines: WikiHow headers and steps, an empty ctx_b, odd capitals, trailing
# spaces, an ending with its own markers, and a context longer than BLOCK_SIZE tokens.
def hellaswag(ind, label, activity, ctx_a, ctx_b, endings):
    return {'ind': ind, 'activity_label': activity, 'ctx_a': ctx_a, 'ctx_b': ctx_b,
            'ctx': f'{ctx_a} {ctx_b}'.strip(), 'split': 'val', 'split_type': 'indomain',
            'label': str(label), 'endings': endings, 'source_id': f'handmade~{ind}'}


LONG = ' '.join(['The crowd watches from the stands as the riders circle the arena again.'] * 6)
VAL = [
    hellaswag(0, 1, 'Roof shingle removal', 'A man is sitting on a roof.', 'he',
              ['is using wrap to wrap a pair of skis.', 'starts pulling up roofing on a roof.',
               'is ripping level tiles off.', "is holding a rubik's cube."]),
    hellaswag(1, 0, 'Home and Garden', '[header] How to paint a wall [title] Clean the wall. '
              '[step] Wipe it with a damp cloth.', '',
              ['Let it dry. [substeps] Open a window.', 'Sing to the wall.', 'Eat the paint.',
               'Paint the ceiling blue. ']),
    hellaswag(2, 3, 'Clean and jerk', 'A LADY walks to a barbell. She bends down and grabs the '
              'pole.', 'the lady',
              ['swings and lands in her arms.', 'pulls the barbell forward.',
               'pulls a rope attached to the barbell.',
               'stands and lifts the weight over her head.']),
    hellaswag(3, 2, 'Horse riding', LONG, 'then the rider  ',
              ['falls asleep.', 'eats an apple.', 'jumps the last fence and waves.', 'leaves.']),
    hellaswag(4, 0, 'Food and Entertaining', '[header] How to bake bread [title] Mix the dough. ',
              'knead   it well',
              ['until it is smooth.', 'with a hammer.', 'into the sea.', 'for a year.']),
    hellaswag(5, 1, 'Playing guitar', 'a boy holds a guitar on his lap.', 'He',
              ['throws it.', 'strums the strings and sings.', 'eats it.', 'paints it red.']),
]
TRAIN = [
    hellaswag(10, 2, 'Washing dishes', 'A woman fills a sink with water.', 'she',
              ['drinks it.', 'sleeps.', 'puts the plates in and scrubs them.', 'leaves.']),
    hellaswag(11, 0, 'Personal Care and Style', '[header] How to shave [title] Wet your face. '
              '[step] Use warm water.', '',
              ['Apply shaving cream. [substeps] Rub it in.', 'Go outside.', 'Eat soap.', 'Run.']),
    hellaswag(12, 1, 'Mowing the lawn', 'A man pushes a mower across the grass.', 'the man',
              ['flies away.', 'turns at the end of the row and mows back.', 'sits.', 'cries.']),
    hellaswag(13, 3, 'Brushing teeth', 'a girl picks up a toothbrush.', 'She',
              ['throws it.', 'eats it.', 'paints with it.', 'brushes her teeth in the mirror.']),
]
PLAIN = [{'context': f'Question {i}: which colour is the sky?', 'endings': ['blue', 'green'],
          'label': i % 2} for i in range(6)]

# Table 1's other tasks, two lines each in their data sets' own formats.
ARC = [{'id': f'arc{i}', 'question': f'Which of these is a metal? ({i})',
        'choices': {'text': ['wood', 'iron', 'glass'], 'label': ['A', 'B', 'C']},
        'answerKey': 'ABC'[i % 3]} for i in range(6)]
FORMATS = {
    'arc_easy': ('arc/arc_easy.yaml', ARC[:2], ['train', 'validation', 'test']),
    'arc_challenge': ('arc/arc_easy.yaml', ARC[:2], ['train', 'validation', 'test']),
    'winogrande': ('winogrande/default.yaml', [
        {'sentence': 'The trophy did not fit in the case because _ was too big.',
         'option1': 'the trophy', 'option2': 'the case', 'answer': '1'},
        {'sentence': 'The cup fell off the table because _ was tilted.',
         'option1': 'the cup', 'option2': 'the table', 'answer': '2'}], ['train', 'validation']),
    'copa': ('super_glue/copa/default.yaml', [
        {'premise': 'The man broke his toe.', 'choice1': 'He dropped a hammer on his foot.',
         'choice2': 'He got a hole in his sock.', 'question': 'cause', 'label': 0, 'idx': 0},
        {'premise': 'It started to rain.', 'choice1': 'The sun came out.',
         'choice2': 'We went inside.', 'question': 'effect', 'label': 1, 'idx': 1}],
        ['train', 'validation']),
    'multirc': ('super_glue/multirc/default.yaml', [
        {'paragraph': 'Sam has two dogs.', 'question': 'How many dogs does Sam have?',
         'answer': 'two', 'label': 1, 'idx': {'paragraph': 0, 'question': 0, 'answer': i}}
        for i in range(2)], ['train', 'validation']),
    'rte': ('glue/rte/default.yaml', [
        {'sentence1': 'A cat sat on the mat.', 'sentence2': 'A cat sat.', 'label': 0, 'idx': 0},
        {'sentence1': 'It is sunny.', 'sentence2': 'It is raining.', 'label': 1, 'idx': 1}],
        ['train', 'validation']),
    'hellaswag': ('hellaswag/hellaswag.yaml', VAL[:2], ['train', 'validation']),
    'piqa': ('piqa/piqa.yaml', [
        {'goal': 'To open a jar,', 'sol1': 'twist the lid.', 'sol2': 'eat the lid.', 'label': 0},
        {'goal': 'To dry hands,', 'sol1': 'wet them.', 'sol2': 'use a towel.', 'label': 1}],
        ['train', 'validation']),
}


def task_yaml(path, task, data_files, include=None, extra=''):
    """A task file for the harness: its task name, its data in local JSON-lines files (datasets'
    'json' builder), and, included, the harness's own task file for everything else."""
    lines = [f'include: {include}'] if include else []
    lines += [f'task: {task}', 'dataset_path: json', 'dataset_name: null', 'dataset_kwargs:',
              '  data_files:', *(f'    {split}: {file}' for split, file in data_files.items())]
    path.write_text('\n'.join(lines) + '\n' + extra)


@pytest.fixture(scope='module')
def setup(tmp_path_factory, gpt2):
    """A checkpoint of a tiny model, and a directory of task files: hellaswag_local (the harness's
    hellaswag on VAL, its few-shot examples from TRAIN), plain_local (a task of its own on PLAIN),
    and Table 1's eight tasks by their own names, each on two lines of a local file. The model
    reads GPT-2's tokens: offline, without GPT-2's files, the tests skip (conftest.py)."""
    root = tmp_path_factory.mktemp('lm_eval')
    torch.manual_seed(0)
    model = lime.GPT(lime.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK_SIZE,
                                    vocab_size=prepare.EOT + 1, router='static'))
    with torch.no_grad():  # weights far from their small initial values: endings' scores apart
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    (root / 'run').mkdir()
    lime.save_checkpoint(root / 'run' / 'ckpt.pt', model, step=7, best_val_loss=1.0)
    tasks = root / 'tasks'
    tasks.mkdir()
    if HAVE_LM_EVAL:
        harness_tasks = os.path.join(os.path.dirname(importlib.util.find_spec('lm_eval').origin),
                                     'tasks')
        val, train = write_jsonl(root / 'val.jsonl', VAL), write_jsonl(root / 'train.jsonl', TRAIN)
        task_yaml(tasks / 'hellaswag_local.yaml', 'hellaswag_local',
                  {'train': train, 'validation': val},
                  include=os.path.join(harness_tasks, 'hellaswag', 'hellaswag.yaml'))
        plain = write_jsonl(root / 'plain.jsonl', PLAIN)
        task_yaml(tasks / 'plain_local.yaml', 'plain_local', {'train': plain, 'validation': plain},
                  extra='output_type: multiple_choice\ntraining_split: train\n'
                        'validation_split: validation\ndoc_to_text: "{{context}}"\n'
                        'doc_to_choice: "{{endings}}"\ndoc_to_target: label\n'
                        'metric_list:\n  - metric: acc\n    aggregation: mean\n'
                        '    higher_is_better: true\n')
        arc_train, arc_test = write_jsonl(root / 'arc_train.jsonl', ARC), \
            write_jsonl(root / 'arc_test.jsonl', ARC[:3])
        task_yaml(tasks / 'arc_local.yaml', 'arc_local',
                  {'train': arc_train, 'validation': arc_test, 'test': arc_test},
                  include=os.path.join(harness_tasks, 'arc', 'arc_easy.yaml'))
        table1 = root / 'table1'
        table1.mkdir()
        for task, (own, lines, splits) in FORMATS.items():
            data = write_jsonl(root / f'{task}.jsonl', lines)
            task_yaml(table1 / f'{task}.yaml', task, dict.fromkeys(splits, data),
                      include=os.path.join(harness_tasks, own))
    return root


@pytest.fixture(scope='module')
def task_manager(setup):
    from lm_eval.tasks import TaskManager
    return TaskManager(include_path=str(setup / 'tasks'))


def harness_run(model, task, shots, task_manager, **kwargs):
    """The harness's per-example records (log_samples) for task, and its results."""
    import lm_eval
    results = lm_eval.simple_evaluate(model=model, tasks=[task], num_fewshot=shots,
                                      task_manager=task_manager, log_samples=True, **kwargs)
    return sorted(results['samples'][task], key=lambda s: s['doc_id']), results


@pytest.mark.optional
@needs_lm_eval
@pytest.mark.parametrize('shots', [0, 1])
def test_evaluate_harness_protocol_is_the_harness_hellaswag(setup, task_manager, shots):
    # lab/evaluate.py's --protocol=harness against the harness's own hellaswag task (its YAML,
    # its preprocessing, its sampler), on the same checkpoint: the same context for every
    # example, shots included; the same log-likelihood of every ending; the same picks.
    from lab import harness
    if shots:
        model = harness.LimeLM(out_dir=str(setup / 'run'), device='cpu', batch_size=3)
        records, results = harness_run(model, 'hellaswag_local', shots, task_manager)
    else:  # by its registered name, as a user of the harness would
        records, results = harness_run('lime', 'hellaswag_local', shots, task_manager,
                                       model_args=f"out_dir={setup / 'run'},device=cpu")
    assert results['config']['lime_dtype'] == 'float32' and results['config']['lime_step'] == 7

    examples = evaluate.read_examples(str(setup / 'val.jsonl'), 'harness')
    if shots:
        solved = evaluate.read_examples(str(setup / 'train.jsonl'), 'harness')
        examples = evaluate.with_shots(examples, solved, shots, 1234, 'harness')
    model, _ = lime.load_checkpoint(str(setup / 'run' / 'ckpt.pt'), 'cpu')
    enc = prepare.gpt2_encoding()
    assert len(records) == len(examples) == len(VAL)
    long_seen = False
    for record, example in zip(records, examples):
        context, endings, label = example
        assert [args for args in record['arguments']] == [(context, ' ' + e) for e in endings]
        rows = evaluate.encode_example(enc, example, BLOCK_SIZE, 'harness')
        long_seen |= len(enc.encode_ordinary(context)) > BLOCK_SIZE
        summed, norm = evaluate.score_endings(model, rows, 'cpu', nullcontext())
        theirs = torch.tensor([ll for ll, _ in record['filtered_resps']])
        torch.testing.assert_close(-summed, theirs, atol=1e-4, rtol=0)
        gaps = (theirs[:, None] - theirs[None, :]).abs() + torch.eye(len(theirs))
        assert gaps.min() > 1e-3, "endings too close to tell apart: the picks would be luck"
        assert record['acc'] == float(int(summed.argmin()) == label)
        assert record['acc_norm'] == float(int(norm.argmin()) == label)
    assert long_seen  # a context cut on the left to block_size, the same way in both


@pytest.mark.optional
@needs_lm_eval
def test_a_plain_local_task_and_arc_draw_their_shots_as_evaluate_does(setup, task_manager):
    # A task of its own (dataset_path: json, no include): the harness draws its shot from the
    # task itself (train and validation are one file) and drops the example scored, as
    # evaluate.py's default --shot_draw=k+1 does.
    from lab import harness
    model = harness.LimeLM(out_dir=str(setup / 'run'), device='cpu')
    records, _ = harness_run(model, 'plain_local', 1, task_manager)
    examples = evaluate.read_examples(str(setup / 'plain.jsonl'), 'harness')
    shots = evaluate.with_shots(examples, examples, 1, 1234, 'harness')
    enc = prepare.gpt2_encoding()
    for record, example in zip(records, shots):
        assert record['arguments'][0][0] == example[0]
        assert example[0].count('\n\n') == 1 and example[0].split('\n\n')[0] not in \
            example[0].split('\n\n')[1]  # never its own question
        summed, _ = evaluate.score_endings(model.model, evaluate.encode_example(
            enc, example, BLOCK_SIZE, 'harness'), 'cpu', nullcontext())
        theirs = torch.tensor([ll for ll, _ in record['filtered_resps']])
        torch.testing.assert_close(-summed, theirs, atol=1e-4, rtol=0)
    # ARC scores its test split and draws from train: k drawn (--shot_draw=k), nothing dropped.
    records, _ = harness_run(model, 'arc_local', 2, task_manager)
    solved = [(f"Question: {q['question']}\nAnswer:", q['choices']['text'],
               'ABC'.index(q['answerKey'])) for q in ARC]
    shots = evaluate.with_shots(solved[:3], solved, 2, 1234, 'harness', draw='k')
    assert [r['arguments'][0][0] for r in records] == [context for context, _, _ in shots]


@pytest.mark.optional
@needs_lm_eval
def test_scores_by_hand_rolling_windows_and_a_continuation_too_long(setup):
    from lm_eval.api.instance import Instance
    from lab import harness
    lm = harness.LimeLM(out_dir=str(setup / 'run'), device='cpu', batch_size=2)
    model, enc = lm.model, lm.enc

    def by_hand(inputs, targets):  # the summed log-probability of targets, the last positions
        logits, _ = model(torch.tensor([inputs]))
        logprobs = F.log_softmax(logits[0, -len(targets):].float(), dim=-1)
        return logprobs[torch.arange(len(targets)), torch.tensor(targets)].sum().item()

    def request(kind, *args):
        return Instance(request_type=kind, doc={}, arguments=args, idx=0)

    # An empty context: <|endoftext|> before the continuation (TemplateLM's doing).
    text = enc.encode_ordinary('Hello there, world.')
    (ll, greedy), = lm.loglikelihood([request('loglikelihood', '', 'Hello there, world.')])
    assert math.isclose(ll, by_hand([prepare.EOT] + text[:-1], text), abs_tol=1e-4)
    assert greedy is False
    # A text longer than block_size: the first BLOCK_SIZE tokens after <|endoftext|>, the rest
    # from the BLOCK_SIZE tokens before each (the harness's rolling windows).
    long = enc.encode_ordinary(LONG + ' ' + LONG)[:100]
    string = enc.decode(long)
    assert enc.encode_ordinary(string) == long and len(long) > BLOCK_SIZE
    rolled, = lm.loglikelihood_rolling([request('loglikelihood_rolling', string)])
    hand = by_hand([prepare.EOT] + long[:BLOCK_SIZE - 1], long[:BLOCK_SIZE]) \
        + by_hand(long[100 - BLOCK_SIZE - 1:99], long[BLOCK_SIZE:])
    assert math.isclose(rolled, hand, rel_tol=1e-5)
    # A continuation of more than block_size tokens cannot be scored whole: one line says so.
    with pytest.raises(SystemExit, match=r'^error: a continuation of 100 tokens is longer than the '
                                         r"model's block_size \(64\)"):
        lm.loglikelihood([request('loglikelihood', 'Once', ' ' + string)])


@pytest.mark.optional
@needs_lm_eval
def test_the_registration(setup):
    import importlib
    from lm_eval.api.registry import get_model, model_registry
    from lab import harness
    # Registered by path: the harness's own models stay known, and 'lime' is lab.harness's class
    # even where the module runs again, reloaded or loaded under a second name (as __main__ is).
    assert 'hf' in model_registry and get_model('lime') is harness.LimeLM
    importlib.reload(harness)
    path = os.path.join(ROOT, 'lab', 'harness.py')
    spec = importlib.util.spec_from_file_location('harness', path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert 'hf' in model_registry and get_model('lime').__module__ == 'lab.harness'


@pytest.mark.optional
@needs_lm_eval
def test_table1_runs_its_eight_tasks_on_local_files(setup):
    out = setup / 'table1.json'
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': ROOT}
    result = subprocess.run([sys.executable, '-m', 'lab.table1', f"--out_dir={setup / 'run'}",
                             f"--include_path={setup / 'table1'}", '--device=cpu',
                             f'--json_file={out}'], capture_output=True, text=True, cwd=ROOT,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    scores = json.loads(out.read_text())
    assert list(scores['tasks']) == list(FORMATS) and scores['num_fewshot'] == 1
    assert all(t['examples'] == 2 and 0 <= t['acc'] <= 1 for t in scores['tasks'].values())
    assert scores['dtype'] == 'float32' and scores['lm_eval'] == '0.4.13'
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"Table 1: {setup / 'run'} (step 7, router static, float32), 1-shot")
    for task in FORMATS:
        assert any(line.startswith(task + ' ') for line in lines), result.stdout
    assert 'LIMe Static' in lines[1] and lines[2].split()[-4:] == ['69.5', '70.1', '72.7', '71.1']
    # Offline, a task whose data is neither cached nor local: one line, with what to do.
    result = subprocess.run([sys.executable, '-m', 'lab.table1', f"--out_dir={setup / 'run'}",
                             '--tasks=sciq', '--device=cpu'], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    last = result.stderr.strip().splitlines()[-1]  # after the harness's own log lines
    assert result.returncode == 1 and last.startswith('error: sciq: could not load'), last
    assert '--include_path' in last


def test_table1_prints_the_papers_four_rows_beside_ours_task_by_task():
    from lab import table1
    tasks = {name: {'acc': 0.5, 'acc_stderr': 0.01, 'examples': 10} for name in FORMATS}
    scores = {'out_dir': 'out/x', 'step': 1, 'router': 'static', 'dtype': 'float32',
              'num_fewshot': 1, 'lm_eval': '0.4.13', 'tasks': tasks,
              'mean': {'acc': 0.5, 'acc_norm_else_acc': 0.5}}
    lines = table1.table(scores)
    assert lines[1].split()[-6:] == ['LLaMA', 'HC', 'LIMe', 'Dynamic', 'LIMe', 'Static']
    rows = {line.split()[0]: line.split()[-4:] for line in lines[2:11]}
    assert rows['arc_easy'] == ['69.5', '70.1', '72.7', '71.1']  # the paper's ARC-E column
    assert rows['winogrande'] == ['55.2', '53.0', '53.1', '56.2']
    assert rows['piqa'] == ['72.5', '73.5', '72.9', '72.2']
    assert rows['mean'] == ['57.7', '57.6', '58.4', '58.3']  # the paper's Avg
    assert list(rows) == list(FORMATS) + ['mean']


def test_without_lm_eval_one_line_says_how_to_install_it(tmp_path):
    hide = ("import runpy, sys; sys.modules['lm_eval'] = None; "
            "sys.argv = ['table1', '--out_dir=nowhere']; runpy.run_module('lab.table1', "
            "run_name='__main__')")
    result = subprocess.run([sys.executable, '-c', hide], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, 'PYTHONPATH': ROOT}, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith('error: scoring with the LM Evaluation Harness needs it: pip '
                                    'install lm-eval==0.4.13'), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
