"""
Bad input, across every script: each case must stop with a non-zero exit and one `error:` line that
names the problem, no traceback, and leave every file of an earlier run as it was. Most cases stop
before any training; they run one after another in one Python process (BATCH, each as
`python SCRIPT ARGS` would run it), which saves a torch import per case. prepare.py's (it forks
tokenizer workers) and those that train run alone, as commands; those that need a trained run share one.

    python -m pytest -q test_errors.py
"""
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

import lime
import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: scripts run from there
TINY = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
        '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=1', '--warmup_iters=2',
        '--learning_rate=3e-3', '--router_lr=3e-2', '--min_lr=3e-4']
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has a CUDA GPU')


def run(script, *args, cwd=ROOT, torchrun=False):
    launcher = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2'] \
        if torchrun else [sys.executable]
    target = ['-m', script[:-3].replace('/', '.')] if '/' in script else [os.path.join(ROOT, script)]
    return subprocess.run([*launcher, *target, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': ROOT})


def error_line(result):
    """The one `error:` line a failed script printed last on stderr (`prepare.py: error:` there,
    argparse style). Lines before it may be progress bars or notes, not a traceback or another error."""
    assert result.returncode != 0, f"expected a failure:\n{result.stdout}\n{result.stderr}"
    assert 'Traceback' not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if re.match(r'(prepare\.py: )?error: ', line)]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    return errors[0]


@pytest.fixture(scope='module')
def root(tmp_path_factory, gpt2):
    """Data, a trained run, and the bad files the cases feed the scripts (GPT-2 tokens: offline,
    without GPT-2's files, the cases that use them skip; conftest.py)."""
    root = tmp_path_factory.mktemp('errors')
    prepare.main(['--out_dir', str(root / 'data'), '--workers', '2'])
    result = run('train.py', *TINY, f'--data_dir={root / "data"}', f'--out_dir={root / "run"}',
                 '--max_iters=2', '--eval_interval=2')
    assert result.returncode == 0, result.stdout + result.stderr
    files = root / 'files'
    files.mkdir()
    (files / 'syntax.py').write_text('n_layer = 4\nn_head = (\n')
    (files / 'latin1.py').write_bytes('n_layer = 4  # café\n'.encode('latin-1'))
    (files / 'latin1.txt').write_bytes('Café'.encode('latin-1'))
    (files / 'a_file').write_text('not a directory')
    with gzip.open(files / 'docs.jsonl.gz', 'wt') as f:
        f.writelines(json.dumps({'text': f'document {i} ' * 50}) + '\n' for i in range(200))
    (files / 'truncated.jsonl.gz').write_bytes((files / 'docs.jsonl.gz').read_bytes()[:200])
    (files / 'plain.jsonl.gz').write_text('{"text": "gzip in name only"}\n')
    good = '{"context": "a", "endings": ["b", "c"], "label": 0}\n'
    (files / 'bad_json.jsonl').write_text(good + '{"context": \n')
    (files / 'bad_label.jsonl').write_text(good.replace('0}', '2}'))
    (files / 'foreign').mkdir()
    torch.save({'weights': torch.zeros(2)}, files / 'foreign' / 'ckpt.pt')
    # Data whose training shards are all shorter than one micro-step of TINY (4 x 32 + 1 tokens).
    val = prepare.read_shard(root / 'data' / 'pydoc_val_000000.bin')
    (files / 'short').mkdir()
    prepare.write_shard(files / 'short' / 'x_val_000000.bin', val)
    for i in (1, 2):
        prepare.write_shard(files / 'short' / f'x_train_00000{i}.bin', val[:100])
    (files / 'empty_ending.jsonl').write_text(good + good.replace('"c"', '""'))
    # The trained run's checkpoint: a flipped bit in a weight, a missing weight, a setting of
    # another lime.py; and moved beside data that changed since (other data's shard sorts first).
    changed = files / 'changed'
    checkpoint = torch.load(root / 'run' / 'ckpt.pt', weights_only=True)
    for name, change in [('missing', lambda c: c['model'].pop('blocks.1.attn_norm.weight')),
                         ('newer', lambda c: c['model_args'].update(n_experts=8)),
                         ('moved', lambda c: c['data'].update(data_dir=str(changed.resolve()))),
                         ('flipped', lambda c: None),  # and three parts of the state edited by hand:
                         ('badopt', lambda c: c.update(optimizer={'state': {}, 'param_groups': []})),
                         ('badrng', lambda c: c.update(rng={'cpu': torch.zeros(3)})),
                         ('baddata', lambda c: c['data'].pop('pos')),
                         ('zerointerval', lambda c: c['config'].update(eval_interval=0)),
                         ('badsetting', lambda c: c['config'].update(learning_rate='3e-3'))]:
        copy = {**checkpoint, **{k: dict(checkpoint[k])
                                 for k in ('model', 'model_args', 'data', 'config')}}
        change(copy)
        (files / name).mkdir()
        torch.save(copy, files / name / 'ckpt.pt')
    with zipfile.ZipFile(files / 'flipped' / 'ckpt.pt') as archive:
        weight = max(archive.infolist(), key=lambda info: info.file_size)  # the embedding
    with open(files / 'flipped' / 'ckpt.pt', 'r+b') as f:  # one bit, 100 bytes into its data
        f.seek(weight.header_offset + 26)
        name_length, extra_length = struct.unpack('<HH', f.read(4))  # of the local file header
        f.seek(name_length + extra_length + 100, 1)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0x10]))
    shutil.copytree(root / 'data', changed)
    shutil.copy(changed / 'pydoc_train_000001.bin', changed / 'arith_train_000001.bin')
    shutil.copytree(root / 'run', files / 'badlog')  # its log.txt edited by hand
    with open(files / 'badlog' / 'log.txt', 'ab') as f:
        f.write('{"step": 1, "note": "café"}\nnot json\n'.encode('latin-1'))
    shutil.copytree(root / 'run', files / 'nullstep')  # a record whose step is no number
    with open(files / 'nullstep' / 'log.txt', 'a') as f:
        f.write('{"step": null}\n')
    # Data whose tokenizer.json is cut short, or not an object; whose shards are directories
    for name, text in [('cut_tokenizer', '{"tokenizer": "byt'), ('list_tokenizer', '[1, 2]')]:
        (files / name).mkdir()
        shutil.copy(root / 'data' / 'pydoc_val_000000.bin', files / name)
        (files / name / 'tokenizer.json').write_text(text)
    for shard in ('x_val_000000.bin', 'x_train_000001.bin'):
        (files / 'shard_dirs' / shard).mkdir(parents=True)
    # lab/arith.py's data with a task.json of the wrong types, and a checkpoint trained "on it"
    (files / 'arith_types').mkdir()
    (files / 'arith_types' / 'task.json').write_text(json.dumps(
        {'seed': 1, 'modulus': '11', 'min_ops': 1, 'max_ops': 2, 'cot': True}))
    (files / 'arith_run').mkdir()
    model = lime.GPT(lime.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=18))
    where = {'data_dir': str(files / 'arith_types')}
    lime.save_checkpoint(files / 'arith_run' / 'ckpt.pt', model, step=1, best_val_loss=1.0,
                         config=where, data=where)
    (files / 'huge_preset.py').write_text('n_layer = 1000000000\n')
    (files / 'expression_preset.py').write_text('n_layer = 10**9\n')
    return root


