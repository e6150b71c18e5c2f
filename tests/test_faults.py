"""
Faults a run must come through, injected at a known point: Ctrl-C and SIGTERM (a hook in the child
sends the signal to itself after a given optimizer step, or in the middle of a checkpoint's write),
a full disk or a file-size limit (a file whose writes raise ENOSPC, or RLIMIT_FSIZE in a child),
files that cannot be read, a data set read while it is written, and resumes that change settings.
Each ends in the right result or in one line, with every good file kept as it was and no
temporary file left behind.

    python -m pytest -q tests/test_faults.py
"""
import errno
import glob
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import bookkeeping
import configurator
import lime
import prepare
from test_train import ROOT, TINY, data_dir, read_log, run, train  # noqa: F401 (a fixture)

needs_gpt2 = pytest.mark.usefixtures('gpt2')  # skipped offline, saying why (conftest.py)

# Runs train.py as `python train.py ARGS` would (as the script of python or of torchrun), sending
# this process the signal SIGNAL after its optimizer's AT-th step (on rank RANK only, if given),
# and, with AGAIN, a second SIGINT once the checkpoint saved after that step has begun its write.
SIGNALLING = '''
import os, runpy, signal, sys
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
SIGNAL, AT, RANK, AGAIN = {signal}, {at}, {rank}, {again}
steps = 0

def after_step(optimizer, args, kwargs):
    global steps
    steps += 1
    if steps == AT and RANK in (None, int(os.environ.get('RANK', 0))):
        os.kill(os.getpid(), SIGNAL)

class Interrupted:
    """A file that gets a Ctrl-C as soon as it is written to."""
    def __init__(self, f):
        self.f = f
    def write(self, data):
        written = self.f.write(data)
        os.kill(os.getpid(), signal.SIGINT)
        return written
    def flush(self):
        self.f.flush()

save = torch.save
def save_interrupted(obj, f, **kwargs):
    return save(obj, Interrupted(f) if AGAIN and steps == AT else f, **kwargs)

register_optimizer_step_post_hook(after_step)
torch.save = save_interrupted
sys.argv[0] = {train_py!r}
runpy.run_path(sys.argv[0], run_name='__main__')
'''


def signalled(tmp_path, *args, signum, at, rank=None, again=False, torchrun=False):
    """train.py with args, signalled as SIGNALLING says."""
    hook = tmp_path / 'signalling.py'
    hook.write_text(SIGNALLING.format(signal=int(signum), at=at, rank=rank, again=again,
                                      train_py=os.path.join(ROOT, 'train.py')))
    launcher, env = [sys.executable], {**os.environ, 'PYTHONPATH': ROOT}
    if torchrun:  # one thread each: two processes share the machine
        launcher += ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
        env['OMP_NUM_THREADS'] = '1'
    return subprocess.run([*launcher, str(hook), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env=env)


def only_line(text):
    """The one line of text (stderr), which may hold no traceback."""
    assert 'Traceback' not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def no_temporaries(directory):
    return not glob.glob(os.path.join(directory, '*.tmp'))


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    """A run of 2 steps with its checkpoint at step 2: tests resume copies of it."""
    out = tmp_path_factory.mktemp('trained') / 'run'
    train(data_dir, out, '--max_iters=2', '--eval_interval=2', '--lr_decay_iters=10')
    return out


# -----------------------------------------------------------------------------
# Ctrl-C and SIGTERM


def test_sigterm_saves_the_step_in_flight_and_the_resume_it_names_trains_on_exactly(data_dir,
                                                                                    tmp_path):
    common = ['--max_iters=8', '--eval_interval=4']
    train(data_dir, tmp_path / 'whole', *common)
    out = tmp_path / 'stopped'
    result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}', *common,
                       signum=signal.SIGTERM, at=3)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    line = only_line(result.stderr)
    assert line.startswith(f"stopped by SIGTERM at step 3, its checkpoint saved to {out}/ckpt.pt: "
                           "resume with python "), line
    assert torch.load(out / 'ckpt.pt')['step'] == 3 and no_temporaries(out)
    command = shlex.split(line.split('resume with ')[1])
    assert command[1:] == [os.path.join(ROOT, 'train.py'), f'--out_dir={out}', '--init_from=resume']
    run('train.py', *command[2:], '--device=cpu')
    assert read_log(out) == read_log(tmp_path / 'whole')  # every loss, as if never stopped


