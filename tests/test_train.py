"""
Tests for train.py and the settings it reads through configurator.py, run as a user runs them: as
commands, on a tiny model and the embedded Python-docs data set, on the CPU. test_sample.py and
test_bench.py use its helpers.

    python -m pytest -q
"""
import glob
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: scripts run from there
TINY = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
        '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=1', '--warmup_iters=2',
        '--learning_rate=3e-3', '--router_lr=3e-2', '--min_lr=3e-4']
BYTES = '--vocab_size=257'  # the model for byte-level data (the fixture bytes_dir)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory, gpt2):  # GPT-2 tokens: skips offline without its files (conftest.py)
    out = tmp_path_factory.mktemp('data') / 'pydoc'
    prepare.main(['--out_dir', str(out), '--workers', '2'])
    return str(out)


@pytest.fixture(scope='module')
def bytes_dir(tmp_path_factory):
    """The same docs at byte level, for tests of train.py's mechanics: no tokenizer files needed,
    so these run offline too (and in .ci/run's bare half: tests/conftest.py)."""
    out = tmp_path_factory.mktemp('data') / 'pydoc_bytes'
    prepare.main(['--out_dir', str(out), '--workers', '2', '--tokenizer', 'bytes'])
    return str(out)


def command(script):
    """How a user runs script from the repo root: python train.py, or python -m lab.evaluate."""
    if '/' in script:
        return [sys.executable, '-m', script.removesuffix('.py').replace('/', '.')]
    return [sys.executable, os.path.join(ROOT, script)]


def run(script, *args, check=True, cwd=ROOT):
    result = subprocess.run([*command(script), *args], capture_output=True, text=True, cwd=cwd,
                            timeout=300, env={**os.environ, 'PYTHONPATH': ROOT})
    if check:
        assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result


def train(data_dir, out_dir, *args, check=True, cwd=ROOT):
    return run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out_dir}', *args,
               check=check, cwd=cwd)


def saved(out_dir):
    """The checkpoint in out_dir, read as lime.load_checkpoint reads it: tensors and plain values
    only (weights_only), never a pickle's code."""
    return torch.load(os.path.join(out_dir, 'ckpt.pt'), weights_only=True)


def log_records(out_dir):
    """The step records of out_dir/log.txt, after the run's record that opens it (and only it)."""
    with open(os.path.join(out_dir, 'log.txt')) as f:
        header, *records = [json.loads(line) for line in f]
    assert set(header) == {'config', 'params', 'flops_per_token'}, header
    assert all('step' in record for record in records)
    return records


def read_log(out_dir):
    """{step: loss} for the train and the val lines of out_dir/log.txt."""
    train_loss, val_loss = {}, {}
    for record in log_records(out_dir):
        if 'train_loss' in record:
            train_loss[record['step']] = record['train_loss']
        else:
            val_loss[record['step']] = record['val_loss']
    return train_loss, val_loss


def logged_steps(out_dir):
    """The (step, kind) of each log line in order: a step logged twice shows as a repeat."""
    return [(record['step'], 'train' if 'train_loss' in record else 'val') for record in log_records(out_dir)]


def assert_clean_error(result, *fragments):
    """A non-zero exit with one line on stderr that says what is wrong: no traceback."""
    assert result.returncode != 0, f"expected a failure:\n{result.stdout}"
    assert 'Traceback' not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error:'), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


@pytest.mark.parametrize('router', ['none', 'static', 'dynamic'])
def test_a_few_training_steps_lower_the_loss_and_sampling_works(data_dir, tmp_path, router):
    out = tmp_path / 'out'
    result = train(data_dir, out, f'--router={router}', '--max_iters=30', '--eval_interval=30')
    assert 'within the warmup' not in result.stdout  # 2 steps of warmup, then 28 of decay
    train_loss, val_loss = read_log(out)
    assert train_loss[30] < train_loss[1] - 1.0, train_loss
    assert val_loss[30] < val_loss[0] - 1.0, val_loss
    result = run('sample.py', f'--out_dir={out}', '--start=The list', '--num_samples=2',
                 '--max_new_tokens=8', '--device=cpu')
    samples = result.stdout.split('---------------\n')[:-1]
    assert len(samples) == 2 and all(s.startswith('The list') for s in samples), result.stdout
    assert f'router={router}' in result.stderr


