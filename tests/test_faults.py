"""
A run's safety, a test for each protection bookkeeping.py and prepare.py keep: checkpoints written
whole, no weights that are not finite saved, stop signals that save (Ctrl-C, SIGTERM, SIGUSR1,
SIGHUP; a hook in the child sends the signal to itself after a given optimizer step), no finished
run replaced unasked, resumes that refuse another run's settings, data sets whole or absent.

    python -m pytest -q tests/test_faults.py
"""
import errno
import glob
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
import lime
import prepare
from test_train import ROOT, TINY, logged_steps, read_log, run, saved, train
from test_train import data_dir  # noqa: F401 (a fixture)

needs_gpt2 = pytest.mark.usefixtures('gpt2')  # skipped offline, saying why (conftest.py)

# Runs train.py as `python train.py ARGS` would (as the script of python or of torchrun), sending
# this process the signal SIGNAL after its optimizer's AT-th step (on rank RANK only, if given),
# TWICE times in a row (a job script forwarding it, and the scheduler signalling the process
# group), and, with AGAIN, a second SIGINT once the checkpoint saved after that step has begun its
# write. SPOIL, {step: what}, spoils what after that step (before the signal): 'nan' in one
# weight, 'noise' in every weight (finite, a worse model). SIGHUP is as a shell leaves it: SIG_IGN
# under nohup, else SIG_DFL.
SIGNALLING = '''
import os, runpy, signal, sys
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
SIGNAL, AT, RANK, TWICE, AGAIN, SPOIL = {signal}, {at}, {rank}, {twice}, {again}, {spoil}
signal.signal(signal.SIGHUP, signal.{sighup})
steps = 0

def after_step(optimizer, args, kwargs):
    global steps
    steps += 1
    weights = [w for group in optimizer.param_groups for w in group['params']]
    with torch.no_grad():
        if SPOIL.get(steps) == 'nan':
            weights[0].fill_(float('nan'))
        if SPOIL.get(steps) == 'noise':
            for w in weights:
                w.add_(torch.randn_like(w))
    if steps == AT and RANK in (None, int(os.environ.get('RANK', 0))):
        for _ in range(TWICE):
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


def signalling(tmp_path, *args, signum=0, at=0, rank=None, twice=False, again=False, spoil=None,
               nohup=False, torchrun=False):
    """(the command that runs train.py with args as SIGNALLING says, its environment)."""
    hook = tmp_path / 'signalling.py'
    hook.write_text(SIGNALLING.format(signal=int(signum), at=at, rank=rank, twice=1 + twice,
                                      again=again, spoil=spoil or {},
                                      sighup='SIG_IGN' if nohup else 'SIG_DFL',
                                      train_py=os.path.join(ROOT, 'train.py')))
    launcher, env = [sys.executable], {**os.environ, 'PYTHONPATH': ROOT}
    if torchrun:  # one thread each: two processes share the machine
        launcher += ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
        env['OMP_NUM_THREADS'] = '1'
    return [*launcher, str(hook), *args], env


def signalled(tmp_path, *args, **how):
    """train.py with args, signalled as SIGNALLING says; its output captured."""
    command, env = signalling(tmp_path, *args, **how)
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)


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
# stop signals: the step finishes, a checkpoint is saved, the exit code is 128 + n


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
    assert saved(out)['step'] == 3 and no_temporaries(out)
    command = shlex.split(line.split('resume with ')[1])
    assert command[1:] == [os.path.join(ROOT, 'train.py'), f'--out_dir={out}', '--init_from=resume']
    run('train.py', *command[2:], '--device=cpu')
    assert read_log(out) == read_log(tmp_path / 'whole')  # every loss, as if never stopped


@pytest.mark.parametrize('signum, twice', [(signal.SIGTERM, True), (signal.SIGUSR1, False)])
def test_a_clusters_signals_save_the_step_in_flight_and_stop(data_dir, tmp_path, signum, twice):
    # SIGTERM twice at once (forwarded by a job script, and sent to the process group) is one
    # request; SIGUSR1 (sbatch --signal=USR1@90, the time nearly up) stops as SIGTERM does
    out = tmp_path / 'run'
    result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                       '--max_iters=8', '--eval_interval=4', signum=signum, at=3, twice=twice)
    assert result.returncode == 128 + signum, result.stderr
    assert only_line(result.stderr) == (
        f"stopped by {signal.Signals(signum).name} at step 3, its checkpoint saved to "
        f"{out}/ckpt.pt: resume with python {ROOT}/train.py --out_dir={out} --init_from=resume")
    assert saved(out)['step'] == 3 and max(read_log(out)[0]) == 3


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
    # A file-size limit the checkpoint does not fit in (a full disk is alike)
    limit = len(before) // 2
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'train.py'), *resume], capture_output=True, text=True,
        cwd=ROOT, timeout=300, env={**os.environ, 'PYTHONPATH': ROOT},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert result.returncode == 1
    assert only_line(result.stderr) == f"error: could not write {out}/ckpt.pt: File too large"
    assert (out / 'ckpt.pt').read_bytes() == before and no_temporaries(out)


def test_under_ddp_a_signal_to_one_process_stops_all_at_the_same_step(data_dir, tmp_path):
    # Checked at the log steps (every second step here): the signal after step 3 stops both at 4
    out = tmp_path / 'run'
    result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                       '--gradient_accumulation_steps=2', '--max_iters=10', '--eval_interval=10',
                       '--log_interval=2', signum=signal.SIGTERM, at=3, rank=1, torchrun=True)
    assert result.returncode != 0
    stopped = [line for line in result.stderr.splitlines() if line.startswith('stopped by')]
    assert stopped == [f"stopped by SIGTERM at step 4, its checkpoint saved to {out}/ckpt.pt: "
                       f"resume with torchrun --nproc_per_node=2 {ROOT}/train.py --out_dir={out} "
                       "--init_from=resume"], result.stderr
    assert saved(out)['step'] == 4
    assert max(read_log(out)[0]) == 4  # neither process trained a step past it


def test_a_run_started_under_nohup_goes_on_through_sighup(data_dir, tmp_path):
    out = tmp_path / 'run'
    result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                       '--max_iters=4', '--eval_interval=4', signum=signal.SIGHUP, at=2, nohup=True)
    assert result.returncode == 0 and result.stderr == '', result.stderr
    assert saved(out)['step'] == 4


# -----------------------------------------------------------------------------
# what may replace a checkpoint: finite weights, and a better evaluation where asked


@pytest.mark.parametrize('at', [2, 5])  # before the first checkpoint (step 4), and after it
def test_weights_that_turn_nan_between_log_lines_are_not_saved_by_a_stop(data_dir, tmp_path, at):
    out = tmp_path / 'run'
    # A weight goes nan after step `at`, where no log line sees it, and SIGTERM comes then
    result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                       '--max_iters=8', '--eval_interval=4', signum=signal.SIGTERM, at=at,
                       spoil={at: 'nan'})
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    line = only_line(result.stderr)
    assert line.startswith(f"stopped by SIGTERM at step {at}, not saved: its weights are not "
                           "finite. "), line
    if at < 4:
        assert line.endswith("No checkpoint was saved: start again with a lower learning_rate")
        assert not (out / 'ckpt.pt').exists()
    else:
        assert line.endswith(f"The last good checkpoint ({out}/ckpt.pt, step 4) is kept: resume "
                             "from it with --init_from=resume and a lower learning_rate")
        kept = saved(out)
        assert kept['step'] == 4 and all(torch.isfinite(w).all() for w in kept['model'].values())


def test_with_always_save_checkpoint_false_a_stop_keeps_the_best_checkpoint(data_dir, tmp_path):
    out = tmp_path / 'run'
    # Noise in every weight after step 4 makes step 6's evaluation worse; SIGTERM after step 7
    result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                       '--max_iters=10', '--eval_interval=2', '--always_save_checkpoint=False',
                       signum=signal.SIGTERM, at=7, spoil={5: 'noise'})
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    val = read_log(out)[1]
    best = 4 if val[4] < val[2] else 2  # each evaluation better than the checkpoint's replaced it
    assert val[6] > val[best] and val[2] < val[0]  # the fault took, and training learned first
    assert only_line(result.stderr) == (
        f"stopped by SIGTERM at step 7, not saved: with always_save_checkpoint=False only a better "
        f"evaluation replaces the checkpoint ({out}/ckpt.pt, step {best}, val loss "
        f"{val[best]:.4f}): resume from it with python {ROOT}/train.py --out_dir={out} "
        "--init_from=resume")
    kept = saved(out)
    assert (kept['step'], kept['val_loss']) == (best, val[best])  # what sample.py says of it


# -----------------------------------------------------------------------------
# files written whole; a finished run replaced only as asked


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


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / 'result.json'
    bookkeeping.write_json(path, {'bpb': 1.5})
    with pytest.raises(OSError, match='No space left on device'):
        bookkeeping.write_whole(path, lambda f: FullDisk(f, 10).write(b'{"bpb": 1.25, "x": 0}'))
    with pytest.raises(ValueError):  # JSON has no nan: a file holding one would not be JSON
        bookkeeping.write_json(path, {'bpb': float('nan')})
    assert json.loads(path.read_text()) == {'bpb': 1.5} and os.listdir(tmp_path) == [path.name]


def test_overwrite_keeps_the_old_run_until_the_new_one_has_saved(trained, data_dir, tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(trained, out)
    before = {name: (out / name).read_bytes() for name in ('ckpt.pt', 'log.txt')}
    new_run = [*TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--overwrite=True',
               '--max_iters=4', '--eval_interval=4']
    # The new run diverges at step 2, or is killed outright (SIGKILL), before its first
    # checkpoint: the old run is as it was
    result = signalled(tmp_path, *new_run, spoil={1: 'nan'})
    assert only_line(result.stderr).startswith("error: the training loss is nan at step 2")
    assert signalled(tmp_path, *new_run, signum=signal.SIGKILL, at=2).returncode == -9
    assert {name: (out / name).read_bytes() for name in before} == before
    assert sorted(os.listdir(out)) == ['.lock', 'ckpt.pt', 'log.txt']
    # Once the new run has saved, the old one is gone
    run('train.py', *new_run, '--seed=7')
    assert saved(out)['step'] == 4 and saved(out)['config']['seed'] == 7
    assert logged_steps(out) == [(0, 'val'), (1, 'train'), (2, 'train'), (3, 'train'),
                                 (4, 'train'), (4, 'val')]


# -----------------------------------------------------------------------------
# resuming: the checkpoint's run, with what a machine may change


def test_a_resume_refuses_a_setting_that_would_make_another_run(trained):
    before = {path.name: path.read_bytes() for path in trained.iterdir()}
    for change in ('--n_layer=3', '--batch_size=2', '--eval_iters=1', '--seed=2'):
        result = run('train.py', f'--out_dir={trained}', '--init_from=resume', '--device=cpu',
                     '--max_iters=4', change, check=False)
        key, value = change[2:].split('=')
        assert re.fullmatch(rf"error: --{key}={value} would make another run than the "
                            rf"checkpoint's \({key}=\d+\): train it into another --out_dir",
                            only_line(result.stderr)), result.stderr
    assert {path.name: path.read_bytes() for path in trained.iterdir()} == before


def test_a_resume_applies_changed_optimizer_settings(trained, tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(trained, out)
    result = run('train.py', f'--out_dir={out}', '--init_from=resume', '--device=cpu',
                 '--max_iters=3', '--weight_decay=0.5', '--beta2=0.5')
    assert "note: resuming with weight_decay=0.5, changed from the checkpoint's 0.1" in \
        result.stdout
    groups = saved(out)['optimizer']['param_groups']
    assert {group['betas'] for group in groups} == {(0.9, 0.5)}
    assert {group['weight_decay'] for group in groups} == {0.0, 0.5}  # 0: gains, biases, routers


def test_a_resume_with_nothing_to_train_changes_nothing_on_disk(trained):
    before = {path.name: path.read_bytes() for path in trained.iterdir()}
    result = run('train.py', f'--out_dir={trained}', '--init_from=resume', '--device=cpu',
                 '--max_iters=2', '--learning_rate=1e-2')
    assert result.stdout == ("the checkpoint is at step 2, max_iters is 2: nothing to train (a "
                             "larger --max_iters trains it further)\n")
    assert {path.name: path.read_bytes() for path in trained.iterdir()} == before


# -----------------------------------------------------------------------------
# a checkpoint that would run code: refused unread by every tool


class Planted:
    """What a crafted checkpoint holds: unpickled, it runs code (here: it creates marker)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), 'w')


TOOLS = {  # each script that loads a checkpoint, with the arguments that take it to the loading
    'sample.py': ['--out_dir={run}', '--device=cpu'],
    'train.py': ['--out_dir={run}', '--init_from=resume', '--device=cpu'],
    'lab.evaluate': ['--out_dir={run}', '--task=', '--data_dir=unread', '--device=cpu'],
    'lab.analyze': ['--out_dirs={run}', '--device=cpu'],
    'lab.arith': ['--mode=eval', '--ckpt_dir={run}', '--device=cpu'],
}


def refusal(monkeypatch, tool, run_dir):
    """The one line that stops tool, run in this process as its command would run it."""
    monkeypatch.setattr(sys, 'argv', [tool, *(a.format(run=run_dir) for a in TOOLS[tool])])
    monkeypatch.setattr(sys, 'excepthook', sys.excepthook)  # each sets it: configure
    monkeypatch.delitem(sys.modules, tool, raising=False)  # run afresh, as a command
    with pytest.raises(SystemExit) as stopped:
        if tool.endswith('.py'):
            runpy.run_path(os.path.join(ROOT, tool), run_name='__main__')
        else:
            runpy.run_module(tool, run_name='__main__')
    return str(stopped.value)


def test_a_checkpoint_that_would_run_code_is_refused_unread_by_every_tool(tmp_path, monkeypatch):
    marker = tmp_path / 'code_ran'
    planted = tmp_path / 'planted'
    planted.mkdir()
    torch.save({'model': Planted(marker), 'model_args': {}, 'step': 1, 'best_val_loss': 1.0},
               planted / 'ckpt.pt')
    for tool in TOOLS:
        line = refusal(monkeypatch, tool, planted)
        assert line == (f"error: {planted}/ckpt.pt holds more than tensors and plain values, as "
                        "train.py's checkpoints do: refused unread (loading it could run code)")
        assert not marker.exists(), tool


# -----------------------------------------------------------------------------
# a data set is whole or absent


@needs_gpt2
def test_a_data_set_that_fails_midway_leaves_nothing_and_two_at_once_both_end_with_it(tmp_path):
    docs = tmp_path / 'docs.jsonl'
    docs.write_text(''.join(json.dumps({'text': f'document {i} ' * 40}) + '\n' for i in range(60))
                    + '{"text": 5}\n')  # the last record is bad: found after shards are written
    args = ['--input', str(docs), '--shard_size', '500', '--workers', '1']
    with pytest.raises(SystemExit, match="docs.jsonl:61: expected a JSON object"):
        prepare.main([*args, '--out_dir', str(tmp_path / 'data')])
    assert sorted(os.listdir(tmp_path)) == ['docs.jsonl']  # no data/, and nothing beside it
    docs.write_text(docs.read_text().replace('{"text": 5}\n', ''))
    # Two at once, as two runs preparing the default data: the second to finish keeps the first's
    both = [subprocess.Popen([sys.executable, os.path.join(ROOT, 'prepare.py'), *args,
                              '--out_dir', str(tmp_path / 'data')], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for writer in both:
        assert writer.wait(timeout=300) == 0, writer.stderr.read()
    assert sorted(os.listdir(tmp_path)) == ['data', 'docs.jsonl']
    assert len(prepare.shard_paths(str(tmp_path / 'data'), 'train')) > 1
