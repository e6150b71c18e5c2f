"""
Tests for who writes where (safe_files.py, and bookkeeping.py's hold on out_dir): a run owns its
out_dir from before it reads its checkpoint to its end, so that two runs never both train there,
and a save never replaces a checkpoint of a later step; no file is written through a symbolic link
that the script did not make, and lab.handout writes no copy into the repo through one. Runs of
train.py are real processes on a tiny model, held at known points by what they print, never by a
time budget.

    python -m pytest -q tests/test_safe_files.py
"""
import os
import signal
import subprocess
import sys

import pytest
import torch

import bookkeeping
import lime
import prepare
import safe_files
from test_train import ROOT, TINY, command, read_log, saved, train
from test_train import data_dir  # noqa: F401 (a fixture)

NO_DATA = type('Batches', (), {'state': lambda self: {}})()  # for a checkpoint: no position


@pytest.fixture
def trained(data_dir, tmp_path):  # noqa: F811 (the fixture imported above)
    """A run of 2 steps with its checkpoint at step 2, which the test resumes."""
    out = tmp_path / 'run'
    train(data_dir, out, '--max_iters=2', '--eval_interval=2', '--lr_decay_iters=10')
    return out


def resume(out, max_iters, hook=None, **popen):
    """train.py resuming out to max_iters, started and left running (hook: a script that runs
    train.py after what it sets up)."""
    args = [f'--out_dir={out}', '--init_from=resume', '--device=cpu', f'--max_iters={max_iters}']
    launcher = [sys.executable, '-c', hook] if hook else command('train.py')
    return subprocess.Popen([*launcher, *args], text=True, cwd=ROOT,
                            env={**os.environ, 'PYTHONPATH': ROOT}, **popen)


def refusal(out, holder):
    return (f"error: another run is training into {out} (process {holder}): wait for it, or "
            "choose another --out_dir")


# -----------------------------------------------------------------------------
# one owner per out_dir