@pytest.mark.parametrize('how', ['--fused=False', '--memory=hidden'])
def test_checkpoint_blocks_trains_to_the_same_losses(bytes_dir, tmp_path, how):
    # Activation checkpointing recomputes each block in the backward pass: the same numbers,
    # with lime.py's mix and with v1's (a memory of hidden states). kernels/memory.py's under
    # checkpointing: tests/test_kernels.py.
    common = ['--router=static', '--eval_interval=10', '--max_iters=10', how, BYTES]
    train(bytes_dir, tmp_path / 'plain', *common)
    train(bytes_dir, tmp_path / 'checkpointed', *common, '--checkpoint_blocks=True')
    plain, checkpointed = read_log(tmp_path / 'plain'), read_log(tmp_path / 'checkpointed')
    assert checkpointed[0] == pytest.approx(plain[0], rel=1e-5)  # the train losses
    assert checkpointed[1] == pytest.approx(plain[1], rel=1e-5)  # the val losses


def test_killed_run_resumes_exactly_like_an_uninterrupted_one(bytes_dir, tmp_path):
    common = ['--router=dynamic', '--eval_interval=10', '--lr_decay_iters=30', BYTES]
    train(bytes_dir, tmp_path / 'whole', *common, '--max_iters=30')
    # The same run, killed (SIGKILL: no chance to clean up) soon after its first checkpoint.
    killed = tmp_path / 'killed'
    cmd = [sys.executable, os.path.join(ROOT, 'train.py'), *TINY, f'--data_dir={bytes_dir}',
           f'--out_dir={killed}', *common, '--max_iters=1000']
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          cwd=ROOT) as proc:
        for line in proc.stdout:
            if line.startswith('saved checkpoint'):
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    stopped_at = saved(killed)['step']
    assert 10 <= stopped_at < 30
    train(bytes_dir, killed, *common, '--max_iters=30', '--init_from=resume')
    whole, resumed = read_log(tmp_path / 'whole'), read_log(killed)
    assert resumed[0] == whole[0], "train losses differ after resuming"
    assert resumed[1] == whole[1], "val losses differ after resuming"
    # The killed run's lines after its checkpoint are gone: the resumed run wrote those steps again.
    assert logged_steps(killed) == logged_steps(tmp_path / 'whole')


def test_resume_takes_the_model_data_and_schedule_from_the_checkpoint(bytes_dir, tmp_path):
    out = tmp_path / 'out'
    train(bytes_dir, out, BYTES, '--block_size=16', '--max_iters=2', '--eval_interval=2',
          '--rope_base=500000')
    # Only what differs is given: block_size 16 and the data_dir come from the checkpoint, not the
    # defaults (1024 and data/fineweb_edu), and the changed max_iters is said.
    result = run('train.py', f'--out_dir={out}', '--init_from=resume', '--device=cpu', '--max_iters=4')
    assert "note: resuming with max_iters=4, changed from the checkpoint's 2" in result.stdout
    # The schedule keeps its length: its cosine ended at step 2, so steps 3 and 4 train at min_lr
    # (recomputed for 4 steps, the rate would jump back up to the peak).
    assert [r['lr'] for r in log_records(out) if r['step'] > 2 and 'lr' in r] == [3e-4, 3e-4]
    assert '4 batch x 16 block' in result.stdout
    checkpoint = saved(out)
    assert checkpoint['step'] == 4 and checkpoint['model_args']['block_size'] == 16
    assert checkpoint['model_args']['rope_base'] == 500000.0  # every GPTConfig field is a train.py key
    assert checkpoint['config']['data_dir'] == str(bytes_dir)
    assert checkpoint['config']['lr_decay_iters'] == 2 and checkpoint['config']['max_iters'] == 4
    assert logged_steps(out) == [(0, 'val'), (1, 'train'), (2, 'train'), (2, 'val'), (3, 'train'),
                                 (4, 'train'), (4, 'val')]
    with open(out / 'log.txt') as f:  # the run's record that opens the log is the resumed run's
        header = json.loads(f.readline())
    assert header['config']['max_iters'] == 4 and header['config']['block_size'] == 16


