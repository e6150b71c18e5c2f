"""
bookkeeping.py: what train.py does around the training itself, so that a run survives mistakes:
out_dir holds one run (held by one process from before its checkpoint is read to the end, and no
earlier run replaced unless asked), a resumed run continues with the settings it was started with,
checkpoints are written whole, and a loss that blows up stops the run with the last good checkpoint
kept.

    out_dir/ckpt.pt   the checkpoint (lime.save_checkpoint), with what a resumed run needs
    out_dir/log.txt   a JSON object a line: the run's settings first, then each log line's record
"""
import atexit
import contextlib
import ctypes
import glob
import json
import math
import os
import shlex
import shutil
import signal
import sys
import time
from dataclasses import fields

import torch

from configurator import check_value, fail, or_fail, set_key
from lime import GPTConfig, load_checkpoint, save_checkpoint
from memory_limits import check_memory
from safe_files import file_identity, lock, lock_holder, no_follow, write_atomically

# Settings that belong to the machine a run is on, not to the run: today's, also on a resume.
MACHINE_KEYS = {'out_dir', 'init_from', 'overwrite', 'device', 'dtype', 'compile', 'fused',
                'checkpoint_blocks', 'peak_flops'}
CHECKPOINT_KEYS = ('optimizer', 'step', 'best_val_loss', 'config', 'data', 'rng')
# What to lower where training does not fit: said before it starts, and when a step runs out
LOWER_TO_FIT = ("lower batch_size (more gradient_accumulation_steps keep the step's tokens), "
                "block_size or the model's size, or set checkpoint_blocks=True")


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


def check_training_memory(gptconf, config, built):
    """Stop in one line, before the model is built on its device, where training it cannot fit
    in the memory this process has left there (memory_limits.check_memory names the limit). It
    counts the weights, their gradients and AdamW's two moments, 4 bytes a number each, and a
    floor on what autograd keeps of one micro-batch for the backward pass: per token, 8 numbers
    of n_embd and 4 of mlp_hidden a layer (norms' inputs and outputs, queries, keys, values, the
    attention's output, the MLP's hidden vectors), and 2 of the padded vocabulary (the logits and
    their gradient), 4 bytes each (2 under bfloat16). A training step's measured peak on a CPU
    was 1.1 to 2 times this count (docs/training.md). built: the model is built already
    (resumed), and on a CPU its weights are held already."""
    weights = 4 * gptconf.num_floats()
    tokens = config['batch_size'] * config['block_size']
    per_token = (gptconf.n_layer * (8 * gptconf.n_embd + 4 * gptconf.mlp_hidden)
                 + 2 * gptconf.padded_vocab)
    activations = tokens * per_token * (2 if config['dtype'] == 'bfloat16' else 4)
    held = weights if built and not config['device'].startswith('cuda') else 0
    gib = 2**30
    check_memory(4 * weights + activations - held, config['device'],
                 f"training's weights, gradients and AdamW moments ({4 * weights / gib:,.1f} GiB) "
                 f"and one micro-batch's activations (at least {activations / gib:,.1f} GiB)",
                 LOWER_TO_FIT)


def own(out_dir):
    """Hold out_dir for the rest of this process's life, before anything in it is read: a second
    run into it, resumed or from scratch, is refused in one line naming this process, however slow
    this one is. Rank 0 holds it (the others write nothing there). The lock file, or None where
    out_dir is not made yet (RunDir.claim makes it, and holds it then)."""
    if os.environ.get('RANK', '0') not in ('', '0') or not os.path.isdir(out_dir):
        return None
    try:
        held = lock(out_dir)
    except OSError as e:
        fail(f"cannot write to out_dir {out_dir}: {e.strerror}")
    except ValueError as e:  # its .lock is a link
        fail(str(e))
    if held is None:
        holder = lock_holder(out_dir)
        by = f" (process {holder})" if holder is not None else ""
        fail(f"another run is training into {out_dir}{by}: wait for it, or choose another "
             "--out_dir")
    settle_replaced(out_dir)
    return held


