"""
bookkeeping.py: what train.py does around the training itself, so that a run survives mistakes:
out_dir holds one run (a lock, and no earlier run replaced unless asked), a resumed run continues
with the settings it was started with, checkpoints are written whole, and a loss that blows up
stops the run with the last good checkpoint kept.

    out_dir/ckpt.pt   the checkpoint (lime.save_checkpoint), with what a resumed run needs
    out_dir/log.txt   a JSON object a line: the run's settings first, then each log line's record
"""
import ctypes
import glob
import json
import math
import os
import shlex
import signal
import sys
from dataclasses import fields

import torch

from configurator import check_value, fail, or_fail, set_key
from lime import GPTConfig, load_checkpoint, save_checkpoint
from prepare import lock, write_atomically

# Settings that belong to the machine a run is on, not to the run: today's, also on a resume.
MACHINE_KEYS = {'out_dir', 'init_from', 'overwrite', 'device', 'dtype', 'compile', 'fused',
                'peak_flops'}
CHECKPOINT_KEYS = ('optimizer', 'step', 'best_val_loss', 'config', 'data', 'rng')


def say(message):
    """print, on one process only (rank 0 under torchrun)."""
    if os.environ.get('RANK', '0') in ('', '0'):
        print(message, flush=True)


def tune_cpu_allocator():
    """glibc hands big freed blocks (each step's logits) back to the OS and faults them in again at
    the next step; keeping up to 1 GiB of freed heap made CPU training steps 1.4-1.6x faster."""
    if sys.platform != 'linux':
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's options, from glibc's malloc.h
    try:
        libc = ctypes.CDLL('libc.so.6')
    except OSError:  # not glibc (musl, say): nothing to tune
        return
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)  # blocks this large or smaller come from the heap
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)  # and the heap is not trimmed below that


def resume_settings(config, given, kinds):
    """With init_from='resume', the saved run's (model, checkpoint), with config changed in place
    to the saved run's settings: the model is the checkpoint's (an override that contradicts it
    is a mistake); data, schedule and evaluation are the checkpoint's unless given again (with a
    note; a value the resumed run would not use is refused); what belongs to this machine
    (MACHINE_KEYS) is today's. (None, None) for a new run. A resume that has nothing to train
    ends the script here, before anything is written. kinds: configure's, to check the saved
    values as a --key=value is."""
    if config['init_from'] != 'resume':
        return None, None
    if config['overwrite']:
        fail("--overwrite=True replaces the run in out_dir, --init_from=resume continues it: give "
             "one of them")
    path = os.path.join(config['out_dir'], 'ckpt.pt')
    # To the CPU: train.py moves the model to its device (under torchrun, known only later).
    model, checkpoint = or_fail(load_checkpoint, path, 'cpu', CHECKPOINT_KEYS)
    saved = checkpoint['config']
    # The schedule's length is kept (checkpoints of older versions saved 0 for "max_iters").
    saved['lr_decay_iters'] = saved.get('lr_decay_iters') or saved.get('max_iters', 0)
    model_defaults = {f.name: f.default for f in fields(GPTConfig)}  # keys older runs lacked
    changed = {}  # the keys given a value other than the saved one: {key: the saved value}
    for key in sorted(given - MACHINE_KEYS):
        old = saved.get(key, model_defaults.get(key))
        if config[key] == old:
            continue
        if key in model_defaults:
            fail(f"--{key}={config[key]} contradicts the checkpoint's {old!r}")
        changed[key] = old
    kind_of = {key: kind for kind, keys in kinds.items() for key in keys}
    for key in saved:
        if key in config and key not in MACHINE_KEYS and key not in given:
            # Checked as a --key=value is: edited by hand, it would fail later, in a traceback
            set_key(config, key, saved[key], f"{path}: its saved setting")
            check_value(key, config[key], kind_of.get(key), f"{path}: its saved ")
    for key in changed:
        if (why := unused_on_resume(key, config)) is not None:
            fail(f"--{key}={config[key]!r} has no use on this resume: {why}")
    if checkpoint['step'] >= config['max_iters']:
        say(f"the checkpoint is at step {checkpoint['step']}, max_iters is {config['max_iters']}: "
            "nothing to train (a larger --max_iters trains it further)")
        raise SystemExit(0)
    for key, old in changed.items():
        if key in saved:
            say(f"note: resuming with {key}={config[key]!r}, changed from the checkpoint's {old!r}")
    return model, checkpoint