def test_a_short_last_shard_is_skipped_and_the_run_trains_past_it(bytes_dir, tmp_path):
    # Shards of 300, 300 and 50 tokens; a micro-step of 4 x 32 takes 129: two from each long shard,
    # none from the last, so steps 5 and 6 come from the first shard again.
    data = tmp_path / 'data'
    data.mkdir()
    shutil.copy(glob.glob(os.path.join(bytes_dir, '*_val_*.bin'))[0], data / 'x_val_000000.bin')
    shutil.copy(os.path.join(bytes_dir, 'tokenizer.json'), data)
    tokens = prepare.read_shard(glob.glob(os.path.join(bytes_dir, '*_train_*.bin'))[0])
    for i, (start, end) in enumerate([(0, 300), (300, 600), (600, 650)], 1):
        prepare.write_shard(data / f'x_train_00000{i}.bin', tokens[start:end])
    out = tmp_path / 'out'
    # Trained with the data's path relative to tmp_path, resumed from the repo with its full path:
    # the same data, read on from where it stopped.
    result = train('data', out, BYTES, '--max_iters=4', '--eval_interval=4', cwd=tmp_path)
    assert "note: skipping data/x_train_000003.bin: its 50 tokens" in result.stdout
    (out / 'ckpt.pt.12345.tmp').write_bytes(b'half a checkpoint, its writer killed')
    result = train(data, out, BYTES, '--max_iters=6', '--eval_interval=2', '--init_from=resume')
    assert 'read from its start' not in result.stdout and not list(out.glob('*.tmp'))
    assert read_log(out)[0].keys() == set(range(1, 7))
    shards = [['x_train_000001.bin', 300], ['x_train_000002.bin', 300], ['x_train_000003.bin', 50]]
    assert saved(out)['data'] == {'shard': 0, 'pos': 256, 'data_dir': str(data), 'shards': shards}


def test_a_repeated_command_keeps_the_earlier_run_unless_told_to_overwrite(bytes_dir, tmp_path):
    out = tmp_path / 'out'
    result = train(bytes_dir, out, BYTES, '--max_iters=2', '--eval_interval=2')
    # Both steps warm up (TINY's warmup_iters=2): said once, not found later in the curves.
    assert result.stdout.count('note: max_iters=2 ends within the warmup (warmup_iters=2)') == 1
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    again = train(bytes_dir, out, BYTES, '--max_iters=2', '--eval_interval=2', check=False)
    assert_clean_error(again, f'{out} holds a run (ckpt.pt, log.txt)', '--init_from=resume',
                       '--overwrite=True')
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    train(bytes_dir, out, BYTES, '--max_iters=2', '--eval_interval=2', '--overwrite=True',
          '--seed=7')
    assert saved(out)['config']['seed'] == 7
    assert logged_steps(out) == [(0, 'val'), (1, 'train'), (2, 'train'), (2, 'val')]