def test_a_second_ctrl_c_or_a_full_disk_during_a_save_keeps_the_last_checkpoint(trained, tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(trained, out)
    before = (out / 'ckpt.pt').read_bytes()
    resume = [f'--out_dir={out}', '--init_from=resume', '--device=cpu', '--max_iters=6']
    # Ctrl-C after step 3, then again while step 3's checkpoint is being written
    result = signalled(tmp_path, *resume, signum=signal.SIGINT, at=1, again=True)
    assert result.returncode == 128 + signal.SIGINT
    assert only_line(result.stderr) == (f"stopped at once by a second SIGINT: the last checkpoint "
                                        f"({out}/ckpt.pt, step 2) is kept")
    assert (out / 'ckpt.pt').read_bytes() == before and no_temporaries(out)
    # A file-size limit the checkpoint does not fit in (a full disk is alike: torch.save calls
    # either its RuntimeError)
    limit = len(before) // 2
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'train.py'), *resume], capture_output=True, text=True,
        cwd=ROOT, timeout=300, env={**os.environ, 'PYTHONPATH': ROOT},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert result.returncode == 1
    assert only_line(result.stderr) == f"error: could not write {out}/ckpt.pt: File too large"
    assert (out / 'ckpt.pt').read_bytes() == before and no_temporaries(out)


def test_under_ddp_a_signal_to_one_process_stops_all_at_the_same_step(data_dir, tmp_path):
    out = tmp_path / 'run'
    result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                       '--gradient_accumulation_steps=2', '--max_iters=10', '--eval_interval=10',
                       signum=signal.SIGTERM, at=3, rank=1, torchrun=True)
    assert result.returncode != 0
    stopped = [line for line in result.stderr.splitlines() if line.startswith('stopped by')]
    assert stopped == [f"stopped by SIGTERM at step 3, its checkpoint saved to {out}/ckpt.pt: "
                       f"resume with torchrun --nproc_per_node=2 {ROOT}/train.py --out_dir={out} "
                       "--init_from=resume"], result.stderr
    assert torch.load(out / 'ckpt.pt')['step'] == 3
    assert max(read_log(out)[0]) == 3  # neither process trained a step past it


# The scripts stop on Ctrl-C in one line, leaving nothing half-written. Here prepare.py, once it has
# written its first shard, sends Ctrl-C to its whole process group (as a terminal does), its
# tokenizer processes included; `{run}` runs prepare.py's main, or train.py preparing data/pydoc.
INTERRUPTED_AFTER_A_SHARD = '''
import os, runpy, signal, sys
import prepare
write_shard = prepare.write_shard

def write_then_interrupt(path, tokens):
    write_shard(path, tokens)
    os.killpg(0, signal.SIGINT)

prepare.write_shard = write_then_interrupt
{run}
'''
PREPARING = {  # script: (how the hook runs it, its arguments, the line it ends with)
    'prepare.py': ('prepare.main()', ['--out_dir', 'data/pydoc', '--shard_size', '1000'],
                   "prepare.py: interrupted: data/pydoc holds none of the set it was writing"),
    'train.py': (f"sys.argv[0] = {os.path.join(ROOT, 'train.py')!r}\n"
                 "runpy.run_path(sys.argv[0], run_name='__main__')",
                 [*TINY, '--data_dir=data/pydoc', '--out_dir=out'],
                 "stopped by SIGINT before the first step: nothing to save"),
}


