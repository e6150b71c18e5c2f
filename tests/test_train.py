"""
Tests for train.py and bookkeeping.py, run as a user runs them: as commands, on a tiny model and
the Python docs at byte level, on the CPU. A test for each protection of a run: files written whole,
weights that are not finite never saved, stop signals that save (a hook in the child sends itself
the signal after a given step), exact resumes, no run replaced unasked, one run per out_dir.

    python -m pytest -q tests/test_train.py
"""
import errno
import json
import os
import re
import resource
import runpy
import shlex
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import bookkeeping
from conftest import BYTES, ROOT, TINY, command, run

TORCHRUN = ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']

# train.py as `python train.py ARGS` runs it, with a hook after each optimizer step of this process:
# EVENTS[n] lists what follows its n-th step: 'nan' in one weight, 'noise' in every weight (finite,
# a worse model), a signal by name, sent to itself (on rank RANK only, if given), or 'ctrl-c in
# save' (a SIGINT as the checkpoint's write begins). SIGHUP as a shell leaves it (nohup ignores it).
HOOK = '''
import os, runpy, signal, sys
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
EVENTS, RANK, NOHUP = {events}, {rank}, {nohup}
signal.signal(signal.SIGHUP, signal.SIG_IGN if NOHUP else signal.SIG_DFL)
steps = 0

def after_step(optimizer, args, kwargs):
    global steps
    steps += 1
    weights = [w for group in optimizer.param_groups for w in group['params']]
    for event in EVENTS.get(steps, []):
        with torch.no_grad():
            if event == 'nan':
                weights[0].fill_(float('nan'))
            if event == 'noise':
                for w in weights:
                    w.add_(torch.randn_like(w))
        if event.startswith('SIG') and RANK in (None, int(os.environ.get('RANK', 0))):
            os.kill(os.getpid(), getattr(signal, event))

save = torch.save
def save_interrupted(obj, f, **kwargs):
    if 'ctrl-c in save' in EVENTS.get(steps, []):  # its temporary file made, not yet written
        os.kill(os.getpid(), signal.SIGINT)
    return save(obj, f, **kwargs)

torch.save = save_interrupted
register_optimizer_step_post_hook(after_step)
sys.argv[0] = {train_py!r}
runpy.run_path(sys.argv[0], run_name='__main__')
'''


