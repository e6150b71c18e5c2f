"""
Faults a run must come through, injected at a known point: Ctrl-C, SIGTERM and SIGHUP (a hook in
the child sends the signal to itself after a given optimizer step, or in the middle of a
checkpoint's write), weights that turn nan or worse and a training shard replaced (the same hook,
after a given step), outputs whose reader is gone (a closed pipe, a closed terminal), a full disk
or a file-size limit (a file whose writes raise ENOSPC, or RLIMIT_FSIZE in a child), a memory
limit (RLIMIT_AS in a child, a cgroup's files), files that cannot be read, checkpoints crafted to
run code or holding nan, a data set read while it is written, and resumes that change settings.
Each ends in the right result or in one line, with every good file kept as it was and no
temporary file left behind.

    python -m pytest -q tests/test_faults.py
"""
import errno
import glob
import io
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

import numpy as np
import pytest
import torch

import bookkeeping
import configurator
import safe_files
import lime
import memory_limits
import prepare
from test_train import ROOT, TINY, command, logged_steps, read_log, run, saved, train
from test_train import data_dir  # noqa: F401 (a fixture)

needs_gpt2 = pytest.mark.usefixtures('gpt2')  # skipped offline, saying why (conftest.py)

# Runs train.py as `python train.py ARGS` would (as the script of python or of torchrun), sending
# this process the signal SIGNAL after its optimizer's AT-th step (on rank RANK only, if given),
# with TWICE twice in a row (a job script forwarding it, and the scheduler signalling the process
# group), and, with AGAIN, a second SIGINT once the checkpoint saved after that step has begun its
# write, later than SAME_REQUEST seconds after the first (sooner it would be the same request).
# SPOIL, {step: what}, spoils what after that step (before the signal): 'nan' in one weight,
# 'noise' in every weight (finite, a worse model), or a training shard (its path), replaced by the
# file beside it named .new. SIGHUP is as a shell leaves it: SIG_IGN under nohup, else SIG_DFL.
SIGNALLING = '''
import os, runpy, signal, sys, time
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
import bookkeeping
SIGNAL, AT, RANK, TWICE, AGAIN, SPOIL = {signal}, {at}, {rank}, {twice}, {again}, {spoil}
signal.signal(signal.SIGHUP, signal.{sighup})
steps = 0

def after_step(optimizer, args, kwargs):
    global steps
    steps += 1
    if steps in SPOIL:
        spoil(optimizer, SPOIL[steps])
    if steps == AT and RANK in (None, int(os.environ.get('RANK', 0))):
        for _ in range(TWICE):
            os.kill(os.getpid(), SIGNAL)

@torch.no_grad()
def spoil(optimizer, what):
    weights = [w for group in optimizer.param_groups for w in group['params']]
    if what == 'nan':
        weights[0].fill_(float('nan'))
    elif what == 'noise':
        for w in weights:
            w.add_(torch.randn_like(w))
    else:
        os.replace(what + '.new', what)

class Interrupted:
    """A file that gets a Ctrl-C as soon as it is written to."""
    def __init__(self, f):
        self.f = f
    def write(self, data):
        written = self.f.write(data)
        time.sleep(bookkeeping.Interrupts.SAME_REQUEST)
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


def signalled(tmp_path, *args, output=None, **how):
    """train.py with args, signalled as SIGNALLING says; its output captured, or as output says
    (subprocess.run's stdout and stderr)."""
    command, env = signalling(tmp_path, *args, **how)
    return subprocess.run(command, **(output or {'capture_output': True}), text=True, cwd=ROOT,
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
    assert saved(out)['step'] == 3
    assert max(read_log(out)[0]) == 3  # neither process trained a step past it


# -----------------------------------------------------------------------------
# what may replace a checkpoint: RunDir.save's one rule, at an evaluation and on a stop signal


def test_a_checkpoint_is_replaced_only_by_finite_weights_and_as_asked_by_a_better_evaluation(
        tmp_path):
    model = lime.GPT(lime.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
    optimizer = torch.optim.AdamW(model.parameters())
    for always in (True, False):
        out = tmp_path / str(always)
        config = {'out_dir': str(out), 'init_from': 'scratch', 'overwrite': False, 'max_iters': 10,
                  'eval_interval': 2, 'device': 'cpu', 'always_save_checkpoint': always}
        run_dir = bookkeeping.RunDir(config)
        run_dir.claim(model)
        run_dir.log_eval(0, 3.0, None)
        run_dir.save(model, optimizer, NO_DATA, 1, signal.SIGTERM)  # a stop before step 2
        # Its val loss is step 0's, the last evaluation of its weights' run: not inf
        checkpoint = saved(out)
        assert (checkpoint['step'], checkpoint['val_step'], checkpoint['val_loss']) == (1, 0, 3.0)
        on_disk = []
        for step, val_loss in [(2, 2.5), (4, 2.7), (6, 2.4)]:  # better, worse, better
            run_dir.log_eval(step, val_loss, None)
            run_dir.save(model, optimizer, NO_DATA, step)
            on_disk.append((saved(out)['step'], saved(out)['val_loss']))
        expected = [(2, 2.5), (4, 2.7), (6, 2.4)] if always else [(2, 2.5), (2, 2.5), (6, 2.4)]
        assert on_disk == expected, always
        assert saved(out)['best_val_loss'] == 2.4
        # A stop after step 7: with always False, no evaluation since step 6's says it is better
        run_dir.save(model, optimizer, NO_DATA, 7, signal.SIGTERM)
        assert saved(out)['step'] == (7 if always else 6)
        assert (run_dir.unsaved is None) == always
        # Weights that are not finite replace nothing: on a stop the reason is kept for its line,
        # at an evaluation the run stops
        with torch.no_grad():
            model.lm_head.weight[0, 0] = float('nan')
        run_dir.save(model, optimizer, NO_DATA, 8, signal.SIGTERM)
        assert run_dir.unsaved.startswith('its weights are not finite (')
        run_dir.log_eval(8, 2.0, None)
        with pytest.raises(SystemExit, match=r"^error: its weights are not finite \(.* at step 8: "
                                             r"stopping\. The last good checkpoint .* is kept"):
            run_dir.save(model, optimizer, NO_DATA, 8)
        assert saved(out)['step'] == (7 if always else 6)
        assert all(torch.isfinite(w).all() for w in saved(out)['model'].values())
        with torch.no_grad():
            model.lm_head.weight[0, 0] = 0.0
        run_dir.log_file.close()
        run_dir.lock.close()


def test_overwrite_keeps_the_old_run_until_the_new_one_has_saved(trained, data_dir, tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(trained, out)
    before = {name: (out / name).read_bytes() for name in ('ckpt.pt', 'log.txt')}
    new_run = [*TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--overwrite=True',
               '--max_iters=4', '--eval_interval=4']
    # The new run diverges at step 2, before its first checkpoint: the old run is back, whole
    result = signalled(tmp_path, *new_run, spoil={1: 'nan'})
    assert result.returncode == 1
    assert only_line(result.stderr).startswith("error: the training loss is nan at step 2")
    assert {name: (out / name).read_bytes() for name in before} == before
    assert sorted(os.listdir(out)) == ['.lock', 'ckpt.pt', 'log.txt']
    # Once the new run has saved, the old one is gone
    run('train.py', *new_run)
    assert saved(out)['step'] == 4 and sorted(os.listdir(out)) == ['.lock', 'ckpt.pt', 'log.txt']


def test_an_overwrite_killed_outright_leaves_the_old_run_to_resume_or_to_replace(trained, data_dir,
                                                                                 tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(trained, out)
    before = {name: (out / name).read_bytes() for name in ('ckpt.pt', 'log.txt')}
    new_run = [*TINY, f'--data_dir={data_dir}', f'--out_dir={out}', '--overwrite=True',
               '--max_iters=4', '--eval_interval=4']
    resumed = ['--init_from=resume', f'--out_dir={out}', '--device=cpu', '--max_iters=4']
    # SIGKILL at step 2, before the new run's first checkpoint: no put_back runs
    assert signalled(tmp_path, *new_run, signum=signal.SIGKILL, at=2).returncode == -signal.SIGKILL
    assert sorted(os.listdir(out)) == ['.lock', 'log.txt', 'replaced']
    assert {name: (out / 'replaced' / name).read_bytes() for name in before} == before
    # The next run into out_dir puts the old run back first: a resume continues it from step 2
    result = run('train.py', *resumed)
    assert 'holds again the run that a killed --overwrite=True run was replacing' in result.stdout
    assert saved(out)['step'] == 4 and sorted(os.listdir(out)) == ['.lock', 'ckpt.pt', 'log.txt']
    old = logged_steps(trained)
    assert logged_steps(out)[:len(old)] == old  # the old run's records, kept
    # Killed again, then --overwrite=True once more: it replaces the old run, as asked
    signalled(tmp_path, *new_run, '--seed=7', signum=signal.SIGKILL, at=2)
    run('train.py', *new_run, '--seed=7')
    assert saved(out)['config']['seed'] == 7 and saved(out)['step'] == 4
    assert sorted(os.listdir(out)) == ['.lock', 'ckpt.pt', 'log.txt']
    # Killed between its checkpoint and deleting replaced/: the replaced run goes, as save does
    (out / 'replaced').mkdir()
    (out / 'replaced' / 'ckpt.pt').write_bytes(before['ckpt.pt'])
    run('train.py', *resumed[:-1], '--max_iters=6')
    assert saved(out)['step'] == 6 and sorted(os.listdir(out)) == ['.lock', 'ckpt.pt', 'log.txt']


def test_a_run_started_under_nohup_goes_on_through_sighup(data_dir, tmp_path):
    out = tmp_path / 'run'
    result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                       '--max_iters=4', '--eval_interval=4', signum=signal.SIGHUP, at=2, nohup=True)
    assert result.returncode == 0 and result.stderr == '', result.stderr
    assert saved(out)['step'] == 4


@pytest.mark.parametrize('at', [2, 5])  # before the first checkpoint (step 4), and after it
def test_weights_that_turn_nan_between_log_lines_are_not_saved_by_a_stop(data_dir, tmp_path, at):
    out = tmp_path / 'run'
    # A weight goes nan after step `at`, where no log line sees it, and SIGTERM comes then
    result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                       '--max_iters=8', '--eval_interval=4', signum=signal.SIGTERM, at=at,
                       spoil={at: 'nan'})
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    line = only_line(result.stderr)
    assert re.fullmatch(rf"stopped by SIGTERM at step {at}, not saved: its weights are not finite "
                        r"\(nan or inf in [\w. ]+\)\. .*", line), line
    if at < 4:
        assert line.endswith("No checkpoint was saved before it (the first comes at step 4): start "
                             "again with a lower learning_rate and --overwrite=True")
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
        f"{val[best]:.4f}), and the last evaluation (step 6, val loss {val[6]:.4f}) is no better: "
        f"resume from it with python {ROOT}/train.py --out_dir={out} --init_from=resume")
    kept = saved(out)
    assert (kept['step'], kept['val_loss']) == (best, val[best])  # what sample.py says of it


def test_a_resume_that_evaluates_other_batches_measures_the_best_checkpoint_again(trained, data_dir,
                                                                                  tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(trained, out)
    before = (out / 'ckpt.pt').read_bytes()
    # Its val loss is over TINY's 2 validation batches; the first alone, as the resume evaluates:
    model, _ = lime.load_checkpoint(str(out / 'ckpt.pt'), 'cpu')
    val = prepare.read_shard(prepare.shard_paths(data_dir, 'val')[0])
    tokens = torch.from_numpy(val[:4 * 32 + 1].astype(np.int64))  # TINY: batch 4, block 32
    with torch.no_grad():
        first_batch = model(tokens[:-1].view(4, 32), tokens[1:].view(4, 32))[1].item()
    # Noise in every weight after step 3 makes step 4's evaluation worse; SIGTERM after step 5
    result = signalled(tmp_path, f'--out_dir={out}', '--init_from=resume', '--device=cpu',
                       '--always_save_checkpoint=False', '--eval_iters=1', '--max_iters=8',
                       signum=signal.SIGTERM, at=3, spoil={1: 'noise'})
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert "note: the checkpoint's val loss" in result.stdout
    # The loss to beat is the checkpoint's weights on that one batch, not its loss over two
    to_beat = re.search(r"ckpt\.pt, step 2, val loss ([\d.]+)\), and the last evaluation "
                        r"\(step 4, ", only_line(result.stderr))
    assert to_beat and abs(float(to_beat[1]) - first_batch) < 1e-3, (result.stderr, first_batch)
    assert (out / 'ckpt.pt').read_bytes() == before


# -----------------------------------------------------------------------------
# outputs that close under a run: a `| tee` stopped by the same Ctrl-C, a `| head`, a lost terminal


def closed_pipe():
    """The writing end of a pipe whose reader has gone, as a `| tee` killed by Ctrl-C leaves it."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_ctrl_c_after_the_output_pipe_closed_saves_and_says_so_on_stderr(data_dir, tmp_path):
    out = tmp_path / 'run'
    stdout = closed_pipe()
    try:
        result = signalled(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                           '--max_iters=8', '--eval_interval=4', signum=signal.SIGINT, at=3,
                           output={'stdout': stdout, 'stderr': subprocess.PIPE})
    finally:
        os.close(stdout)
    assert result.returncode == 128 + signal.SIGINT, result.stderr
    assert only_line(result.stderr).startswith(f"stopped by SIGINT at step 3, its checkpoint saved")
    assert saved(out)['step'] == 3 and max(read_log(out)[0]) == 3


def test_a_reader_that_stops_reading_midway_stops_nothing(data_dir, tmp_path):
    out = tmp_path / 'run'
    # `2>&1 | head -n 3`: both outputs into one pipe, closed after three lines
    command, env = signalling(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                              '--max_iters=6', '--eval_interval=3')
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                          env=env) as proc:
        head = [proc.stdout.readline() for _ in range(3)]
        proc.stdout.close()
        assert proc.wait(timeout=300) == 0
    assert head[0].startswith(b'tokens per step')
    assert saved(out)['step'] == 6 and sorted(read_log(out)[0]) == list(range(1, 7))


def test_a_lost_terminal_fails_every_write_and_sighup_still_saves_the_step_in_flight(data_dir,
                                                                                      tmp_path):
    out = tmp_path / 'run'
    terminal, its_end = os.openpty()  # the run writes to its_end; closing terminal loses it
    command, env = signalling(tmp_path, *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
                              '--max_iters=8', '--eval_interval=4', signum=signal.SIGHUP, at=3)
    proc = subprocess.Popen(command, stdout=its_end, stderr=its_end, cwd=ROOT, env=env)
    os.close(its_end)
    seen = b''
    while b'\n' not in seen:  # its first line: the terminal was there at the start
        seen += os.read(terminal, 1024)
    os.close(terminal)  # every write from here fails (EIO)
    assert proc.wait(timeout=300) == 128 + signal.SIGHUP
    checkpoint = saved(out)
    assert checkpoint['step'] == 3 and max(read_log(out)[0]) == 3
    # Its val loss is step 0's, the run's only evaluation before it (not inf), and said so
    step_0 = read_log(out)[1][0]
    assert (checkpoint['val_step'], checkpoint['val_loss']) == (0, step_0)
    assert lime.val_loss_of(checkpoint) == f"val loss {step_0:.4f} at step 0, its last evaluation"


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


# Ctrl-C while a script is still importing: as torch or numpy (the first a script imports) starts
# to be imported. `{run}` runs the script as python runs it.
INTERRUPTED_IMPORTING = '''
import os, runpy, signal, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name in ('torch', 'numpy'):
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
{run}
'''


@pytest.mark.parametrize('script', ['train.py', 'sample.py', 'prepare.py', 'lab/evaluate.py'])
def test_ctrl_c_while_a_script_imports_is_one_line(script):
    run_it = (f"runpy.run_module('lab.evaluate', run_name='__main__')"  # python -m lab.evaluate
              if script.startswith('lab/') else "runpy.run_path(sys.argv[0], run_name='__main__')")
    run_it = f"sys.argv[0] = {os.path.join(ROOT, script)!r}\n{run_it}"  # as python sets it
    result = subprocess.run([sys.executable, '-c', INTERRUPTED_IMPORTING.format(run=run_it)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, 'PYTHONPATH': ROOT})
    assert result.returncode == -signal.SIGINT, result.stderr  # 130 in a shell
    assert only_line(result.stderr) == f"interrupted: {os.path.basename(script)} stopped"


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


NO_DATA = type('Batches', (), {'state': lambda self: {}})()  # for a checkpoint: no position


def fill_the_disk(monkeypatch, room=100):
    """Every file write_atomically opens fails, as on a full disk, after room bytes."""
    monkeypatch.setattr(safe_files, 'open', lambda path, mode: FullDisk(open(path, mode), room),
                        raising=False)


def test_a_write_that_fails_keeps_the_old_file_leaves_no_temporary_and_names_the_file(
        tmp_path, monkeypatch):
    model = lime.GPT(lime.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
    config = {'out_dir': str(tmp_path), 'device': 'cpu', 'always_save_checkpoint': True}
    run_dir = bookkeeping.RunDir(config)
    run_dir.evaluated = (5, 1.0)  # as after step 5's evaluation
    optimizer = torch.optim.AdamW(model.parameters())
    writes = {  # each writer, and the file it writes
        'shard': (lambda: prepare.write_shard(tmp_path / 'x.bin', np.arange(1000)), 'x.bin'),
        'json': (lambda: safe_files.write_json(tmp_path / 'task.json', {'a': [0] * 100}), 'task.json'),
        'checkpoint': (lambda: run_dir.save(model, optimizer, NO_DATA, 5), 'ckpt.pt'),
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
    run_dir.claim(model)
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
    monkeypatch.setattr(torch.serialization, '_open_file_like', denied)
    with pytest.raises(ValueError, match=f"^could not read checkpoint {tmp_path}/ckpt.pt: "
                                         r"\[Errno 13\] Permission denied"):
        lime.load_checkpoint(tmp_path / 'ckpt.pt', 'cpu')
    # Anything else opened through or_fail: its OSError, named, in one line
    with pytest.raises(SystemExit, match=f"^error: {tmp_path}/elsewhere: Permission denied$"):
        configurator.or_fail(denied, tmp_path / 'elsewhere')


# -----------------------------------------------------------------------------
# checkpoints that would run code, or whose weights are not finite: refused by every tool


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


def test_no_json_file_or_line_holds_a_number_that_is_not_finite(tmp_path):
    from lab import json_line
    for bad in (float('nan'), float('inf')):
        with pytest.raises(ValueError, match=f"^{tmp_path}/result.json: not written: a value is "):
            safe_files.write_json(tmp_path / 'result.json', {'bpb': bad})
        assert not os.listdir(tmp_path)
        with pytest.raises(SystemExit, match="^error: a result is not a finite number"):
            json_line({'bpb': bad})
    assert json.loads(json_line({'bpb': 1.5})) == {'bpb': 1.5}


# -----------------------------------------------------------------------------
# data that changes under a run


def test_a_shard_changed_under_a_run_is_named_when_it_is_opened_and_its_copy_is_read(tmp_path):
    vocab = 50
    tokens = np.arange(300) % vocab
    first, second = tmp_path / 'x_train_000001.bin', tmp_path / 'x_train_000002.bin'
    changes = {  # what replaces the second shard, and the line that names it
        'the same vocabulary': (tokens[::-1], f"{second} changed since this run started"),
        'ids past the vocabulary': (tokens + 10, f"{second} holds token id {vocab + 9}, but "
                                                 f"vocab_size is {vocab}"),
    }
    for what, (other, line) in changes.items():
        for path in (first, second):
            prepare.write_shard(path, tokens)
        batches = prepare.Batches(str(tmp_path), B=2, T=8, vocab_size=vocab)
        read = [batches.next()[0]]  # the first shard is open
        prepare.write_shard(first, tokens[::-1])  # rewritten under the run: its copy is read on
        prepare.write_shard(second, other)
        with pytest.raises(ValueError) as stopped:
            while True:
                read.append(batches.next()[0])
        assert str(stopped.value).startswith(line), what
        span = 2 * 8
        assert len(read) == (len(tokens) - 1) // span, what
        for i, x in enumerate(read):
            assert (x.ravel() == tokens[i * span:(i + 1) * span]).all(), what


def test_a_training_shard_replaced_mid_run_stops_it_in_one_line_keeping_its_checkpoint(data_dir,
                                                                                      tmp_path):
    # Two shards of 300 tokens: a micro-step of 4 x 32 takes 129, so steps 3 and 4 read the second
    data = tmp_path / 'data'
    data.mkdir()
    shutil.copy(glob.glob(os.path.join(data_dir, '*_val_*.bin'))[0], data / 'x_val_000000.bin')
    tokens = prepare.read_shard(glob.glob(os.path.join(data_dir, '*_train_*.bin'))[0])
    for i in (1, 2):
        prepare.write_shard(data / f'x_train_00000{i}.bin', tokens[(i - 1) * 300:i * 300])
    second = data / 'x_train_000002.bin'
    prepare.write_shard(f'{second}.new', tokens[600:900])  # other text of the same vocabulary
    out = tmp_path / 'run'
    result = signalled(tmp_path, *TINY, f'--data_dir={data}', f'--out_dir={out}', '--max_iters=6',
                       '--eval_interval=2', spoil={1: str(second)})
    assert result.returncode == 1
    assert only_line(result.stderr).startswith(f"error: {second} changed since this run started")
    assert saved(out)['step'] == 2 and max(read_log(out)[0]) == 2


# -----------------------------------------------------------------------------
# memory: what a job needs, against the limits this process has


def test_training_that_does_not_fit_under_ulimit_v_is_refused_naming_the_limit(data_dir, tmp_path):
    # Weights of about 1 GiB fit in the 3 GiB of address space (less what python and torch map);
    # with their gradients and AdamW's moments, 4 GiB, training does not.
    shape = {'n_layer': 12, 'n_head': 8, 'n_embd': 1024}
    weights = 4 * lime.GPTConfig(**shape, block_size=32, router='static').num_floats()
    limit = 3 * 2**30
    result = subprocess.run(
        [*command('train.py'), *TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path / "run"}',
         *(f'--{key}={value}' for key, value in shape.items())],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, 'PYTHONPATH': ROOT},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert result.returncode == 1
    line = only_line(result.stderr)
    assert line.startswith(f"error: training's weights, gradients and AdamW moments "
                           f"({4 * weights / 2**30:,.1f} GiB) and one micro-batch's "
                           "activations"), line
    assert "left to this process by its address-space limit (ulimit -v, RLIMIT_AS: 3.0 GiB)" in line
    assert not (tmp_path / 'run').exists()


# Runs train.py as SIGNALLING does, where the first training step runs out of memory: with 'cpu'
# under an address-space limit that leaves it 64 MiB more (RLIMIT_AS, set as the step starts),
# with 'gpu' as torch.OutOfMemoryError (what CUDA raises), raised there.
OUT_OF_MEMORY = '''
import resource, runpy, sys
import torch
import lime, memory_limits
WHERE = {where!r}
forward = lime.GPT.forward