def snapshot(root):
    """Every file of the earlier run, the data and the bad inputs, by content; but .lock, the empty
    file a run into a directory holds it by (it makes one where there is none), none of its files."""
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob('*')) if path.is_file() and path.name != '.lock'}


def uses_root(args):
    """Whether a case reads the data, the trained run or the bad files of the fixture root."""
    return any(place in arg for arg in args for place in ('{data}', '{run}', '{files}'))


def case(name, script, args, message, needs_no_gpu=False, alone=False):
    """script run with args (split at spaces; {tiny} stands for TINY, and {data}, {run}, {files} and
    {scratch} for their directories) must fail with message in its error line. alone: as a command of
    its own, not in the batch. A case that reads root's GPT-2 data skips without its files, so it
    is marked optional: it runs where they are (conftest.py)."""
    marks = [no_gpu] if needs_no_gpu else []
    if uses_root(args.split()):
        marks.append(pytest.mark.optional)
    return pytest.param(name, script, args.split(), message, alone or script == 'prepare.py', id=name,
                        marks=marks)


CASES = [
    # devices this machine lacks, checked in configurator.configure, which every script calls
    case('train-cuda', 'train.py', '--device=cuda', 'sees no CUDA GPU', needs_no_gpu=True),
    case('train-gpu', 'train.py', '--device=gpu', "got 'gpu'"),
    case('train-mps', 'train.py', '--device=mps', "got 'mps'"),
    case('sample-cuda-is-not-a-damaged-checkpoint', 'sample.py', '--out_dir={run} --device=cuda',
         'sees no CUDA GPU', needs_no_gpu=True),
    case('bench-cuda', 'lab/bench.py', '--device=cuda', 'sees no CUDA GPU', needs_no_gpu=True),
    case('bench-mps', 'lab/bench.py', '--device=mps', "got 'mps'"),
    case('bench-batch', 'lab/bench.py', '--batch_size=-1', 'batch_size must be >= 0'),
    case('bench-shape', 'lab/bench.py', '--shape=gpt3', "shape must be one of"),
    case('bench-all-on-cpu', 'lab/bench.py', '--shape=all', '--shape=all runs the GPU shapes', needs_no_gpu=True),
    case('bench-router', 'lab/bench.py', '--routers=none,statc', "'statc' is not one of"),
    case('analyze-cuda', 'lab/analyze.py', '--out_dirs={run} --device=cuda', 'sees no CUDA GPU',
         needs_no_gpu=True),
    case('evaluate-cuda', 'lab/evaluate.py', '--out_dir={run} --device=cuda', 'sees no CUDA GPU',
         needs_no_gpu=True),
    case('arith-cuda', 'lab/arith.py', '--mode=eval --ckpt_dir={run} --device=cuda:7', "'cuda:7'"),
    # every numeric key has its range
    case('negative-grad-clip', 'train.py', '--grad_clip=-1', 'grad_clip must be >= 0'),
    case('negative-lr', 'train.py', '--learning_rate=-1e-3', 'learning_rate must be > 0'),
    case('zero-peak-flops', 'train.py', '--peak_flops=0', 'peak_flops must be > 0'),
    case('empty-out-dir', 'train.py', '--out_dir=', 'out_dir must be a non-empty path'),
    case('infinite-lr', 'train.py', '--learning_rate=1e999', 'learning_rate must be a finite number'),
    case('beta2-one', 'train.py', '--beta2=1.0', 'beta2 must be in [0, 1)'),
    case('negative-decay', 'train.py', '--weight_decay=-0.1', 'weight_decay must be >= 0'),
    case('zero-top-p', 'train.py', '--router_top_p=0', 'router_top_p must be in (0, 1]'),
    case('negative-kv-heads', 'train.py', '--n_kv_head=-2', 'n_kv_head must be >= 0'),
    case('negative-warmup', 'train.py', '--warmup_iters=-5', 'warmup_iters must be >= 0'),
    case('negative-seed', 'train.py', '--seed=-1', 'seed must be from 0'),
    case('min-lr-above-lr', 'train.py', '--min_lr=0.1', 'min_lr (0.1) must not exceed learning_rate'),
    case('init-from', 'train.py', '--init_from=resum', "init_from must be one of 'scratch', 'resume'"),
    case('fused-int', 'train.py', '--fused=1', 'fused must be bool (like False), got 1'),
    case('sample-negative-temperature', 'sample.py', '--temperature=-1', 'temperature must be >= 0'),
    case('sample-tiny-temperature', 'sample.py', '--temperature=1e-300', 'give --temperature=0'),
    case('sample-negative-top-k', 'sample.py', '--top_k=-5', 'top_k must be >= 0'),
    case('analyze-negative-alpha', 'lab/analyze.py', '--alpha=-1', 'alpha must be > 0'),
    case('arith-modulus', 'lab/arith.py', '--modulus=12', 'modulus must be a prime'),
    case('arith-dunder-is-no-key', 'lab/arith.py', '--__name__=x', "unknown key '__name__'"),
    case('evaluate-nothing', 'lab/evaluate.py', '--out_dir={run} --task=', 'nothing to evaluate'),
    case('train-mc-interval-without-task', 'train.py', '{tiny} --data_dir={data} --out_dir={scratch}/o '
         '--mc_interval=2', 'mc_interval needs mc_task'),
    # config files that are not config files
    case('config-syntax', 'train.py', '{files}/syntax.py', 'syntax.py:2: not a config file'),
    case('config-not-utf8', 'train.py', '{files}/latin1.py', 'latin1.py: not UTF-8'),
    case('bench-config-syntax', 'lab/bench.py', '{files}/syntax.py', 'syntax.py:2: not a config file'),
    case('sample-config-not-utf8', 'sample.py', '{files}/latin1.py', 'latin1.py: not UTF-8'),
    # input files
    case('prepare-truncated-gzip', 'prepare.py', '--input {files}/truncated.jsonl.gz --out_dir {scratch}/p',
         'truncated.jsonl.gz: could not read it (Compressed file ended'),
    case('prepare-not-gzip', 'prepare.py', '--input {files}/plain.jsonl.gz --out_dir {scratch}/p',
         'plain.jsonl.gz: could not read it (Not a gzipped file'),
    case('prepare-out-dir-is-a-file', 'prepare.py', '--out_dir {files}/a_file', 'a_file: Not a directory'),
    case('sample-prompt-not-utf8', 'sample.py', '--out_dir={run} --start=FILE:{files}/latin1.txt',
         'latin1.txt: not UTF-8'),
    case('arith-out-dir-under-a-file', 'lab/arith.py', '--out_dir={files}/a_file/arith',
         'a_file: File exists'),
    case('evaluate-task-not-found', 'lab/evaluate.py', '--out_dir={run} --task={files}/nothing.jsonl',
         'task file not found'),
    case('evaluate-task-line-not-json', 'lab/evaluate.py', '--out_dir={run} --task={files}/bad_json.jsonl',
         'bad_json.jsonl:2: not a JSON object'),
    case('evaluate-task-label-out-of-range', 'lab/evaluate.py', '--out_dir={run} --task={files}/bad_label.jsonl',
         'bad_label.jsonl:1: expected {"context"'),
    case('evaluate-hellaswag-offline', 'lab/evaluate.py', '--out_dir={run} --task=hellaswag '
         '--cache_dir={scratch}/t --hellaswag_url=file:///nowhere/hs',
         'could not download file:///nowhere/hs/hellaswag_val.jsonl'),
    case('evaluate-data-of-no-shards', 'lab/evaluate.py', '--out_dir={run} --task= --data_dir={files}',
         'no *_val_*.bin shards in'),
    # data and checkpoints
    case('no-shard-holds-one-step', 'train.py', '{tiny} --data_dir={files}/short --out_dir={scratch}/o',
         'no training shard in'),
    case('val-shard-smaller-than-a-batch', 'train.py', '{tiny} --data_dir={data} --out_dir={scratch}/o '
         '--batch_size=8 --block_size=1024', 'fewer than one batch (batch_size * block_size = 8,192): '
         'lower them, as config/cpu_demo.py does'),
    case('out-dir-is-a-file', 'train.py', '{tiny} --data_dir={data} --out_dir={files}/a_file',
         'cannot write to out_dir'),
    case('resume-foreign-checkpoint', 'train.py', '--out_dir={files}/foreign --init_from=resume --device=cpu',
         'does not load into this lime.py'),
    case('sample-foreign-checkpoint', 'sample.py', '--out_dir={files}/foreign',
         'does not load into this lime.py'),
    case('analyze-foreign-checkpoint', 'lab/analyze.py', '--out_dirs={files}/foreign --data_dir={data}',
         'does not load into this lime.py'),
    case('arith-eval-of-a-text-model', 'lab/arith.py', '--mode=eval --ckpt_dir={run} --device=cpu',
         "not this task's 18"),
    # an earlier run: never lost to a repeated command, and resumed as it was saved
    case('repeated-command-keeps-the-run', 'train.py',
         '{tiny} --data_dir={data} --out_dir={run} --max_iters=2 --eval_interval=2', '--init_from=resume',
         alone=True),
    case('resume-contradicts-the-model', 'train.py',
         '--out_dir={run} --init_from=resume --device=cpu --block_size=64',
         "--block_size=64 would make another run than the checkpoint's (block_size=32)"),
    case('resume-missing-weight', 'train.py', '--out_dir={files}/missing --init_from=resume '
         '--device=cpu', 'Missing key(s) in state_dict: "blocks.1.attn_norm.weight"'),
    case('resume-another-lime', 'train.py', '--out_dir={files}/newer --init_from=resume '
         '--device=cpu', "does not load into this lime.py: GPTConfig.__init__() got an "
         "unexpected keyword argument 'n_experts'"),
    case('resume-on-changed-data', 'train.py', '--out_dir={files}/moved --init_from=resume '
         '--device=cpu --max_iters=4 --data_dir={files}/changed', 'changed since the checkpoint'),
    # a setting that would make the resumed run another run is refused
    case('resume-with-a-new-seed', 'train.py', '--out_dir={run} --init_from=resume --device=cpu '
         '--max_iters=4 --seed=7', "--seed=7 would make another run than the checkpoint's"),
    case('resume-and-overwrite', 'train.py', '--out_dir={run} --init_from=resume --device=cpu '
         '--max_iters=4 --overwrite=True', '--overwrite=True replaces the run in out_dir, '
         '--init_from=resume continues it'),
    case('resume-with-a-task-that-cannot-be-scored', 'train.py',
         '--out_dir={run} --init_from=resume --device=cpu --max_iters=6 '
         '--mc_task={files}/empty_ending.jsonl --mc_interval=2',
         'empty_ending.jsonl:2: ending 1 holds no text to score'),
    case('evaluate-empty-ending', 'lab/evaluate.py',
         '--out_dir={run} --task={files}/empty_ending.jsonl',
         'empty_ending.jsonl:2: ending 1 holds no text to score'),
    case('arith-prepare-into-text-data', 'lab/arith.py', '--mode=prepare --out_dir={data}',
         'holds another data set'),
    case('arith-eval-of-a-data-setting', 'lab/arith.py',
         '--mode=eval --ckpt_dir={run} --modulus=13', 'has no use for modulus'),
    case('prepare-into-another-data-set', 'prepare.py', '--out_dir {files}/short',
         'holds other files'),
    case('nan-before-any-checkpoint', 'train.py', '{tiny} --data_dir={data} --out_dir={scratch}/nan '
         '--learning_rate=1e30 --router_lr=1e30 --min_lr=0 --grad_clip=0 --max_iters=50',
         'No checkpoint was saved: start again', alone=True),
    # files in data_dir and out_dir, malformed
    case('train-tokenizer-json-cut-short', 'train.py',
         '{tiny} --data_dir={files}/cut_tokenizer --out_dir={scratch}/o',
         "cut_tokenizer/tokenizer.json: not prepare.py's tokenizer.json (Unterminated string"),
    case('evaluate-tokenizer-json-not-an-object', 'lab/evaluate.py',
         '--out_dir={run} --task= --data_dir={files}/list_tokenizer',
         "list_tokenizer/tokenizer.json: not prepare.py's tokenizer.json"),
    case('prepare-tokenizer-json-cut-short', 'prepare.py', '--out_dir {files}/cut_tokenizer',
         "tokenizer.json: not prepare.py's tokenizer.json"),
    case('train-shard-is-a-directory', 'train.py',
         '{tiny} --data_dir={files}/shard_dirs --out_dir={scratch}/o',
         'x_train_000001.bin: not a file, so not a token shard'),
    case('evaluate-shard-is-a-directory', 'lab/evaluate.py',
         '--out_dir={run} --task= --data_dir={files}/shard_dirs',
         'x_val_000000.bin: not a file, so not a token shard'),
    case('analyze-shard-is-a-directory', 'lab/analyze.py',
         '--out_dirs={run} --data_dir={files}/shard_dirs', 'x_val_000000.bin: not a file'),
    case('arith-eval-task-json-of-wrong-types', 'lab/arith.py',
         '--mode=eval --ckpt_dir={files}/arith_run --device=cpu',
         "arith_types/task.json is not the task.json that `python -m lab.arith --mode=prepare` writes"),
    # sizes no data holds: refused before anything is allocated, in one line
    case('analyze-more-sequences-than-places', 'lab/analyze.py',
         '--out_dirs={run} --data_dir={data} --batch_size=1000000000',
         '--batch_size=1000000000: more sequences than the'),
    # and what would run for hours (trial divisions up to 3e9, expressions of 10**9 operators,
    # a billion test expressions) or overflow a shard's int32 count of tokens
    case('arith-modulus-of-ten-million-trial-divisions', 'lab/arith.py', f'--modulus={10**14 + 31}',
         'modulus must be below 10**14'),
    case('train-rope-base-below-one', 'train.py', '--rope_base=1e-300', 'rope_base must be >= 1'),
    case('arith-huge-max-ops', 'lab/arith.py', '--max_ops=1000000000', 'max_ops must be at most 100'),
    case('arith-huge-train-split', 'lab/arith.py', '--out_dir={scratch}/a --train_per_ops=1000000000',
         'train_per_ops=1000000000 makes a split of about'),
    case('arith-huge-eval-set', 'lab/arith.py', '--mode=eval --ckpt_dir={run} '
         '--eval_per_ops=1000000000', 'eval_per_ops must be at most 100,000'),
    case('prepare-huge-shard-size', 'prepare.py', '--out_dir {scratch}/p --shard_size 1000B',
         'argument --shard_size: at most 2**31 - 1 tokens'),
    case('prepare-huge-workers', 'prepare.py', '--out_dir {scratch}/p --workers 1B',
         'argument --workers: at most 4 per CPU core'),
    case('prepare-nan-count', 'prepare.py', '--out_dir {scratch}/p --val_every nan',
         "argument --val_every: expected a positive count"),
]