@pytest.mark.parametrize('memory', ['kv', 'hidden'])  # paper v2's routers, and v1's
def test_two_process_ddp_matches_one_process_with_the_same_global_batch(bytes_dir, tmp_path, memory):
    common = [*TINY, f'--data_dir={bytes_dir}', '--router=static', '--max_iters=6', '--eval_interval=6',
              '--gradient_accumulation_steps=2', f'--memory={memory}', BYTES]
    run('train.py', *common, f'--out_dir={tmp_path / "one"}')
    torchrun = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    result = subprocess.run([*torchrun, os.path.join(ROOT, 'train.py'), *common,
                             f'--out_dir={tmp_path / "two"}'], capture_output=True, text=True, cwd=ROOT,
                            timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert result.returncode == 0, result.stdout + result.stderr
    (one_train, one_val), (two_train, two_val) = read_log(tmp_path / 'one'), read_log(tmp_path / 'two')
    assert one_train.keys() == two_train.keys() == set(range(1, 7))
    for step in one_train:
        assert one_train[step] == pytest.approx(two_train[step], rel=1e-5), f"step {step}"
    assert one_val[6] == pytest.approx(two_val[6], rel=1e-5)


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(bytes_dir, tmp_path):
    out = tmp_path / 'out'
    train(bytes_dir, out, BYTES, '--max_iters=4', '--eval_interval=4')
    # An absurd learning rate blows the weights up within a few steps; checkpoints every step. (The
    # saved schedule ended at step 4: --lr_decay_iters=0 stretches it to the new max_iters.)
    result = train(bytes_dir, out, '--init_from=resume', '--max_iters=50', '--eval_interval=1',
                   '--lr_decay_iters=0', '--learning_rate=1e30', '--router_lr=1e30',
                   '--grad_clip=0.0', check=False)
    assert_clean_error(result, 'is nan', 'last good checkpoint')
    kept = saved(out)
    assert 4 <= kept['step'] < 50
    assert all(torch.isfinite(v).all() for v in kept['model'].values()), "a poisoned checkpoint was saved"


def test_unknown_key_names_it_and_suggests_close_matches(tmp_path):
    assert_clean_error(run('train.py', '--lerning_rate=1e-3', check=False), "'lerning_rate'", 'learning_rate')
    assert_clean_error(run('sample.py', '--temprature=0.5', check=False), 'temperature')


def test_bad_values_and_config_files_give_one_clear_line(data_dir, tmp_path):
    assert_clean_error(run('train.py', '--batch_size=big', check=False), 'batch_size must be int')
    assert_clean_error(run('train.py', f'--data_dir={data_dir}', '--router=statc', check=False), 'statc')
    assert_clean_error(run('train.py', 'batch_size=3', check=False), 'config file not found')
    for script in ('train.py', 'sample.py', 'lab/bench.py'):  # all three share one device/dtype check
        assert_clean_error(run(script, '--device=cpu', '--dtype=bf16', check=False), "'bf16'")
    bad = tmp_path / 'bad.py'
    bad.write_text("n_layer = 4\nimport os\n")
    assert_clean_error(run('train.py', str(bad), check=False), 'bad.py:2', 'key = value')


def test_every_preset_parses_against_train_py_defaults(tmp_path, monkeypatch):
    # Each preset's keys and types are checked against train.py's own defaults; the run then stops
    # at the first thing that needs data, which proves the whole config was accepted. (In this
    # process, as `python train.py PRESET` would run it: one torch import for all the presets.)
    # Each router too, and v1's: a preset's static start (config/deep.py's router_init) and fast
    # mix (config/depth_text.py's fused) are left aside for the others, as the presets' own
    # commands (--router=none, --memory=hidden) need.
    configs = sorted(f for f in os.listdir(os.path.join(ROOT, 'config')) if f.endswith('.py'))
    assert len(configs) >= 5
    choices = [['--router=none'], ['--router=static'], ['--router=dynamic'],
               ['--router=static', '--memory=hidden'], ['--router=dynamic', '--memory=hidden']]
    for name in configs:
        for choice in choices:
            monkeypatch.setattr(sys, 'argv', ['train.py', os.path.join(ROOT, 'config', name),
                                              *choice, f'--data_dir={tmp_path / "none"}'])
            with pytest.raises(SystemExit, match=r'^error: data_dir not found: [^\n]*$'):
                runpy.run_path(os.path.join(ROOT, 'train.py'), run_name='__main__')


def test_missing_or_damaged_data_and_checkpoints_are_named(data_dir, tmp_path):
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert_clean_error(train(empty, tmp_path / 'o', check=False), 'no *_train_*.bin shards', str(empty))
    assert_clean_error(train(tmp_path / 'nowhere', tmp_path / 'o', check=False), 'data_dir not found')
    assert_clean_error(train(data_dir, tmp_path / 'o', '--init_from=resume', check=False),
                       'no checkpoint at', 'ckpt.pt')
    assert_clean_error(run('sample.py', f'--out_dir={tmp_path / "o"}', check=False), 'no checkpoint at')
    # A shard cut short, as by a crashed copy: named, with what is wrong.
    damaged = tmp_path / 'damaged'
    shutil.copytree(data_dir, damaged)
    shard = next(damaged.glob('*_train_*.bin'))
    with open(shard, 'r+b') as f:
        f.truncate(os.path.getsize(shard) - 1000)
    assert_clean_error(train(damaged, tmp_path / 'o', check=False), shard.name, 'truncated')
    (tmp_path / 'o').mkdir(exist_ok=True)
    (tmp_path / 'o' / 'ckpt.pt').write_bytes(b'not a checkpoint')
    assert_clean_error(train(data_dir, tmp_path / 'o', '--init_from=resume', check=False),
                       f"{tmp_path / 'o' / 'ckpt.pt'}")


# A stand-in for the wandb package: each call it gets, a JSON line in $WANDB_STUB_CALLS, with the
# rank of the process that made it. WANDB_STUB_FAIL makes init raise, as wandb does without a key.
WANDB_STUB = '''
import json, os
def record(*call):
    with open(os.environ['WANDB_STUB_CALLS'], 'a') as f:
        f.write(json.dumps([os.environ.get('RANK', '0'), *call]) + '\\n')
record('import')
class Run:
    def log(self, data, step=None):
        record('log', data, step)
def init(**kwargs):
    record('init', kwargs)
    if os.environ.get('WANDB_STUB_FAIL'):
        raise RuntimeError(os.environ['WANDB_STUB_FAIL'])
    return Run()
'''


def with_wandb_stub(tmp_path, module=WANDB_STUB, **env):
    """The environment for a command that imports the stub as wandb, and the file of its calls."""
    stub = tmp_path / 'stub'
    stub.mkdir(parents=True)
    (stub / 'wandb.py').write_text(module)
    calls = tmp_path / 'wandb_calls.jsonl'
    return {**os.environ, 'PYTHONPATH': f'{stub}{os.pathsep}{ROOT}', 'WANDB_STUB_CALLS': str(calls),
            'OMP_NUM_THREADS': '1', **env}, calls


def wandb_calls(calls):
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_wandb_log_sends_log_txts_records_from_rank_0_only(data_dir, tmp_path):
    env, calls = with_wandb_stub(tmp_path)
    out = tmp_path / 'out'
    torchrun = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    result = subprocess.run([*torchrun, os.path.join(ROOT, 'train.py'), *TINY, f'--data_dir={data_dir}',
                             f'--out_dir={out}', '--max_iters=4', '--eval_interval=2',
                             '--gradient_accumulation_steps=2', '--wandb_log=True'],
                            capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    (rank, what, init), *logs = wandb_calls(calls)[1:]
    assert {c[0] for c in wandb_calls(calls)} == {'0'}, "a process other than rank 0 logged"
    assert what == 'init' and init['project'] == 'lime' and init['name'] == f'static 2x32 {out}'
    assert init['dir'] == str(out) and init['config']['max_iters'] == 4 and init['config']['params'] > 0
    # Each record of log.txt, in order, with its step as the step.
    assert [{**data, 'step': step} for _, _, data, step in logs] == log_records(out)
    assert {'train_loss', 'lr', 'val_loss'} <= {key for _, _, data, _ in logs for key in data}


def test_wandb_is_not_imported_unless_asked_for_and_its_failures_are_one_line(data_dir, tmp_path):
    env, calls = with_wandb_stub(tmp_path)
    result = subprocess.run([*command('train.py'), *TINY, f'--data_dir={data_dir}',  # off by default
                             f'--out_dir={tmp_path / "out"}', '--max_iters=1'],
                            capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert result.returncode == 0 and wandb_calls(calls) == [], result.stderr
    # wandb.init refusing (no API key, say): its words, on one line, with the offline mode named.
    env['WANDB_STUB_FAIL'] = 'api_key not configured\n(no-tty)'
    result = subprocess.run([*command('train.py'), *TINY, f'--data_dir={data_dir}',
                             f'--out_dir={tmp_path / "refused"}', '--max_iters=1',
                             '--wandb_log=True', '--wandb_run_name=try 1', '--wandb_project=p'],
                            capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert_clean_error(result, 'wandb could not start a run: api_key not configured (no-tty)',
                       'WANDB_MODE=offline')
    assert [c[2]['name'] for c in wandb_calls(calls) if c[1] == 'init'] == ['try 1']
    assert [c[2]['project'] for c in wandb_calls(calls) if c[1] == 'init'] == ['p']
    # wandb not installed: one line, before out_dir is made.
    env, _ = with_wandb_stub(tmp_path / 'missing', module="raise ImportError('No module named wandb')")
    result = subprocess.run([*command('train.py'), *TINY, f'--data_dir={data_dir}',
                             f'--out_dir={tmp_path / "never"}', '--wandb_log=True'],
                            capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert_clean_error(result, 'wandb_log=True needs wandb: pip install wandb')
    assert not (tmp_path / 'never').exists()


def test_data_pydoc_is_prepared_by_train_py_when_missing_and_kept_after(data_dir, tmp_path):
    # A fresh clone: no data/pydoc. train.py makes the embedded data set there, as prepare.py
    # does, saying so, and trains.
    pydoc = tmp_path / 'data' / 'pydoc'
    result = train('data/pydoc', 'out', '--max_iters=1', '--eval_interval=1', cwd=tmp_path)
    assert "data/pydoc holds no data set: preparing Python's docs there" in result.stdout
    assert 'next:' not in result.stdout and (tmp_path / 'out' / 'ckpt.pt').exists()
    made = sorted(p.name for p in pydoc.iterdir())
    assert made == sorted(os.listdir(data_dir)) and os.listdir(tmp_path / 'data') == ['pydoc']
    for name in made:  # the same shards as prepare.py's
        assert (pydoc / name).read_bytes() == open(os.path.join(data_dir, name), 'rb').read(), name
    again = train('data/pydoc', 'out', '--max_iters=1', '--eval_interval=1', '--overwrite=True',
                  cwd=tmp_path)
    assert 'preparing' not in again.stdout