def unused_on_resume(key, config):
    """Why a resumed run would not use the value of key, or None if it does."""
    if key == 'seed':
        return "the weights and the random state are the checkpoint's"
    switches = {'wandb_project': 'wandb_log', 'wandb_run_name': 'wandb_log',
                'mc_task': 'mc_interval', 'mc_examples': 'mc_interval'}
    if key in switches and not config[switches[key]]:
        return f"{switches[key]} is {config[switches[key]]!r}"
    return None


def restore_state(checkpoint, optimizer, batches, config):
    """Put the optimizer, the random generators and the data position back as they were saved."""
    path = os.path.join(config['out_dir'], 'ckpt.pt')
    try:
        # The moments and step counts are the checkpoint's; the settings of each group (betas,
        # weight_decay, ...) today's, which load_state_dict would replace with the saved ones.
        settings = [{k: v for k, v in group.items() if k != 'params'}
                    for group in optimizer.param_groups]
        optimizer.load_state_dict(checkpoint['optimizer'])
        for group, today in zip(optimizer.param_groups, settings):
            group.update(today)
        torch.set_rng_state(checkpoint['rng']['cpu'])
        if config['device'].startswith('cuda') and checkpoint['rng']['cuda'] is not None:
            torch.cuda.set_rng_state(checkpoint['rng']['cuda'])
        # The position in the data means nothing in other data. (Checkpoints of older versions
        # did not save the real path: there it is the path as given.)
        saved_dir = checkpoint['config']['data_dir']
        trained_on = checkpoint['data'].get('data_dir', os.path.realpath(saved_dir))
        if os.path.realpath(config['data_dir']) == trained_on:
            batches.restore(checkpoint['data'])
        else:
            say(f"note: {config['data_dir']} is read from its start")
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:  # edited by hand?
        fail(f"cannot resume from {path}: {e if type(e) is ValueError else repr(e)}")
    say(f"resumed from {path} at step {checkpoint['step']}")