def running_out(self, idx, targets=None):
    if targets is not None and WHERE == 'cpu':
        mapped, _ = memory_limits.held_bytes()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + 64 * 2**20, resource.RLIM_INFINITY))
    elif targets is not None:
        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 ...')
    return forward(self, idx, targets)

lime.GPT.forward = running_out
sys.argv[0] = {train_py!r}
runpy.run_path(sys.argv[0], run_name='__main__')
'''


@pytest.mark.parametrize('where', ['cpu', 'gpu'])
def test_a_step_that_runs_out_of_memory_is_one_line_and_keeps_the_checkpoint(trained, tmp_path,
                                                                              where):
    out = tmp_path / 'run'
    shutil.copytree(trained, out)
    before = (out / 'ckpt.pt').read_bytes()
    # 64 sequences a micro-step: the logits alone take 0.4 GiB, far past what the limit leaves
    hook = OUT_OF_MEMORY.format(where=where, train_py=os.path.join(ROOT, 'train.py'))
    result = subprocess.run([sys.executable, '-c', hook, f'--out_dir={out}', '--init_from=resume',
                             '--device=cpu', '--max_iters=4', '--batch_size=64'],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, 'PYTHONPATH': ROOT})
    assert result.returncode == 1, result.stderr
    reason = {'cpu': r"torch could not allocate [\d.]+ GiB more on the CPU",
              'gpu': "CUDA out of memory"}[where]
    assert re.fullmatch(rf"error: out of memory \({reason}\): {re.escape(bookkeeping.LOWER_TO_FIT)}"
                        rf"; the last checkpoint \({out}/ckpt.pt, step 2\) is kept",
                        only_line(result.stderr)), result.stderr
    assert (out / 'ckpt.pt').read_bytes() == before and no_temporaries(out)


@pytest.mark.parametrize('version', ['v2', 'v1'])
def test_a_cgroups_memory_limit_is_found_above_the_process_and_named(tmp_path, monkeypatch,
                                                                     version):
    # A scheduler's job (1 GiB) holds the process's own cgroup (no limit of its own)
    proc, root, name = {'v2': ('0::/job/step', '/sys/fs/cgroup', 'memory.max'),
                        'v1': ('4:memory:/job/step', '/sys/fs/cgroup/memory',
                               'memory.limit_in_bytes')}[version]
    files = {'/proc/self/cgroup': f'7:pids:/job\n{proc}\n', f'{root}/job/{name}': '1073741824\n',
             f'{root}/job/step/{name}': 'max\n' if version == 'v2' else '9223372036854771712\n'}

    def fake_open(path, *args):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(memory_limits, 'open', fake_open, raising=False)
    assert memory_limits.cgroup_limit() == (2**30, f'{root}/job/{name}')
    monkeypatch.setattr(memory_limits, 'held_bytes', lambda: (0, 0))
    assert memory_limits.memory_limit('cpu') == (
        2**30, f"left to this process by its cgroup's limit ({root}/job/{name}: 1.0 GiB)")
    with pytest.raises(SystemExit, match=rf"^error: 2 GiB of samples take 2.0 GiB, more than the "
                                         rf"1.0 GiB left to this process by its cgroup's limit"):
        memory_limits.check_memory(2 * 2**30, 'cpu', '2 GiB of samples')


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