# Every numeric key of every script (`--help` lists them) at its extremes, as {script: (keys that
# must be > 0, keys that may be 0)}, ints then floats. Each gets past int64 (10**30: an int) or
# non-finite (1e999 and -1e999: a float), -1, and 0 where it must be > 0. Accepted, so not here:
# 0 where it means none, all or off (n_kv_head, mlp_hidden, hyper_connections, mc_interval,
# warmup_iters, lr_decay_iters, top_k, max_examples, shots, limit, num_fewshot, bench's
# batch_size), or is a value (seed, temperature 0: greedy; router_lr, weight_decay, beta1, beta2,
# grad_clip, min_lr); tiny floats (1e-300: a learning_rate below min_lr is refused, a temperature
# too, in words of its own); and huge values that fit in int64 and mean "longer" (max_iters,
# eval_iters, gradient_accumulation_steps, max_new_tokens, steps, warmup, limit: they run as
# long as asked; the data caps eval_iters and batch sizes).
NUMERIC_KEYS = {
    'train.py': (['eval_interval', 'eval_iters', 'log_interval', 'mc_examples', 'n_layer',
                  'n_head', 'n_embd', 'block_size', 'vocab_size', 'batch_size',
                  'gradient_accumulation_steps', 'max_iters'],
                 ['mc_interval', 'n_kv_head', 'mlp_hidden', 'hyper_connections', 'warmup_iters',
                  'lr_decay_iters', 'seed'],
                 ['rope_base', 'router_top_p', 'learning_rate', 'peak_flops'],
                 ['router_lr', 'weight_decay', 'beta1', 'beta2', 'grad_clip', 'min_lr']),
    'sample.py': (['num_samples', 'max_new_tokens'], ['top_k', 'seed'], [], ['temperature']),
    'lab/evaluate.py': (['batch_size'], ['max_examples'], [], []),
    'lab/analyze.py': (['batch_size', 'probe_examples', 'probe_folds'], ['seed'], ['alpha'], []),
    'lab/arith.py': (['modulus', 'min_ops', 'max_ops', 'train_per_ops', 'val_per_ops',
                      'eval_per_ops', 'eval_batch'], ['seed'], [], []),
    'lab/bench.py': (['hyper_connections', 'steps', 'warmup'], ['batch_size'],
                     ['peak_flops', 'bandwidth', 'minutes'], []),
    'lab/plot.py': (['n_ops'], [], [], []),
    'lab/table1.py': (['batch_size'], ['num_fewshot', 'limit'], [], []),
}