class RunDir:
    """out_dir, as the home of one run. Only rank 0 writes there: on the others every method
    but stop_if_not_finite does nothing."""

    def __init__(self, config, master=True):
        self.config = config
        self.master = master
        self.out_dir = config['out_dir']
        self.ckpt_path = os.path.join(self.out_dir, 'ckpt.pt')
        self.lock = None  # out_dir's lock file, held while this process lives
        self.log_file = None
        self.wandb = None  # a Weights & Biases run, with wandb_log=True
        self.saved_step = None  # the step of the last checkpoint written or resumed from

    def claim(self, model, step):
        """Lock out_dir while this process lives, so that a second run into it is refused, and
        write log.txt anew with the run's record (its settings, the model's size and FLOPs per
        token). A scratch run refuses a run already there unless told to overwrite it; a resumed
        run keeps the records up to its checkpoint."""
        if step:
            self.saved_step = step
        if not self.master:
            return
        if self.config.get('wandb_log'):  # checked before out_dir is touched
            try:
                import wandb  # optional: imported only when asked for
            except ImportError:
                fail("wandb_log=True needs wandb: pip install wandb (or leave wandb_log False)")
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            self.lock = lock(self.out_dir)  # None: another process holds it
        except OSError as e:
            fail(f"cannot write to out_dir {self.out_dir}: {e.strerror}")
        if self.lock is None:
            fail(f"another run is training into {self.out_dir}: wait for it, or choose another "
                 "--out_dir")
        for name in ('ckpt.pt', 'log.txt'):  # half-written by a killed run: useless
            for tmp in glob.glob(os.path.join(glob.escape(self.out_dir), f'{name}.*.tmp')):
                os.remove(tmp)
        log_path = os.path.join(self.out_dir, 'log.txt')
        try:
            with open(log_path, errors='replace') as f:
                records = f.readlines()
        except FileNotFoundError:
            records = []
        except OSError as e:
            fail(f"cannot read {log_path}: {e.strerror}")
        if self.config['init_from'] == 'scratch':
            self.clear_for_scratch(had_log=bool(records))
            records = []
        else:
            records = records_up_to(records, step, self.out_dir)
        header = {'config': self.config, 'params': model.num_params(),
                  'flops_per_token': model.flops_per_token()}
        text = ''.join([json.dumps(header) + '\n'] + records)
        try:  # whole or not at all: on a full disk the old log is kept as it was
            write_atomically(log_path, lambda f: f.write(text.encode()))
            self.log_file = open(log_path, 'ab', buffering=0)  # a record reaches the file at once
        except OSError as e:
            fail(f"could not write {log_path}: {e.strerror}")
        if self.config.get('wandb_log'):
            name = self.config['wandb_run_name'] or default_run_name(self.config)
            about = dict(self.config, params=header['params'],
                         flops_per_token=header['flops_per_token'])
            try:  # offline (WANDB_MODE=offline) it needs no account and no network
                self.wandb = wandb.init(project=self.config['wandb_project'], name=name,
                                        config=about, dir=self.out_dir)  # out_dir/wandb/
            except Exception as e:  # no API key, no network: wandb's own words, on one line
                fail(f"wandb could not start a run: {' '.join(str(e).split())} "
                     "(WANDB_MODE=offline logs without an account)")

    def clear_for_scratch(self, had_log):
        held = []
        if os.path.exists(self.ckpt_path):
            held.append('ckpt.pt')
        if had_log:
            held.append('log.txt')
        if not held:
            return
        if not self.config['overwrite']:
            fail(f"{self.out_dir} holds a run ({', '.join(held)}): continue it with "
                 "--init_from=resume, train into another --out_dir, or replace it with "
                 "--overwrite=True")
        say(f"note: --overwrite=True: replacing the run in {self.out_dir}")
        if 'ckpt.pt' in held:
            os.remove(self.ckpt_path)

    def write(self, record):
        """Add a record (a dict) to log.txt."""
        if self.master:
            line = (json.dumps(record) + '\n').encode()
            try:  # a write may take only part of the line (the disk filling up): the next says why
                while line:
                    line = line[self.log_file.write(line):]
            except OSError as e:  # the records before it are kept; a line cut short is dropped
                fail(f"could not write {self.log_file.name}: {e.strerror}")
            if self.wandb is not None:  # the same record, its step W&B's step
                self.wandb.log({k: v for k, v in record.items() if k != 'step'},
                               step=record['step'])

    def log_eval(self, step, val_loss, val_bpb, mc=None):
        """Print an evaluation's line and record it; mc: (task name, acc, acc_norm) or None."""
        max_iters = self.config['max_iters']
        line = f"step {step}/{max_iters} | val loss {val_loss:.4f}"
        record = {'step': step, 'val_loss': val_loss}
        if val_bpb is not None:
            line += f" | bpb {val_bpb:.4f}"
            record['val_bpb'] = val_bpb
        if mc is not None:
            name, acc, acc_norm = mc
            line += f" | {name} acc {acc:.4f} acc_norm {acc_norm:.4f}"
            record.update(mc_acc=acc, mc_acc_norm=acc_norm)
        say(line)
        self.stop_if_not_finite(val_loss, 'the validation loss', step)
        self.write(record)

    def log_step(self, step, train_loss, grad_norm, lr, seconds_per_step, model):
        """Print a training step's line (speed, MFU on a GPU, time left) and record it."""
        self.stop_if_not_finite(train_loss, 'the training loss', step)
        self.stop_if_not_finite(grad_norm, 'the gradient norm', step)  # the weights come next
        max_iters = self.config['max_iters']
        tokens_per_step = (self.config['batch_size'] * self.config['block_size']
                           * self.config['gradient_accumulation_steps'])
        tokens_per_sec = tokens_per_step / seconds_per_step
        line = (f"step {step}/{max_iters} | loss {train_loss:.4f} | lr {lr:.2e} "
                f"| norm {grad_norm:.3f} | {seconds_per_step * 1000:.1f} ms "
                f"| {tokens_per_sec:,.0f} tok/s")
        if self.config['device'].startswith('cuda'):
            world_size = int(os.environ.get('WORLD_SIZE', 1))
            mfu = model.estimate_mfu(tokens_per_sec / world_size, self.config['peak_flops'])
            line += f" | mfu {mfu:.1%}"
        minutes_left = seconds_per_step * (max_iters - step) / 60
        if minutes_left > 90:
            line += f" | eta {minutes_left / 60:.1f} h"
        else:
            line += f" | eta {minutes_left:.1f} min"
        say(line)
        self.write({'step': step, 'train_loss': train_loss, 'lr': lr, 'grad_norm': grad_norm,
                    'ms_per_step': seconds_per_step * 1000, 'tokens_per_sec': tokens_per_sec})

    def save(self, model, optimizer, batches, step, best_val_loss):
        """Everything a resumed run needs, in one checkpoint, written whole or not at all."""
        if self.master:
            on_cuda = self.config['device'].startswith('cuda')
            rng = {'cpu': torch.get_rng_state(),
                   'cuda': torch.cuda.get_rng_state() if on_cuda else None}
            state = dict(optimizer=optimizer.state_dict(), step=step, rng=rng,
                         best_val_loss=best_val_loss, config=self.config, data=batches.state())
            try:
                write_atomically(self.ckpt_path, lambda f: save_checkpoint(f, model, **state))
            except OSError as e:  # a full disk, say: the previous checkpoint is still whole
                fail(f"could not write {self.ckpt_path}: {e.strerror}")
            say(f"saved checkpoint to {self.ckpt_path}")
        self.saved_step = step

    def stop(self, signum, step):
        """After the checkpoint of step, saved on a Ctrl-C or SIGTERM (Interrupts): one line saying
        how to go on, then the exit code a shell gives that signal (130 for SIGINT, 143 for
        SIGTERM)."""
        if self.master:
            world_size = int(os.environ.get('WORLD_SIZE', 1))
            launcher = f'torchrun --nproc_per_node={world_size}' if world_size > 1 else 'python'
            args = shlex.join([sys.argv[0], f'--out_dir={self.out_dir}', '--init_from=resume'])
            print(f"stopped by {signal.Signals(signum).name} at step {step}, its checkpoint saved "
                  f"to {self.ckpt_path}: resume with {launcher} {args}", file=sys.stderr)
        raise SystemExit(128 + signum)

    def kept(self):
        """What out_dir holds of the run: said when it stops before its end."""
        if self.saved_step is None:
            return "no checkpoint was saved"
        return f"the last checkpoint ({self.ckpt_path}, step {self.saved_step}) is kept"

    def stop_if_not_finite(self, value, what, step):
        """A loss or gradient norm that is inf or nan poisons the weights: stop, and say how to go
        on from the last good checkpoint."""
        if math.isfinite(value):
            return
        if self.saved_step is not None:
            advice = (f"The last good checkpoint ({self.ckpt_path}, step {self.saved_step}) is "
                      "kept: resume from it with --init_from=resume and a lower learning_rate")
        else:
            first = min(self.config['eval_interval'], self.config['max_iters'])
            advice = (f"No checkpoint was saved before it (the first comes at step {first}): "
                      "start again with a lower learning_rate and --overwrite=True")
        fail(f"{what} is {value} at step {step}: stopping. {advice}")