@needs_gpt2  # GPT-2's tokenizer: prepare.py's default, and sample.py's for this model
@pytest.mark.parametrize('script', PREPARING)
def test_ctrl_c_while_data_is_prepared_is_one_line_and_leaves_no_part_of_the_set(tmp_path, script):
    run_it, args, last_line = PREPARING[script]
    result = subprocess.run([sys.executable, '-c', INTERRUPTED_AFTER_A_SHARD.format(run=run_it),
                             *args], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            start_new_session=True, env={**os.environ, 'PYTHONPATH': ROOT})
    assert result.returncode == 128 + signal.SIGINT, result.stderr
    assert 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == last_line  # after tqdm's progress
    assert os.listdir(tmp_path / 'data' / 'pydoc') == ['.lock']
    assert not (tmp_path / 'out').exists()


@needs_gpt2  # GPT-2's tokenizer: prepare.py's default, and sample.py's for this model
def test_ctrl_c_in_sample_py_is_one_line(tmp_path):
    model = lime.GPT(lime.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16))
    lime.save_checkpoint(tmp_path / 'ckpt.pt', model, step=1, best_val_loss=1.0, config={})
    hook = ("import os, runpy, signal, sys, lime\n"
            "lime.GPT.generate = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGINT)\n"
            f"sys.argv[0] = {os.path.join(ROOT, 'sample.py')!r}\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    result = subprocess.run([sys.executable, '-c', hook, f'--out_dir={tmp_path}', '--device=cpu'],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, 'PYTHONPATH': ROOT})
    assert result.returncode == -signal.SIGINT  # Python's exit on Ctrl-C: 130 in a shell
    assert only_line(result.stderr.split('\n', 1)[1]) == "interrupted: sample.py stopped"


# -----------------------------------------------------------------------------
# writes that fail


class FullDisk:
    """A file open for writing that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, f, room):
        self.f = f
        self.room = room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def fill_the_disk(monkeypatch, room=100):
    """Every file write_atomically opens fails, as on a full disk, after room bytes."""
    monkeypatch.setattr(prepare, 'open', lambda path, mode: FullDisk(open(path, mode), room),
                        raising=False)


def test_a_write_that_fails_keeps_the_old_file_leaves_no_temporary_and_names_the_file(
        tmp_path, monkeypatch):
    model = lime.GPT(lime.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
    config = {'out_dir': str(tmp_path), 'device': 'cpu'}
    run_dir = bookkeeping.RunDir(config)
    batches = type('Batches', (), {'state': lambda self: {}})()
    optimizer = torch.optim.AdamW(model.parameters())
    writes = {  # each writer, and the file it writes
        'shard': (lambda: prepare.write_shard(tmp_path / 'x.bin', np.arange(1000)), 'x.bin'),
        'json': (lambda: prepare.write_json(tmp_path / 'task.json', {'a': [0] * 100}), 'task.json'),
        'checkpoint': (lambda: run_dir.save(model, optimizer, batches, 5, 1.0), 'ckpt.pt'),
    }
    for what, (write, name) in writes.items():
        write()
        before = (tmp_path / name).read_bytes()
        fill_the_disk(monkeypatch)
        with pytest.raises((OSError, SystemExit)) as failure:
            write()
        monkeypatch.undo()
        assert str(tmp_path / name) in str(failure.value), what  # the file, not its temporary
        assert 'No space left on device' in str(failure.value), what
        assert (tmp_path / name).read_bytes() == before, what
        assert no_temporaries(tmp_path), what
    assert str(failure.value) == (f"error: could not write {tmp_path}/ckpt.pt: No space left on "
                                  "device")


def test_a_log_line_that_cannot_be_written_stops_the_run_in_one_line(tmp_path):
    model = lime.GPT(lime.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
    config = {'out_dir': str(tmp_path), 'init_from': 'scratch', 'overwrite': False,
              'max_iters': 10, 'device': 'cpu'}
    run_dir = bookkeeping.RunDir(config)
    run_dir.claim(model, 0)
    run_dir.log_eval(0, 2.5, None)
    run_dir.log_file = FullDisk(run_dir.log_file, room=10)
    with pytest.raises(SystemExit, match=f"^error: could not write {tmp_path}/log.txt: No space"):
        run_dir.log_eval(1, 2.4, None)
    header, record = [json.loads(line) for line in open(tmp_path / 'log.txt')]
    assert record == {'step': 0, 'val_loss': 2.5}  # the records before it are kept


@needs_gpt2  # GPT-2's tokenizer: prepare.py's default, and sample.py's for this model
def test_a_file_size_limit_in_prepare_py_leaves_only_what_was_there(tmp_path):
    # Training shards of 500 tokens fit in 2 KB; the validation shard, written last, does not.
    docs = tmp_path / 'docs.jsonl'
    docs.write_text(''.join(json.dumps({'text': f'document {i} ' * 40}) + '\n' for i in range(60)))
    out = tmp_path / 'data'
    out.mkdir()
    (out / 'notes.txt').write_text('mine')
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'prepare.py'), '--input', str(docs), '--out_dir',
         str(out), '--shard_size', '500', '--val_every', '2', '--workers', '1'],
        capture_output=True, text=True, timeout=300, env={**os.environ, 'PYTHONPATH': ROOT},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048)))
    assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == \
        f"prepare.py: error: {out}/local_val_000000.bin: File too large"
    assert sorted(os.listdir(out)) == ['.lock', 'notes.txt']


# -----------------------------------------------------------------------------
# reads that fail


def test_a_file_that_cannot_be_read_is_named_in_one_line(tmp_path, monkeypatch):
    prepare.write_shard(tmp_path / 'x_val_000000.bin', np.arange(10))
    lime.save_checkpoint(tmp_path / 'ckpt.pt', lime.GPT(lime.GPTConfig(
        n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64)), step=1, best_val_loss=1.0)

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(np, 'fromfile', denied)
    with pytest.raises(ValueError, match=r"000000.bin: could not read it \(Permission denied"):
        prepare.read_shard(tmp_path / 'x_val_000000.bin')
    monkeypatch.setattr(lime.zipfile, 'ZipFile', denied)
    with pytest.raises(ValueError, match=f"^could not read checkpoint {tmp_path}/ckpt.pt: "
                                         "Permission denied$"):
        lime.load_checkpoint(tmp_path / 'ckpt.pt', 'cpu')
    # Anything else opened through or_fail: its OSError, named, in one line
    with pytest.raises(SystemExit, match=f"^error: {tmp_path}/elsewhere: Permission denied$"):
        configurator.or_fail(denied, tmp_path / 'elsewhere')


# -----------------------------------------------------------------------------
# a data set being written, or left unfinished

# prepare.py, held after its first shard until a line comes on its standard input
PREPARE_HELD = '''
import sys
import prepare
write_shard = prepare.write_shard

def write_then_wait(path, tokens):
    write_shard(path, tokens)
    print('held', flush=True)
    sys.stdin.readline()

prepare.write_shard = write_then_wait
prepare.main(sys.argv[1:])
'''


def held_prepare(out_dir):
    """A prepare.py writing out_dir, held after its first shard (write a line to let it go on)."""
    writer = subprocess.Popen([sys.executable, '-c', PREPARE_HELD, '--out_dir', str(out_dir),
                               '--workers', '1', '--shard_size', '20000'],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                              env={**os.environ, 'PYTHONPATH': ROOT})
    assert writer.stdout.readline() == 'held\n'
    return writer


@needs_gpt2  # GPT-2's tokenizer: prepare.py's default, and sample.py's for this model
def test_a_data_set_being_written_is_refused_to_a_second_writer_and_to_readers(tmp_path):
    pydoc = tmp_path / 'data' / 'pydoc'
    writer = held_prepare(pydoc)
    try:
        with pytest.raises(SystemExit, match=f"error: another process is writing {pydoc} now"):
            prepare.main(['--out_dir', str(pydoc), '--workers', '1'])
        result = train(pydoc, tmp_path / 'out', check=False)
        assert only_line(result.stderr) == (f"error: {pydoc} is being written now (prepare.py, "
                                            "or train.py preparing it): wait until it has finished")
        assert not (tmp_path / 'out').exists()
        # train.py's own preparation of data/pydoc waits for the writer instead, and reads its set
        waiting = subprocess.Popen([sys.executable, '-c', 'import prepare; '
                                    'prepare.prepare_if_default("data/pydoc")'],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=tmp_path, env={**os.environ, 'PYTHONPATH': ROOT})
        assert 'preparing' in waiting.stdout.readline()
        assert waiting.stdout.readline() == "waiting for the process writing data/pydoc to finish\n"
        writer.communicate('go on\n', timeout=300)
        assert writer.returncode == 0
        assert waiting.communicate(timeout=300)[0].endswith("shards: kept (delete them to prepare "
                                                            "anew)\n")
    finally:
        writer.kill()
    marker = json.loads((pydoc / 'dataset.json').read_text())
    assert marker['finished'] and marker['shards'] == len(glob.glob(f'{pydoc}/*.bin'))


@needs_gpt2  # GPT-2's tokenizer: prepare.py's default, and sample.py's for this model
def test_a_data_set_whose_writer_died_is_refused_until_prepared_again(tmp_path):
    out = tmp_path / 'data'
    writer = held_prepare(out)
    writer.kill()
    writer.wait()
    with pytest.raises(ValueError) as refused:
        prepare.shard_paths(str(out), 'train')
    assert str(refused.value) == (f"{out} holds an unfinished data set (its writer stopped before "
                                  "the end): prepare it again")
    prepare.main(['--out_dir', str(out), '--workers', '1', '--shard_size', '20000'])
    shards = prepare.shard_paths(str(out), 'train')
    assert [len(prepare.read_shard(path)) for path in shards[:-1]] == [20000] * (len(shards) - 1)
    assert json.loads((out / 'dataset.json').read_text())['shards'] == len(shards) + 1


def test_shards_without_a_dataset_json_are_read_as_they_are(tmp_path):
    # modded-nanogpt's shards, or an older prepare.py's set: nothing says they are unfinished
    for split, index in [('val', 0), ('train', 1)]:
        prepare.write_shard(prepare.shard_path(str(tmp_path), 'fineweb', split, index), [1, 2, 3])
    assert prepare.shard_paths(str(tmp_path), 'train') == [f'{tmp_path}/fineweb_train_000001.bin']


# -----------------------------------------------------------------------------
# resuming with changed settings


def test_a_resume_applies_changed_optimizer_settings(trained, tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(trained, out)
    result = run('train.py', f'--out_dir={out}', '--init_from=resume', '--device=cpu',
                 '--max_iters=3', '--weight_decay=0.5', '--beta2=0.5')
    assert "note: resuming with weight_decay=0.5, changed from the checkpoint's 0.1" in \
        result.stdout
    groups = torch.load(out / 'ckpt.pt')['optimizer']['param_groups']
    assert {group['betas'] for group in groups} == {(0.9, 0.5)}
    assert {group['weight_decay'] for group in groups} == {0.0, 0.5}  # 0: gains, biases, routers


def test_a_resume_with_nothing_to_train_changes_nothing_on_disk(trained):
    before = {path.name: path.read_bytes() for path in trained.iterdir()}
    result = run('train.py', f'--out_dir={trained}', '--init_from=resume', '--device=cpu',
                 '--max_iters=2', '--learning_rate=1e-2')
    assert result.stdout == ("the checkpoint is at step 2, max_iters is 2: nothing to train (a "
                             "larger --max_iters trains it further)\n")
    assert {path.name: path.read_bytes() for path in trained.iterdir()} == before