def sweep(script, positive_ints, ints, positive_floats, floats):
    values = {key: ['1000000000000000000000000000000', '-1'] for key in positive_ints + ints}
    values.update({key: ['1e999', '-1e999', '-1'] for key in positive_floats + floats})
    for key in positive_ints + positive_floats:
        values[key].append('0')
    return [case(f"{script.removeprefix('lab/')[:-3]}-{key}={value}", script, f'--{key}={value}',
                 f"{key} must be") for key, keys in values.items() for value in keys]


CASES += [param for script, keys in NUMERIC_KEYS.items() for param in sweep(script, *keys)]

# Runs cases [(name, script, args, cwd)] one after another in this one process, each as
# `python SCRIPT ARGS` in cwd would (a SystemExit's message goes to stderr, as Python prints it), and
# prints, as JSON, each one's exit status, stderr, and whether any file under root (argv[1]) changed.
BATCH = """
import contextlib, hashlib, io, json, os, pathlib, runpy, sys, traceback
root = pathlib.Path(sys.argv[1])
hashed = {}  # path: (its stat, its hash): a file is hashed again only when written since
def digest(p):
    st = p.stat()
    if hashed.get(p, (None,))[0] != (st.st_size, st.st_mtime_ns, st.st_ino):
        hashed[p] = (st.st_size, st.st_mtime_ns, st.st_ino), hashlib.sha256(p.read_bytes()).hexdigest()
    return hashed[p][1]
def snapshot():  # but .lock: the empty file a run into a directory holds it by, none of its files
    return {str(p): digest(p) for p in sorted(root.rglob('*')) if p.is_file() and p.name != '.lock'}
results = {}
repo = sys.argv[2]
sys.path.insert(0, repo)  # for `python -m lab.NAME` and for the scripts' imports
for name, script, args, cwd in json.load(sys.stdin):
    os.chdir(cwd)
    sys.argv = [script, *args]
    before, err, status = snapshot(), io.StringIO(), 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            if script.startswith('lab/'):  # python -m lab.NAME
                runpy.run_module(script[:-3].replace('/', '.'), run_name='__main__', alter_sys=True)
            else:
                runpy.run_path(os.path.join(repo, script), run_name='__main__')
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)
        except BaseException:
            status = 1
            traceback.print_exc()
    results[name] = {'returncode': status, 'stderr': err.getvalue(), 'changed': snapshot() != before}
print(json.dumps(results))
"""


