"""
Tests for lab/harness.py and lab/table1.py: EleutherAI's LM Evaluation Harness scoring a lime
checkpoint. They need lm-eval (pip install lm-eval==0.4.13) and skip, saying so, without it. No
network: the harness runs offline, its tasks pointed at JSON-lines files the tests write.
"""
import atexit
import functools
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

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
from conftest import ROOT  # noqa: E402

needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec('lm_eval') is None, reason=(
    "lm-eval is not installed (optional: pip install lm-eval==0.4.13)"))
BLOCK_SIZE = 64

# Two of Table 1's tasks, by their own names, each on a few lines in its data set's own format.
HELLASWAG = [{'ind': i, 'activity_label': 'Roof shingle removal', 'ctx_a': f'A man is on roof {i}.',
              'ctx_b': 'he', 'ctx': f'A man is on roof {i}. he', 'split': 'val',
              'split_type': 'indomain', 'label': str(i % 4), 'source_id': f'handmade~{i}',
              'endings': ['is using wrap to wrap a pair of skis.', 'starts pulling up roofing.',
                          '[step] is ripping level tiles off.', "is holding a rubik's cube."]}
             for i in range(4)]
PIQA = [{'goal': 'To open a jar,', 'sol1': 'twist the lid.', 'sol2': 'eat the lid.', 'label': 0},
        {'goal': 'To dry hands,', 'sol1': 'wet them.', 'sol2': 'use a towel.', 'label': 1}]


@pytest.fixture(scope='module')
def setup(tmp_path_factory, gpt2):
    """A checkpoint of a tiny GPT-2-vocabulary model, and a directory of task files that point
    the harness's own hellaswag and piqa at local files."""
    root = tmp_path_factory.mktemp('lm_eval')
    torch.manual_seed(0)
    model = lime.GPT(lime.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK_SIZE,
                                    vocab_size=prepare.EOT + 1, router='static'))
    (root / 'run').mkdir()
    lime.save_checkpoint(root / 'run' / 'ckpt.pt', model, step=7, best_val_loss=1.0)
    tasks = root / 'tasks'
    tasks.mkdir()
    harness_tasks = os.path.join(os.path.dirname(importlib.util.find_spec('lm_eval').origin),
                                 'tasks')
    for task, lines in {'hellaswag': HELLASWAG, 'piqa': PIQA}.items():
        data = root / f'{task}.jsonl'
        data.write_text(''.join(json.dumps(line) + '\n' for line in lines))
        (tasks / f'{task}.yaml').write_text('\n'.join([
            f'include: {os.path.join(harness_tasks, task, task + ".yaml")}', f'task: {task}',
            'dataset_path: json', 'dataset_name: null', 'dataset_kwargs:', '  data_files:',
            f'    train: {data}', f'    validation: {data}']) + '\n')
    return root


@pytest.mark.optional
@needs_lm_eval
def test_table1_scores_the_harness_tasks_on_local_files(setup, monkeypatch, capsys):
    import lm_eval.tasks
    from lab import table1
    # In this process, the harness's index of its tasks (seconds to build) built once.
    monkeypatch.setattr(lm_eval.tasks, 'TaskManager', functools.cache(lm_eval.tasks.TaskManager))

    def main(tasks):
        monkeypatch.setattr(sys, 'argv', ['table1', f"--out_dir={setup / 'run'}", '--device=cpu',
                                          f'--tasks={tasks}', f"--include_path={setup / 'tasks'}"])
        table1.main()

    main('hellaswag,piqa')
    assert '|hellaswag|' in capsys.readouterr().out.replace(' ', '')
    results = json.loads((setup / 'run' / 'table1.json').read_text())
    assert results['config']['lime_step'] == 7 and results['config']['lime_dtype'] == 'float32'
    assert results['n-samples']['hellaswag']['effective'] == 4
    assert results['n-samples']['piqa']['effective'] == 2
    assert 0 <= results['results']['hellaswag']['acc_norm,none'] <= 1
    # Offline, a task whose data is neither cached nor local; and a name the harness lacks.
    with pytest.raises(SystemExit, match="^error: could not load a task's data set .Couldn't "
                                         "reach 'allenai/sciq'"):
        main('sciq')
    with pytest.raises(SystemExit, match='^error: the harness has no task hellaswa '):
        main('hellaswa')


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

    # An empty context: <|endoftext|> before the continuation (TemplateLM's doing); and a batch
    # of two, one padded, each scored as alone.
    text = enc.encode_ordinary('Hello there, world.')
    (ll, greedy), (ll2, _) = lm.loglikelihood([request('loglikelihood', '', 'Hello there, world.'),
                                               request('loglikelihood', 'Hello', ' there')])
    assert math.isclose(ll, by_hand([prepare.EOT] + text[:-1], text), abs_tol=1e-4)
    assert math.isclose(ll2, by_hand(text[:1], text[1:2]), abs_tol=1e-4) and greedy is False
    # A text longer than block_size: the first BLOCK_SIZE tokens after <|endoftext|>, the rest
    # from the BLOCK_SIZE tokens before each (the harness's rolling windows).
    long = enc.encode_ordinary('The riders circle the arena again. ' * 20)[:100]
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
def test_the_registration_survives_a_second_run_of_the_module(setup):
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
    lm = get_model('lime').create_from_arg_string(f"out_dir={setup / 'run'},batch_size=3",
                                                  {'device': 'cpu'})
    assert lm.batch_size == 3 and lm.get_model_info()['lime_step'] == 7


def test_without_lm_eval_one_line_says_how_to_install_it():
    hide = ("import runpy, sys; sys.modules['lm_eval'] = None; "
            "sys.argv = ['table1', '--out_dir=nowhere']; runpy.run_module('lab.table1', "
            "run_name='__main__')")
    result = subprocess.run([sys.executable, '-c', hide], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, 'PYTHONPATH': ROOT}, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith('error: scoring with the LM Evaluation Harness needs it: pip '
                                    'install lm-eval==0.4.13'), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