def hooked(tmp_path, *args, events=None, rank=None, nohup=False, torchrun=False, env=None):
    """train.py with args under HOOK, one thread a process; its output captured."""
    hook = tmp_path / 'hook.py'
    hook.write_text(HOOK.format(events=events or {}, rank=rank, nohup=nohup,
                                train_py=os.path.join(ROOT, 'train.py')))
    launcher = [sys.executable, *TORCHRUN] if torchrun else [sys.executable]
    env = {**os.environ, 'PYTHONPATH': ROOT, **(env or {})}
    return subprocess.run([*launcher, str(hook), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env=env)


def tiny(data_dir, out_dir, *args):
    """train.py's arguments for the tiny byte-level model: conftest's trained run with args."""
    return [*TINY, BYTES, f'--data_dir={data_dir}', f'--out_dir={out_dir}', '--max_iters=8',
            '--eval_interval=4', *args]


def resume(out, *args):
    return [f'--out_dir={out}', '--init_from=resume', '--device=cpu', *args]


def saved(out_dir):
    """The checkpoint in out_dir: tensors and plain values only, as lime.load_checkpoint reads."""
    return torch.load(os.path.join(out_dir, 'ckpt.pt'), weights_only=True)


def records(out_dir):
    """The records of out_dir/log.txt after the run's own, which opens it."""
    with open(os.path.join(out_dir, 'log.txt')) as f:
        return [json.loads(line) for line in f][1:]


def losses(out_dir):
    """(step, loss) of each record of log.txt, train and val, in order: a repeated step shows."""
    return [(r['step'], r.get('train_loss', r.get('val_loss'))) for r in records(out_dir)]


def val_losses(out_dir):
    return {r['step']: r['val_loss'] for r in records(out_dir) if 'val_loss' in r}


def only_line(result):
    """The one line of stderr, a failure's: no traceback."""
    assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def files(out_dir):
    return {name: open(os.path.join(out_dir, name), 'rb').read() for name in os.listdir(out_dir)}


@pytest.mark.parametrize('router', ['none', 'static', 'dynamic'])
def test_a_few_steps_lower_the_loss_with_every_router(trained, router):
    val_loss = val_losses(trained(router))  # nats per byte: 5.5 untrained
    assert val_loss[8] < val_loss[4] < val_loss[0] - 0.3, val_loss


@pytest.mark.parametrize('memory', ['kv', 'hidden'])  # paper v2's mix, and v1's
def test_checkpoint_blocks_trains_to_the_same_losses(trained, bytes_dir, tmp_path, memory):
    run('train.py', *tiny(bytes_dir, tmp_path, f'--memory={memory}', '--checkpoint_blocks=True'))
    plain = losses(trained('static', memory))
    assert [step for step, _ in losses(tmp_path)] == [step for step, _ in plain]
    assert [loss for _, loss in losses(tmp_path)] == pytest.approx([x for _, x in plain], rel=1e-5)


@pytest.mark.parametrize('name, times', [('SIGINT', 1), ('SIGTERM', 2), ('SIGUSR1', 1),
                                         ('SIGHUP', 1)])
def test_a_stop_signal_saves_the_step_in_flight(bytes_dir, tmp_path, name, times):
    # SIGTERM twice (a job script forwarding it, and the scheduler signalling the group) is one
    # request; SIGUSR1 is SLURM's warning (sbatch --signal=USR1@90); SIGHUP a lost terminal.
    out = tmp_path / 'run'
    result = hooked(tmp_path, *tiny(bytes_dir, out), events={3: [name] * times})
    assert result.returncode == 128 + getattr(signal, name)
    assert only_line(result) == (
        f"stopped by {name} at step 3, its checkpoint saved to "
        f"{out}/ckpt.pt: resume with python {ROOT}/train.py --out_dir={out} --init_from=resume")
    assert saved(out)['step'] == 3 and losses(out)[-1][0] == 3


def test_a_run_started_under_nohup_goes_on_through_sighup(bytes_dir, tmp_path):
    result = hooked(tmp_path, *tiny(bytes_dir, tmp_path / 'run'), events={2: ['SIGHUP']},
                    nohup=True)
    assert result.returncode == 0 and result.stderr == '', result.stderr
    assert saved(tmp_path / 'run')['step'] == 8


def test_a_resume_after_a_stop_or_a_kill_trains_on_exactly(trained, bytes_dir, tmp_path):
    out = tmp_path / 'run'
    stopped = hooked(tmp_path, *tiny(bytes_dir, out), events={3: ['SIGTERM']})
    named = shlex.split(stopped.stderr.split('resume with ')[1])
    assert named[1:] == [os.path.join(ROOT, 'train.py'), f'--out_dir={out}', '--init_from=resume']
    # Resumed as named, then killed outright (SIGKILL) at step 6, after its checkpoint at 4 and
    # the log line of step 5: the next resume cuts log.txt back to step 4, and trains from there.
    killed = hooked(tmp_path, *named[2:], '--device=cpu', events={3: ['SIGKILL']})
    assert killed.returncode == -signal.SIGKILL and losses(out)[-1][0] == 5
    (out / 'ckpt.pt.12345.tmp').write_bytes(b'half a checkpoint, its writer killed')
    result = run('train.py', *resume(out))
    assert losses(out) == losses(trained())  # every loss, as if never stopped
    assert list(out.glob('*.tmp')) == []
    assert result.stdout.endswith(f"next: python sample.py --out_dir={out}\n")


def test_a_resume_takes_the_run_from_its_checkpoint_and_applies_what_a_machine_may_change(
        trained, bytes_dir, tmp_path):
    out = shutil.copytree(trained(), tmp_path / 'run')
    # Only what differs is given: block_size 32 and the data_dir come from the checkpoint, not
    # the defaults (1024 and data/fineweb_edu); the optimizer's settings are today's
    result = run('train.py', *resume(out, '--max_iters=10', '--weight_decay=0.5', '--beta2=0.5'))
    assert "note: resuming with max_iters=10, changed from the checkpoint's 8" in result.stdout
    assert "note: resuming with weight_decay=0.5, changed from the checkpoint's 0.1" in \
        result.stdout
    assert '4 batch x 32 block' in result.stdout
    # The schedule keeps its length: its cosine ended at step 8, so 9 and 10 train at min_lr.
    assert [r['lr'] for r in records(out) if r['step'] > 8 and 'lr' in r] == [3e-4, 3e-4]
    checkpoint = saved(out)
    assert checkpoint['step'] == 10 and checkpoint['config']['data_dir'] == bytes_dir
    assert checkpoint['config']['lr_decay_iters'] == 8 and checkpoint['config']['max_iters'] == 10
    groups = checkpoint['optimizer']['param_groups']
    assert {group['betas'] for group in groups} == {(0.9, 0.5)}
    assert {group['weight_decay'] for group in groups} == {0.0, 0.5}  # 0: gains, routers
    with open(out / 'log.txt') as f:  # the run's record that opens the log is the resumed one's
        assert json.loads(f.readline())['config']['max_iters'] == 10


def test_a_resume_refuses_another_runs_settings_and_with_nothing_to_train_changes_nothing(
        trained):
    out = trained()
    before = files(out)
    for change in ('--n_layer=3', '--batch_size=2', '--eval_iters=1', '--seed=2'):
        result = run('train.py', *resume(out, '--max_iters=10', change), check=False)
        key, value = change[2:].split('=')
        assert re.fullmatch(rf"error: --{key}={value} would make another run than the "
                            rf"checkpoint's \({key}=\d+\): train it into another --out_dir",
                            only_line(result))
    result = run('train.py', *resume(out, '--max_iters=8', '--learning_rate=1e-2'))
    assert result.stdout == ("the checkpoint is at step 8, max_iters is 8: nothing to train (a "
                             "larger --max_iters trains it further)\n")
    assert files(out) == before


def test_weights_or_a_loss_that_are_not_finite_are_never_saved(trained, tmp_path):
    out = shutil.copytree(trained(), tmp_path / 'run')
    before = (out / 'ckpt.pt').read_bytes()
    kept = (f"The last good checkpoint ({out}/ckpt.pt, step 8) is kept: resume from it with "
            "--init_from=resume and a lower learning_rate")
    # A weight goes nan after step 9, where no log line sees it, and SIGTERM comes then
    result = hooked(tmp_path, *resume(out, '--max_iters=12'), events={1: ['nan', 'SIGTERM']})
    assert result.returncode == 128 + signal.SIGTERM
    assert only_line(result) == (f"stopped by SIGTERM at step 9, not saved: its weights are not "
                                 f"finite. {kept}")
    # Without a signal, step 10's loss is nan: the run stops at its log line
    result = hooked(tmp_path, *resume(out, '--max_iters=12'), events={1: ['nan']})
    assert only_line(result) == f"error: train_loss is nan at step 10: stopping. {kept}"
    assert (out / 'ckpt.pt').read_bytes() == before


def test_with_always_save_checkpoint_false_a_stop_keeps_the_best_checkpoint(bytes_dir, tmp_path):
    out = tmp_path / 'run'
    # Noise in every weight after step 5 makes step 6's evaluation worse; SIGTERM after step 7
    result = hooked(tmp_path, *tiny(bytes_dir, out, '--max_iters=10', '--eval_interval=2',
                                    '--always_save_checkpoint=False'),
                    events={5: ['noise'], 7: ['SIGTERM']})
    val = val_losses(out)
    best = 4 if val[4] < val[2] else 2  # each evaluation better than the checkpoint's replaced it
    assert val[6] > val[best] and val[2] < val[0]  # the fault took, and training learned first
    assert only_line(result) == (
        f"stopped by SIGTERM at step 7, not saved: with always_save_checkpoint=False only a better "
        f"evaluation replaces the checkpoint ({out}/ckpt.pt, step {best}, val loss "
        f"{val[best]:.4f}): resume from it with python {ROOT}/train.py --out_dir={out} "
        "--init_from=resume")
    assert (saved(out)['step'], saved(out)['val_loss']) == (best, val[best])


def test_a_second_ctrl_c_or_a_full_disk_during_a_save_keeps_the_last_checkpoint(trained,
                                                                                 tmp_path):
    out = shutil.copytree(trained(), tmp_path / 'run')
    before = (out / 'ckpt.pt').read_bytes()
    # Ctrl-C after step 9, then again while step 9's checkpoint is being written
    result = hooked(tmp_path, *resume(out, '--max_iters=12'),
                    events={1: ['SIGINT', 'ctrl-c in save']})
    assert result.returncode == 128 + signal.SIGINT
    assert only_line(result) == (f"stopped at once by a second SIGINT: the last checkpoint "
                                 f"({out}/ckpt.pt, step 8) is kept")
    assert (out / 'ckpt.pt').read_bytes() == before and list(out.glob('*.tmp')) == []
    # A file-size limit the checkpoint does not fit in (a full disk is alike)
    limit = len(before) // 2
    result = subprocess.run(
        [*command('train.py'), *resume(out, '--max_iters=12')], capture_output=True, text=True,
        cwd=ROOT, timeout=600, env={**os.environ, 'PYTHONPATH': ROOT},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert only_line(result) == f"error: could not write {out}/ckpt.pt: File too large"
    assert (out / 'ckpt.pt').read_bytes() == before and list(out.glob('*.tmp')) == []


def test_a_file_is_written_whole_or_not_at_all_and_as_open_would_make_it(trained, tmp_path):
    path = tmp_path / 'result.json'
    bookkeeping.write_json(path, {'bpb': 1.5})

    def full_disk(f):
        f.write(b'{"bpb": 1.')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(OSError, match='No space left on device'):
        bookkeeping.write_whole(path, full_disk)
    with pytest.raises(ValueError):  # JSON has no nan: a file holding one would not be JSON
        bookkeeping.write_json(path, {'bpb': float('nan')})
    assert json.loads(path.read_text()) == {'bpb': 1.5} and os.listdir(tmp_path) == [path.name]
    # The user's umask decides who may read them (a class's teacher, say), not mkstemp's 0600
    umask = os.umask(0)
    os.umask(umask)
    for path in (path, f'{trained()}/ckpt.pt', f'{trained()}/log.txt'):
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask, path


def test_a_run_is_replaced_only_when_asked_and_once_the_new_one_has_saved(trained, bytes_dir,
                                                                           tmp_path):
    out = shutil.copytree(trained(), tmp_path / 'run')
    before = files(out)
    again = run('train.py', *tiny(bytes_dir, out), check=False)
    assert only_line(again) == (f"error: {out} holds a run: continue it with --init_from=resume, "
                                "train into another --out_dir, or replace it with --overwrite=True")
    # The new run diverges at step 2, or is killed outright (SIGKILL), before its first
    # checkpoint: the old run is as it was
    new_run = tiny(bytes_dir, out, '--overwrite=True', '--seed=7')
    assert only_line(hooked(tmp_path, *new_run, events={1: ['nan']})) == (
        "error: train_loss is nan at step 2: stopping. No checkpoint was saved: start again "
        "with a lower learning_rate")
    assert hooked(tmp_path, *new_run, events={2: ['SIGKILL']}).returncode == -9
    assert files(out) == before
    # Once the new run has saved, the old one is gone
    run('train.py', *new_run)
    assert saved(out)['config']['seed'] == 7 and losses(out) != losses(trained())
    assert [step for step, _ in losses(out)] == [step for step, _ in losses(trained())]


def test_a_second_run_into_a_busy_out_dir_is_refused(bytes_dir, tmp_path):
    out = tmp_path / 'out'
    args = tiny(bytes_dir, out, '--max_iters=100000', '--overwrite=True')
    with subprocess.Popen(command('train.py') + args, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                          stderr=subprocess.DEVNULL) as first:
        try:
            for line in first.stdout:
                if line.startswith('step 0/'):  # out_dir is held before the first evaluation
                    break
            second = run('train.py', *args, check=False)
            assert only_line(second) == (f"error: another run is training into {out}: wait for "
                                         "it, or choose another --out_dir")
            assert first.poll() is None, "the first run must go on"
        finally:
            first.kill()


def test_a_fresh_clones_first_run_prepares_its_data_and_replaces_a_log_without_a_checkpoint(
        bytes_dir, tmp_path):
    # No data/pydoc_bytes: train.py makes it there, as prepare.py does, saying so. A run stopped
    # before its first checkpoint left out/log.txt alone: nothing to resume, so it is replaced.
    (tmp_path / 'out').mkdir()
    (tmp_path / 'out' / 'log.txt').write_text('{"config": {}}\n{"step": 1}\n')
    first = run('train.py', *tiny('data/pydoc_bytes', 'out', '--max_iters=1'), cwd=tmp_path)
    assert "data/pydoc_bytes holds no data set: preparing Python's docs there" in first.stdout
    assert ("note: out/log.txt is of a run stopped before its first checkpoint, with nothing to "
            "resume: this run replaces it") in first.stdout
    assert [step for step, _ in losses(tmp_path / 'out')] == [0, 1, 1]
    made = tmp_path / 'data' / 'pydoc_bytes'
    assert sorted(os.listdir(made)) == sorted(os.listdir(bytes_dir))
    for name in os.listdir(made):  # the same shards as prepare.py's
        assert (made / name).read_bytes() == open(os.path.join(bytes_dir, name), 'rb').read()
    again = run('train.py', *tiny('data/pydoc_bytes', 'out', '--max_iters=1', '--overwrite=True'),
                cwd=tmp_path)
    assert 'preparing' not in again.stdout


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


def wandb_stub(tmp_path, module=WANDB_STUB):
    """The environment of a command that imports the stub as wandb, and the file of its calls."""
    (tmp_path / 'stub').mkdir(parents=True)
    (tmp_path / 'stub' / 'wandb.py').write_text(module)
    calls = tmp_path / 'wandb_calls.jsonl'
    return {'PYTHONPATH': f"{tmp_path / 'stub'}{os.pathsep}{ROOT}", 'WANDB_STUB_CALLS': str(calls)}


def wandb_calls(tmp_path):
    calls = tmp_path / 'wandb_calls.jsonl'
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


@pytest.mark.parametrize('memory', ['kv', 'hidden'])  # paper v2's routers, and v1's
def test_two_processes_train_as_one_with_the_same_global_batch(bytes_dir, tmp_path, memory):
    # v2: logging to W&B from rank 0 only. v1: SIGTERM to one process after step 3 stops both at
    # the next log step, 4; resumed under torchrun, the run goes on as one process trains it.
    common = ['--gradient_accumulation_steps=2', '--max_iters=6', '--eval_interval=6',
              '--log_interval=2', f'--memory={memory}']
    env = wandb_stub(tmp_path)
    run('train.py', *tiny(bytes_dir, tmp_path / 'one', *common), env=env)  # wandb_log False
    assert wandb_calls(tmp_path) == []  # not even imported
    two = tmp_path / 'two'
    if memory == 'kv':
        result = hooked(tmp_path, *tiny(bytes_dir, two, *common, '--wandb_log=True'),
                        torchrun=True, env=env)
        assert result.returncode == 0, result.stderr
        (_, what, init), *logs = wandb_calls(tmp_path)[1:]
        assert {call[0] for call in wandb_calls(tmp_path)} == {'0'}, "not rank 0 only"
        assert what == 'init' and init['project'] == 'lime' and init['dir'] == str(two)
        assert init['name'] == f'static 2x32 {two}' and init['config']['params'] > 0
        assert [{**data, 'step': step} for _, _, data, step in logs] == records(two)
    else:
        result = hooked(tmp_path, *tiny(bytes_dir, two, *common), torchrun=True, rank=1,
                        events={3: ['SIGTERM']})
        assert [line for line in result.stderr.splitlines() if line.startswith('stopped')] == [
            f"stopped by SIGTERM at step 4, its checkpoint saved to {two}/ckpt.pt: resume with "
            f"torchrun --nproc_per_node=2 {ROOT}/train.py --out_dir={two} --init_from=resume"]
        assert saved(two)['step'] == 4 and losses(two)[-1][0] == 4
        result = hooked(tmp_path, *resume(two), torchrun=True)
        assert result.returncode == 0, result.stderr
    assert [step for step, _ in losses(two)] == [step for step, _ in losses(tmp_path / 'one')]
    assert [x for _, x in losses(two)] == pytest.approx([x for _, x in losses(tmp_path / 'one')],
                                                        rel=1e-5)


def test_wandb_failures_are_one_line_before_training(bytes_dir, tmp_path):
    # wandb.init refusing (no API key, say): its words, on one line, with the offline mode named.
    env = {**wandb_stub(tmp_path), 'WANDB_STUB_FAIL': 'api_key not configured\n(no-tty)'}
    result = run('train.py', *tiny(bytes_dir, tmp_path / 'refused', '--wandb_log=True',
                                   '--wandb_run_name=try 1', '--wandb_project=p'),
                 check=False, env=env)
    assert only_line(result) == ("error: wandb could not start a run: api_key not configured "
                                 "(no-tty) (WANDB_MODE=offline logs without an account)")
    assert [(c[2]['name'], c[2]['project']) for c in wandb_calls(tmp_path) if c[1] == 'init'] == \
        [('try 1', 'p')]
    # wandb not installed: one line, before out_dir is made.
    env = wandb_stub(tmp_path / 'missing', module="raise ImportError('No module named wandb')")
    result = run('train.py', *tiny(bytes_dir, tmp_path / 'never', '--wandb_log=True'),
                 check=False, env=env)
    assert only_line(result) == ("error: wandb_log=True needs wandb: pip install wandb (or leave "
                                 "wandb_log False)")
    assert not (tmp_path / 'never').exists()


def test_a_checkpoint_that_would_run_code_is_refused_unread(tmp_path):
    class Planted:  # unpickled, it runs code: it creates the file code_ran
        def __reduce__(self):
            return open, (str(tmp_path / 'code_ran'), 'w')

    torch.save({'model': Planted(), 'model_args': {}, 'step': 1}, tmp_path / 'ckpt.pt')
    result = run('train.py', *resume(tmp_path), check=False)
    assert only_line(result) == (f"error: {tmp_path}/ckpt.pt holds more than tensors and plain "
                                 "values, as train.py's checkpoints do: refused unread (loading it "
                                 "could run code)")
    assert not (tmp_path / 'code_ran').exists()


def test_every_preset_parses_against_train_py_defaults(tmp_path, monkeypatch):
    # Each preset, with each router and v1's memory, is accepted: the run stops at the first
    # thing that needs data (in this process, as `python train.py PRESET` runs it).
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