class Interrupts:
    """Ctrl-C (SIGINT), and SIGTERM: what a cluster's scheduler sends a job some time before it
    kills it (SLURM at a time limit or to preempt it). Before the training loop, when there is
    nothing to save, one stops the run at once. From the loop on (after save_first) the first is
    noted in `signal`, so that train.py finishes its step, saves a checkpoint and stops
    (RunDir.stop); a second stops the run at once, the last checkpoint kept whole. Under torchrun
    each process gets a signal twice, from the terminal or the scheduler and from torchrun, which
    forwards it: there a second is ignored (torchrun kills the processes 30 s after its own)."""

    def __init__(self, ddp):
        self.ddp = ddp
        self.run = None  # the RunDir whose checkpoint a first signal saves, from the loop on
        self.signal = 0  # the number of that first signal; 0 while none has come
        self.stopping = False  # the run is stopping at once
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.note)

    def save_first(self, run):
        """From here a first signal lets the step in flight finish and run save a checkpoint."""
        self.run = run

    def note(self, signum, frame):
        if self.run is not None and not self.signal:
            self.signal = signum
        elif not self.stopping and not (self.ddp and self.signal):
            self.stopping = True
            name = signal.Signals(signum).name
            if self.run is None:
                line = f"stopped by {name} before the first step: nothing to save"
            else:
                line = f"stopped at once by a second {name}: {self.run.kept()}"
            if os.environ.get('RANK', '0') in ('', '0'):  # under torchrun, rank 0 only
                os.write(2, f"{line}\n".encode())  # not print: this may be in the middle of one
            raise SystemExit(128 + signum)  # a write under way removes its temporary file


def default_run_name(config):
    """The W&B run's name when wandb_run_name gives none: the router, the shape and out_dir."""
    return f"{config['router']} {config['n_layer']}x{config['n_embd']} {config['out_dir']}"


def records_up_to(records, step, out_dir):
    """The step records of log.txt up to step, the checkpoint's: a record cut short by a kill
    goes too, and so does the old run record (the resumed run writes its own)."""
    kept = []
    for record in records:
        if not record.endswith('\n'):
            continue
        try:
            record_step = json.loads(record).get('step', step + 1)
            if type(record_step) is not int:  # a step train.py did not write: "1", null, 1.5
                raise ValueError(f"a record's step is {record_step!r}")
        except (ValueError, AttributeError) as e:  # edited by hand, or another file
            fail(f"{out_dir}/log.txt is not train.py's log ({e}): move it away to resume")
        if record_step <= step:
            kept.append(record)
    return kept