def settle_replaced(out_dir):
    """Finish what a run killed outright (SIGKILL, a power cut) left of an --overwrite=True:
    out_dir/replaced holds the run it was replacing. Without a checkpoint of its own the killed
    run saved nothing, so the replaced run goes back, as put_back would have done; with one, it
    was killed just after saving, and the replaced run goes, as save would have done. Called
    under out_dir's lock, so no live run is in the middle of either."""
    aside = os.path.join(out_dir, 'replaced')
    if not os.path.isdir(aside) or os.path.islink(aside):
        return
    if os.path.exists(os.path.join(out_dir, 'ckpt.pt')):
        shutil.rmtree(aside)
        return
    for name in os.listdir(aside):  # over the killed run's log.txt, where it wrote one
        os.replace(os.path.join(aside, name), os.path.join(out_dir, name))
    os.rmdir(aside)
    say(f"note: {out_dir} holds again the run that a killed --overwrite=True run was replacing")


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
    model, checkpoint = or_fail(load_checkpoint, path, 'cpu')
    if missing := [key for key in CHECKPOINT_KEYS if key not in checkpoint]:
        fail(f"{path} holds no {', '.join(missing)}: not a checkpoint train.py can resume")
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
    """out_dir, as the home of one run. Only rank 0 writes there: on the others the methods keep
    track of the checkpoint (which the processes decide alike) and stop_if_not_finite stops.
    held: out_dir's lock, where own took it already."""

    def __init__(self, config, master=True, measure=None, held=None):
        self.config = config
        self.master = master
        self.measure = measure  # how the run's val losses are measured (train.py's val_measure)
        self.out_dir = config['out_dir']
        self.ckpt_path = os.path.join(self.out_dir, 'ckpt.pt')
        self.lock = held  # out_dir's lock file, held while this process lives
        self.seen = None  # ckpt.pt as this run last wrote or read it (file_identity); None: none
        self.log_file = None
        self.wandb = None  # a Weights & Biases run, with wandb_log=True
        self.saved_step = None  # the step of the checkpoint in out_dir, written or resumed from
        self.saved_loss = None  # its val loss: its last evaluation's, as it records
        self.evaluated = None  # the run's last evaluation: (step, val loss)
        self.best_val_loss = float('inf')  # the least val loss of the run's evaluations
        self.unsaved = None  # why the last save kept the checkpoint there: RunDir.stop says it
        self.replaced = []  # the files of the run that --overwrite=True replaces, moved aside

    def claim(self, model, checkpoint=None):
        """Hold out_dir while this process lives (own), where not held already, and write log.txt
        anew with the run's record (its settings, the model's size and FLOPs per token). A scratch
        run refuses a run already there unless told to overwrite it; a resumed run (checkpoint:
        the one resumed from) keeps the records up to its checkpoint."""
        step = 0
        if checkpoint is not None:
            step = self.saved_step = checkpoint['step']
            # Checkpoints of older versions record only the best evaluation, as theirs
            self.saved_loss = checkpoint.get('val_loss', checkpoint['best_val_loss'])
            self.evaluated = (checkpoint.get('val_step', step), self.saved_loss)
            self.best_val_loss = checkpoint['best_val_loss']
        if not self.master:
            return
        if self.config.get('wandb_log'):  # checked before out_dir is touched
            try:
                import wandb  # optional: imported only when asked for
            except ImportError:
                fail("wandb_log=True needs wandb: pip install wandb (or leave wandb_log False)")
        if self.lock is None:
            try:
                os.makedirs(self.out_dir, exist_ok=True)
            except OSError as e:
                fail(f"cannot write to out_dir {self.out_dir}: {e.strerror}")
            self.lock = own(self.out_dir)
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
        if os.path.exists(self.ckpt_path):  # resumed from, under the lock: as it was read
            self.seen = file_identity(self.ckpt_path)
        header = {'config': self.config, 'params': model.num_params(),
                  'flops_per_token': model.flops_per_token()}
        text = ''.join([json.dumps(header) + '\n'] + records)
        try:  # whole or not at all: on a full disk the old log is kept as it was
            write_atomically(log_path, lambda f: f.write(text.encode()))
            # A record reaches the file at once; a link put in its place meanwhile is not followed
            self.log_file = open(log_path, 'ab', buffering=0, opener=no_follow)
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
        """Refuse a run already in out_dir, or with --overwrite=True move it aside, to
        out_dir/replaced, until this run saves its first checkpoint: a run that fails before then
        (an error, a loss that blows up, a stop signal) leaves the old one as it was (put_back)."""
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
        aside = os.path.join(self.out_dir, 'replaced')
        try:
            os.mkdir(aside)
        except FileExistsError:  # not settled by own(): a link, or made by hand
            fail(f"{aside} is in the way of --overwrite=True, which moves the run there: move "
                 "it elsewhere or delete it, then run this again")
        for name in held:
            os.replace(os.path.join(self.out_dir, name), os.path.join(aside, name))
        self.replaced = held
        atexit.register(self.put_back)
        say(f"note: --overwrite=True: the run in {self.out_dir} is moved to {aside} and deleted "
            "when this run saves its first checkpoint")

    def put_back(self):
        """At exit, if this run saved no checkpoint: the run it was to replace, back as it was."""
        if not self.replaced:
            return
        aside = os.path.join(self.out_dir, 'replaced')
        if 'log.txt' not in self.replaced:  # this run's log would sit beside the old checkpoint
            with contextlib.suppress(FileNotFoundError):  # (unless it failed before writing one)
                os.remove(os.path.join(self.out_dir, 'log.txt'))
        for name in self.replaced:
            os.replace(os.path.join(aside, name), os.path.join(self.out_dir, name))
        os.rmdir(aside)
        say(f"note: {self.out_dir} holds the run it held before, as it was")

    def write(self, record):
        """Add a record (a dict) to log.txt."""
        if self.master:
            try:  # JSON has no nan or inf (the losses that could be are checked before it)
                line = (json.dumps(record, allow_nan=False) + '\n').encode()
            except ValueError:
                fail(f"a record of step {record['step']} holds a number that is not finite: "
                     f"{record}")
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
        self.evaluated = (step, val_loss)  # step 0's too: a checkpoint saved before the next
        self.best_val_loss = min(self.best_val_loss, val_loss)

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

    def save(self, model, optimizer, batches, step, signum=0):
        """The checkpoint of step, after an evaluation or on the stop signal signum, by the one
        rule on ckpt.pt: only finite weights replace it, and with always_save_checkpoint=False
        only after an evaluation better than its own. It holds everything a resumed run needs and
        the val loss of the run's last evaluation (at an evaluation, that of its own weights), and
        is written whole or not at all. Weights that are not finite stop the run at an evaluation;
        on a stop, self.unsaved says why the checkpoint was kept, for stop's line."""
        bad = [name for name, w in model.state_dict().items() if not torch.isfinite(w).all()]
        if bad:
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            where = f"nan or inf in {bad[0]}{more}"
            why = f"its weights are not finite ({where})"
            if not signum:
                fail(f"{why} at step {step}: stopping. {self.advice()}")
            self.unsaved = f"{why}. {self.advice()}"
            return
        if (why := self.no_better()) is not None:
            self.unsaved = f"{why}: resume from it with {self.resume_command()}"
            return
        self.unsaved = None
        if self.master:
            on_cuda = self.config['device'].startswith('cuda')
            rng = {'cpu': torch.get_rng_state(),
                   'cuda': torch.cuda.get_rng_state() if on_cuda else None}
            val_step, val_loss = self.evaluated
            state = dict(optimizer=optimizer.state_dict(), step=step, rng=rng, val_loss=val_loss,
                         val_step=val_step, val_measure=self.measure,
                         best_val_loss=self.best_val_loss, config=self.config, data=batches.state())
            if (theirs := self.later_step_on_disk(step)) is not None:
                fail(f"{self.ckpt_path} holds step {theirs}, past this run's {step}: another run "
                     "saved it there since this one read it, and it is kept (this run stops "
                     "unsaved)")
            try:
                write_atomically(self.ckpt_path, lambda f: save_checkpoint(f, model, **state))
                self.seen = file_identity(self.ckpt_path)
            except OSError as e:  # a full disk, say: the previous checkpoint is still whole
                fail(f"could not write {self.ckpt_path}: {e.strerror}")
            say(f"saved checkpoint to {self.ckpt_path}")
            if self.replaced:  # this run has a checkpoint of its own: the one it replaces goes
                shutil.rmtree(os.path.join(self.out_dir, 'replaced'))
                self.replaced = []
        self.saved_step, self.saved_loss = step, self.evaluated[1]

    def measured_otherwise(self, checkpoint):
        """Whether, with always_save_checkpoint=False, the checkpoint resumed from has a val loss
        measured otherwise than this run's evaluations (eval_iters, batch_size, block_size or the
        validation data changed; older checkpoints do not say): losses over other batches do not
        compare, so its weights are to be measured again (remeasured) before any evaluation may
        replace it."""
        return (checkpoint is not None and not self.config['always_save_checkpoint']
                and checkpoint.get('val_measure') != self.measure)

    def remeasured(self, val_loss):
        """val_loss: the checkpoint's weights, evaluated as this run evaluates: the loss to beat."""
        say(f"note: the checkpoint's val loss ({self.saved_loss:.4f}) was measured on other "
            f"validation batches than this run's: on these its weights score {val_loss:.4f}, "
            "which an evaluation must beat to replace it")
        self.saved_loss = self.best_val_loss = val_loss
        self.evaluated = (self.saved_step, val_loss)

    def later_step_on_disk(self, step):
        """The step of out_dir's checkpoint where it is not the one this run last wrote or read and
        its step is past step: a second run saved it (one no lock kept out, as on a filesystem
        without locks), and replacing it would lose that run's steps. Else None."""
        try:
            if file_identity(self.ckpt_path) == self.seen:
                return None
            _, theirs = load_checkpoint(self.ckpt_path, 'cpu')
        except (OSError, ValueError):  # gone, or no checkpoint: it holds no step to keep
            return None
        return theirs['step'] if theirs['step'] > step else None

    def no_better(self):
        """With always_save_checkpoint=False and a checkpoint in out_dir, why the run's last
        evaluation may not replace it (it is not better than the checkpoint's own); else None."""
        if self.config['always_save_checkpoint'] or self.saved_step is None:
            return None
        val_step, val_loss = self.evaluated
        if val_loss < self.saved_loss:
            return None
        if val_step == self.saved_step:
            since = "no evaluation since its own"
        else:
            since = f"the last evaluation (step {val_step}, val loss {val_loss:.4f}) is no better"
        return (f"with always_save_checkpoint=False only a better evaluation replaces the "
                f"checkpoint ({self.ckpt_path}, step {self.saved_step}, val loss "
                f"{self.saved_loss:.4f}), and {since}")

    def stop(self, signum, step):
        """After the step in flight of a stop signal (Interrupts) and its save: one line saying
        what out_dir holds and how to go on, then the exit code a shell gives that signal (129 for
        SIGHUP, 130 for SIGINT, 138 for SIGUSR1, 143 for SIGTERM)."""
        if self.master:
            stopped = f"stopped by {signal.Signals(signum).name} at step {step}"
            if self.unsaved is None:
                print(f"{stopped}, its checkpoint saved to {self.ckpt_path}: resume with "
                      f"{self.resume_command()}", file=sys.stderr)
            else:
                print(f"{stopped}, not saved: {self.unsaved}", file=sys.stderr)
        raise SystemExit(128 + signum)

    def resume_command(self):
        """The command that resumes this run, as it was started: with python, or torchrun."""
        world_size = int(os.environ.get('WORLD_SIZE', 1))
        launcher = f'torchrun --nproc_per_node={world_size}' if world_size > 1 else 'python'
        args = shlex.join([sys.argv[0], f'--out_dir={self.out_dir}', '--init_from=resume'])
        return f"{launcher} {args}"

    def kept(self):
        """What out_dir holds of the run: said when it stops before its end."""
        if self.saved_step is None and self.config['init_from'] == 'resume':  # before claim
            return f"the checkpoint it resumed from ({self.ckpt_path}) is kept"
        if self.saved_step is None:
            return "no checkpoint was saved"
        return f"the last checkpoint ({self.ckpt_path}, step {self.saved_step}) is kept"

    def stop_if_not_finite(self, value, what, step):
        """A loss or gradient norm that is inf or nan poisons the weights: stop, and say how to go
        on from the last good checkpoint."""
        if not math.isfinite(value):
            fail(f"{what} is {value} at step {step}: stopping. {self.advice()}")

    def advice(self):
        """How to go on after the weights went bad: from the last good checkpoint, if there is
        one (no checkpoint of weights that are not finite is ever saved)."""
        if self.saved_step is not None:
            return (f"The last good checkpoint ({self.ckpt_path}, step {self.saved_step}) is kept: "
                    "resume from it with --init_from=resume and a lower learning_rate")
        first = min(self.config['eval_interval'], self.config['max_iters'])
        return (f"No checkpoint was saved before it (the first comes at step {first}): start "
                "again with a lower learning_rate and --overwrite=True")