def case_args(root, scratch, args):
    places = {'scratch': scratch}
    if root is not None:
        places.update(data=root / 'data', run=root / 'run', files=root / 'files')
    return [part for arg in args for part in (TINY if arg == '{tiny}' else [arg.format(**places)])]


def run_batch(root, with_root, tmp_path_factory):
    """The results of the batched cases that use root (with_root) or not, by name: each ran with
    a scratch directory of its own."""
    cases = []
    for param in CASES:
        name, script, args, _, alone = param.values
        if not alone and uses_root(args) == with_root:
            scratch = tmp_path_factory.mktemp(name)
            cases.append((name, script, case_args(root, scratch, args), str(scratch)))
    result = subprocess.run([sys.executable, '-c', BATCH, str(root), ROOT], input=json.dumps(cases), capture_output=True,
                            text=True, cwd=ROOT, timeout=600, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope='module')
def batch_with_root(root, tmp_path_factory):
    return run_batch(root, True, tmp_path_factory)


@pytest.fixture(scope='module')
def batch_without_root(tmp_path_factory):
    return run_batch(tmp_path_factory.mktemp('no_root'), False, tmp_path_factory)


@pytest.mark.parametrize('name, script, args, message, alone', CASES)
def test_bad_input_stops_with_one_error_line_and_changes_no_earlier_file(request, tmp_path, name, script,
                                                                         args, message, alone):
    root = request.getfixturevalue('root') if uses_root(args) else None  # only these need GPT-2
    if not alone:
        ran = request.getfixturevalue('batch_with_root' if root else 'batch_without_root')[name]
        assert message in error_line(subprocess.CompletedProcess(script, ran['returncode'], '', ran['stderr']))
        assert not ran['changed'], f"{name} changed a file of the earlier run"
        return
    before = snapshot(root) if root else None
    result = run(script, *case_args(root, tmp_path, args), cwd=tmp_path)
    assert message in error_line(result)
    assert root is None or snapshot(root) == before


