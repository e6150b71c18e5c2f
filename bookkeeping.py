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
import sys
from dataclasses import fields

import torch

from configurator import check_value, fail, or_fail, set_key
from lime import GPTConfig, load_checkpoint, save_checkpoint

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
    note); what belongs to this machine (MACHINE_KEYS) is today's. (None, None) for a new run.
    kinds: configure's, to check the saved values as a --key=value is."""
    if config['init_from'] != 'resume':
        return None, None
    path = os.path.join(config['out_dir'], 'ckpt.pt')
    # To the CPU: train.py moves the model to its device (under torchrun, known only later).
    model, checkpoint = or_fail(load_checkpoint, path, 'cpu', CHECKPOINT_KEYS)
    saved = checkpoint['config']
    # The schedule's length is kept (checkpoints of older versions saved 0 for "max_iters").
    saved['lr_decay_iters'] = saved.get('lr_decay_iters') or saved.get('max_iters', 0)
    model_defaults = {f.name: f.default for f in fields(GPTConfig)}  # keys older runs lacked
    for key in sorted(given - MACHINE_KEYS):
        old = saved.get(key, model_defaults.get(key))
        if config[key] == old:
            continue
        if key in model_defaults:
            fail(f"--{key}={config[key]} contradicts the checkpoint's {old!r}")
        if key in saved:
            say(f"note: resuming with {key}={config[key]!r}, changed from the checkpoint's {old!r}")
    kind_of = {key: kind for kind, keys in kinds.items() for key in keys}
    for key in saved:
        if key in config and key not in MACHINE_KEYS and key not in given:
            # Checked as a --key=value is: edited by hand, it would fail later, in a traceback
            set_key(config, key, saved[key], f"{path}: its saved setting")
            check_value(key, config[key], kind_of.get(key), f"{path}: its saved ")
    return model, checkpoint


def restore_state(checkpoint, optimizer, batches, config):
    """Put the optimizer, the random generators and the data position back as they were saved."""
    path = os.path.join(config['out_dir'], 'ckpt.pt')
    try:
        optimizer.load_state_dict(checkpoint['optimizer'])
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
        self.log_file = None
        self.wandb = None  # a Weights & Biases run, with wandb_log=True
        self.saved_step = None  # the step of the last checkpoint written or resumed from

    def claim(self, model, step):
        """Open log.txt with the run's record (its settings, the model's size and FLOPs per
        token), locked while this process lives so that a second run into out_dir is refused. A
        scratch run refuses a run already there unless told to overwrite it; a resumed run drops
        the records written after its checkpoint."""
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
            log_file = open(os.path.join(self.out_dir, 'log.txt'), 'a+', errors='replace')
        except OSError as e:
            fail(f"cannot write to out_dir {self.out_dir}: {e.strerror}")
        lock(log_file, self.out_dir)
        for name in glob.glob(os.path.join(glob.escape(self.out_dir), 'ckpt.pt.*.tmp')):
            os.remove(name)  # a checkpoint half-written by a killed run: useless
        log_file.seek(0)
        records = log_file.readlines()
        if self.config['init_from'] == 'scratch':
            self.clear_for_scratch(had_log=bool(records))
            records = []
        else:
            records = records_up_to(records, step, self.out_dir)
        log_file.truncate(0)  # in append mode every write goes to the end, here the start
        header = {'config': self.config, 'params': model.num_params(),
                  'flops_per_token': model.flops_per_token()}
        log_file.writelines([json.dumps(header) + '\n'] + records)
        log_file.flush()
        self.log_file = log_file
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
            print(json.dumps(record), file=self.log_file, flush=True)
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
            try:
                save_checkpoint(self.ckpt_path, model, optimizer=optimizer.state_dict(), step=step,
                                rng=rng, best_val_loss=best_val_loss, config=self.config,
                                data=batches.state())
            except OSError as e:  # a full disk, say: the previous checkpoint is still whole
                fail(f"could not write {self.ckpt_path}: {e.strerror or e}")
            say(f"saved checkpoint to {self.ckpt_path}")
        self.saved_step = step

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


def default_run_name(config):
    """The W&B run's name when wandb_run_name gives none: the router, the shape and out_dir."""
    return f"{config['router']} {config['n_layer']}x{config['n_embd']} {config['out_dir']}"


def lock(log_file, out_dir):
    """Hold an exclusive lock on log_file while this process lives; stop if another run has it."""
    try:
        import fcntl  # POSIX file locks; Windows has none: keep to one run per out_dir by hand
    except ImportError:
        return
    try:
        fcntl.flock(log_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fail(f"another run is training into {out_dir}: wait for it, or choose another --out_dir")


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