class Interrupts:
    """What stops a run from outside: Ctrl-C (SIGINT); SIGTERM, what a cluster's scheduler sends a
    job some time before it kills it (SLURM at a time limit or to preempt it); SIGUSR1, SLURM's
    warning that the time is nearly up (sbatch --signal=USR1@90); SIGHUP, a terminal that is gone
    (a lost ssh session), unless ignored (nohup). Before the training loop, when there is nothing
    to save, one stops the run at once. From the loop on (after save_first) the first is noted in
    `signal`, so that train.py finishes its step, saves a checkpoint as RunDir.save's rule allows
    and stops (RunDir.stop); a second stops the run at once, the last checkpoint kept whole.
    The same signal again within SAME_REQUEST seconds is the same request, not a second: a job
    script that forwards SIGTERM to train.py (trap 'kill -TERM $child' TERM) while the scheduler
    signals the whole process group delivers it twice. Under torchrun each process gets a signal
    twice, from the terminal or the scheduler and from torchrun, which forwards it: there any
    second is ignored (torchrun kills the processes 30 s after its own). An output that closes
    stops nothing (Output)."""
    SAME_REQUEST = 1.0  # seconds; a person's second Ctrl-C takes longer, a forwarded copy less

    def __init__(self, ddp):
        self.ddp = ddp
        self.run = None  # the RunDir whose checkpoint a first signal saves, from the loop on
        self.signal = 0  # the number of that first signal; 0 while none has come
        self.last = (0, -math.inf)  # the last signal to come and when (time.monotonic)
        self.stopping = False  # the run is stopping at once
        for signum in stop_signals():
            signal.signal(signum, self.note)
        sys.stdout, sys.stderr = Output.of(sys.stdout), Output.of(sys.stderr)

    def save_first(self, run):
        """From here a first signal lets the step in flight finish and run save a checkpoint."""
        self.run = run

    def note(self, signum, frame):
        now = time.monotonic()
        again = self.last[0] == signum and now - self.last[1] < self.SAME_REQUEST
        self.last = (signum, now)
        if self.run is not None and not self.signal:
            self.signal = signum
        elif not self.stopping and not again and not (self.ddp and self.signal):
            self.stopping = True
            name = signal.Signals(signum).name
            if self.run is None:
                line = f"stopped by {name} before the first step: nothing to save"
            else:
                line = f"stopped at once by a second {name}: {self.run.kept()}"
            if os.environ.get('RANK', '0') in ('', '0'):  # under torchrun, rank 0 only
                try:  # not print: this may be in the middle of one
                    os.write(2, f"{line}\n".encode())
                except OSError:  # stderr's reader is gone: the line has no one to read it
                    pass
            raise SystemExit(128 + signum)  # a write under way removes its temporary file