def test_torchrun_reports_a_bad_input_once(tmp_path):
    result = run('train.py', '--device=cpu', f'--data_dir={tmp_path / "nowhere"}', cwd=tmp_path,
                 torchrun=True)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
    assert len(errors) == 1 and errors[0].startswith(f"error: data_dir not found: {tmp_path / 'nowhere'} "
                                                     "(prepare.py writes shards"), errors


def test_a_second_run_into_a_busy_out_dir_is_refused(root, tmp_path):
    out = tmp_path / 'out'
    cmd = [sys.executable, os.path.join(ROOT, 'train.py'), *TINY, f'--data_dir={root / "data"}',
           f'--out_dir={out}', '--max_iters=100000']
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          cwd=tmp_path) as first:
        try:
            for line in first.stdout:
                if line.startswith('step 0/'):  # out_dir is held before the first evaluation
                    break
            second = run('train.py', *TINY, f'--data_dir={root / "data"}', f'--out_dir={out}',
                         '--overwrite=True', cwd=tmp_path)
            assert 'another run is training into' in error_line(second)
            assert first.poll() is None, "the first run must go on"
        finally:
            first.send_signal(signal.SIGKILL)


@pytest.mark.parametrize('script', ['train.py', 'sample.py', 'lab/bench.py', 'lab/analyze.py', 'lab/arith.py',
                                    'lab/evaluate.py'])