def test_a_resume_slowed_after_reading_its_checkpoint_still_keeps_out_dir_from_another(trained):
    out = trained
    # B reads the checkpoint (step 2), then stops (SIGSTOP: a slow start on a busy node)
    slow = resume(out, 4, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line in slow.stdout:  # train.py's first line after the checkpoint's read
            if line.startswith('tokens per step'):
                break
        slow.send_signal(signal.SIGSTOP)
        # A, a second resume of the same out_dir, meanwhile: refused, naming B
        second = resume(out, 6, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, stderr = second.communicate(timeout=300)
        assert second.returncode == 1 and stderr.strip() == refusal(out, slow.pid), stderr
        slow.send_signal(signal.SIGCONT)
        _, stderr = slow.communicate(timeout=300)
        assert slow.returncode == 0, stderr
    finally:
        slow.kill()
    assert saved(out)['step'] == 4 and sorted(read_log(out)[0]) == [1, 2, 3, 4]


# Runs train.py, holding it once it has read its checkpoint until a line comes on its stdin
HELD_AFTER_READING = f'''
import runpy, sys
import lime
load_checkpoint = lime.load_checkpoint

def load_then_wait(*args, **kwargs):
    loaded = load_checkpoint(*args, **kwargs)
    print('read', flush=True)
    sys.stdin.readline()
    return loaded

lime.load_checkpoint = load_then_wait
sys.argv[0] = {os.path.join(ROOT, 'train.py')!r}
runpy.run_path(sys.argv[0], run_name='__main__')
'''


def test_of_two_resumes_started_together_one_trains_and_the_other_is_refused_naming_it(trained):
    out = trained
    # Both start at once; each that reads the checkpoint is held there. Then the first is let go
    # to its end, and after it the second: without one owner, the second trains from the step it
    # read and writes it over the first's.
    runs = {max_iters: resume(out, max_iters, HELD_AFTER_READING, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for max_iters in (6, 4)}
    try:
        read = {n: run.stdout.readline() == 'read\n' for n, run in runs.items()}  # '' if refused
        ended = {}
        for n, run in runs.items():
            ended[n] = run.communicate('go on\n' if read[n] else None, timeout=300)[1]
    finally:
        for run in runs.values():
            run.kill()
    assert sorted(read.values()) == [False, True], ended
    winner = next(n for n in runs if read[n])
    loser = next(n for n in runs if not read[n])
    assert runs[winner].returncode == 0, ended[winner]
    assert runs[loser].returncode == 1 and ended[loser].strip() == refusal(out, runs[winner].pid)
    assert saved(out)['step'] == winner
    assert sorted(read_log(out)[0]) == list(range(1, winner + 1))


def test_a_save_never_replaces_a_checkpoint_of_a_later_step(tmp_path):
    model = lime.GPT(lime.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
    optimizer = torch.optim.AdamW(model.parameters())
    config = {'out_dir': str(tmp_path), 'init_from': 'scratch', 'overwrite': False,
              'max_iters': 10, 'eval_interval': 2, 'device': 'cpu', 'always_save_checkpoint': True}
    run_dir = bookkeeping.RunDir(config)
    run_dir.claim(model)
    run_dir.log_eval(0, 3.0, None)
    run_dir.save(model, optimizer, NO_DATA, 2)
    # Another run, which no lock kept out (a filesystem without locks), saves step 5 meanwhile
    state = saved(tmp_path)
    state['step'] = 5
    safe_files.write_atomically(tmp_path / 'ckpt.pt', lambda f: torch.save(state, f))
    run_dir.log_eval(4, 2.5, None)
    with pytest.raises(SystemExit) as stopped:
        run_dir.save(model, optimizer, NO_DATA, 4)
    assert str(stopped.value) == (f"error: {tmp_path}/ckpt.pt holds step 5, past this run's 4: "
                                  "another run saved it there since this one read it, and it is "
                                  "kept (this run stops unsaved)")
    assert saved(tmp_path)['step'] == 5
    run_dir.log_file.close()
    run_dir.lock.close()


# -----------------------------------------------------------------------------
# no write through a link the script did not make

# Runs train.py, planting a link after optimizer step AT where the next checkpoint's temporary
# file would be if its name were known beforehand (ckpt.pt.<pid>.tmp), leading to VICTIM
PLANTING = '''
import os, runpy, sys
from torch.optim.optimizer import register_optimizer_step_post_hook
OUT, AT, VICTIM = {out!r}, {at}, {victim!r}
steps = 0

def plant(optimizer, args, kwargs):
    global steps
    steps += 1
    if steps == AT:
        os.symlink(VICTIM, os.path.join(OUT, f'ckpt.pt.{{os.getpid()}}.tmp'))

register_optimizer_step_post_hook(plant)
sys.argv[0] = {train_py!r}
runpy.run_path(sys.argv[0], run_name='__main__')
'''


def test_a_link_planted_where_a_checkpoint_is_written_is_not_written_through(data_dir, tmp_path):
    out, victim = tmp_path / 'run', tmp_path / 'victim.txt'
    victim.write_text('not a checkpoint\n')
    hook = PLANTING.format(out=str(out), at=1, victim=str(victim),
                           train_py=os.path.join(ROOT, 'train.py'))
    result = subprocess.run([sys.executable, '-c', hook, *TINY, f'--data_dir={data_dir}',
                             f'--out_dir={out}', '--max_iters=2', '--eval_interval=2'],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, 'PYTHONPATH': ROOT})
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == 'not a checkpoint\n'
    assert not (out / 'ckpt.pt').is_symlink() and saved(out)['step'] == 2


def test_every_file_written_whole_takes_a_new_name_and_writes_through_no_link(tmp_path):
    # A link at each name a second party could know beforehand: path with this process's id
    victim = tmp_path / 'victim.txt'
    victim.write_text('kept\n')
    writes = {'x.json': lambda path: safe_files.write_json(path, {'a': 1}),
              'x.bin': lambda path: prepare.write_shard(path, [1, 2, 3])}
    for name, write in writes.items():
        path = tmp_path / name
        os.symlink(victim, f'{path}.{os.getpid()}.tmp')
        write(path)
        assert victim.read_text() == 'kept\n', name
        assert path.is_file() and not path.is_symlink(), name
    assert safe_files.data_record(tmp_path, 'x.json') == {'a': 1}
    assert list(prepare.read_shard(tmp_path / 'x.bin')) == [1, 2, 3]


def test_a_lock_file_that_is_a_link_is_refused_in_one_line(data_dir, tmp_path):
    made = tmp_path / 'elsewhere' / 'made'
    (tmp_path / 'elsewhere').mkdir()
    for directory in ('run', 'data'):
        (tmp_path / directory).mkdir()
        os.symlink(made, tmp_path / directory / '.lock')
    result = train(data_dir, tmp_path / 'run', '--max_iters=2', check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: {tmp_path}/run/.lock is a symbolic link, which a "
                                     "lock file never is: not followed (remove it)")
    with pytest.raises(SystemExit) as refused:
        prepare.main(['--out_dir', str(tmp_path / 'data'), '--tokenizer', 'bytes'])
    assert str(refused.value) == (f"prepare.py: error: {tmp_path}/data/.lock is a symbolic link, "
                                  "which a lock file never is: not followed (remove it)")
    assert not made.exists()