def stop_signals():
    """The signals that stop a run with a save: SIGINT, SIGTERM and (not on Windows) SIGUSR1 and
    SIGHUP, unless this process was started to ignore them (nohup), as it then goes on doing.
    SIGUSR1 stops as SIGTERM does rather than save and train on: it comes a set time before the
    job's end, and a run that stops then, saved, can be requeued or resumed (RunDir.stop's line),
    where one that trains on loses its steps since to the kill, or is killed while it saves."""
    signums = [signal.SIGINT, signal.SIGTERM]
    for name in ('SIGUSR1', 'SIGHUP'):
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) != signal.SIG_IGN:
            signums.append(signum)
    return signums


class Output:
    """sys.stdout or sys.stderr of a run, which outlives its reader. Where a write fails (EPIPE: a
    pipe whose reader has exited, such as a `| tee` stopped by the same Ctrl-C, or a `| head`
    that has its lines; EIO: a terminal that is gone) Python would raise in the middle of a step;
    here the stream goes to os.devnull from then on, and the run goes on, log.txt getting every
    record."""

    def __init__(self, stream):
        self.stream = stream

    @classmethod
    def of(cls, stream):
        """stream, as an Output (None, a closed descriptor at start, stays None: print skips)."""
        return stream if stream is None or isinstance(stream, cls) else cls(stream)

    def write(self, text):
        try:
            return self.stream.write(text)
        except OSError:
            self.to_devnull()
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except OSError:
            self.to_devnull()

    def to_devnull(self):
        """Point the stream's file descriptor at os.devnull: what it still buffers goes there."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)
        self.stream.flush()

    def __getattr__(self, name):  # the rest (fileno, isatty, encoding, ...) is the stream's
        return getattr(self.stream, name)


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