def test_help_lists_every_key_with_its_default_and_comment(script):
    result = run(script, '--help')
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert re.search(r'^  --device=\w+', result.stdout, re.M), result.stdout
    if script == 'train.py':
        assert re.search(r'^  --grad_clip=1\.0 +0 disables clipping$', result.stdout, re.M), result.stdout


@pytest.mark.parametrize('text', ['{"vocab": "ab', '[1]', '{"vocab": 5}'])
def test_a_malformed_task_json_means_no_bits_per_byte(tmp_path, text):
    """train.py and lab/evaluate.py leave bits per byte out, with a note naming the file, where
    lab/arith.py's task.json does not give the characters (cut short, or of other types)."""
    (tmp_path / 'task.json').write_text(text)
    counts, why = prepare.token_bytes(18, str(tmp_path))
    assert counts is None and why == f"{tmp_path / 'task.json'} does not give the 18 tokens' characters"


@pytest.mark.parametrize('script', sorted(NUMERIC_KEYS))
def test_the_sweep_covers_every_numeric_key(script):
    """NUMERIC_KEYS lists each script's int and float keys: a key added to a defaults block
    without a place in the sweep fails here. The keys: the block's `name = number` lines, those
    before the script's configure call (what configure reads from the script's globals)."""
    import ast
    tree = ast.parse(open(os.path.join(ROOT, script), encoding='utf-8').read())
    calls = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, 'id', None) == 'configure']
    numeric = set()
    for node in tree.body:
        if (isinstance(node, ast.Assign) and node.lineno < min(calls) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id.islower()):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:  # not a literal: device's default, say
                continue
            if type(value) in (int, float):
                numeric.add(node.targets[0].id)
    assert numeric == {key for keys in NUMERIC_KEYS[script] for key in keys}


def test_a_text_key_takes_the_text_as_typed():
    # A list of numbers, or a path that looks like a number, is text where the key is text: one
    # seed (--seeds=1) is '1', not the int 1 refused as the wrong type.
    from configurator import configure
    defaults = {'seeds': '1,2,3', 'out_dir': 'out', 'steps': 10}
    config, given, _ = configure(dict(defaults), {}, ['--seeds=1', '--out_dir=2026', '--steps=3'])
    assert (config['seeds'], config['out_dir'], config['steps']) == ('1', '2026', 3)
    assert given == {'seeds', 'out_dir', 'steps'}
    with pytest.raises(SystemExit, match="steps must be int"):  # a number key still checks its type
        configure(dict(defaults), {}, ['--steps=fast'])
