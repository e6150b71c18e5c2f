"""
bookkeeping.py: files written whole (lab/ writes its own with it), and a run's safety in its
out_dir: one run there at a time, replaced only when asked, no weights saved that are not finite,
and a stop signal that saves first.
"""
import glob
import json
import math
import os
import shlex
import signal
import sys

import torch

from configurator import fail, or_fail
from lime import save_checkpoint

MASTER = os.environ.get('RANK', '0') == '0'  # the one process that prints and writes (torchrun)


def write_whole(path, write):
    """write(f) fills a temporary file beside path, which then takes path's name in one step: path
    holds the whole new file, or the old one as it was (a full disk, a kill, Ctrl-C)."""
    tmp = f"{path}.{os.getpid()}.tmp"  # made by open(), as any file: with the user's umask
    f = open(tmp, 'wb')
    try:
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
        os.replace(tmp, path)
    except BaseException:
        os.remove(tmp)
        raise


def write_json(path, value):
    """value as a JSON file, written whole (JSON has no nan: such a value raises ValueError)."""
    text = json.dumps(value, indent=1, allow_nan=False) + '\n'
    write_whole(path, lambda f: f.write(text.encode()))


def say(message, file=None):
    if MASTER:  # one process prints: rank 0 under torchrun
        print(message, file=file, flush=True)


class RunDir:
    """out_dir as the home of one run, which rank 0 alone writes: made, it holds out_dir while the
    process lives, begins log.txt with header (the run's record), and catches stop signals."""

    def __init__(self, config, header, checkpoint=None):
        self.config = config
        out_dir = config['out_dir']
        self.ckpt_path = os.path.join(out_dir, 'ckpt.pt')
        self.log_path = os.path.join(out_dir, 'log.txt')
        self.lines = [json.dumps(header) + '\n']  # log.txt's lines
        self.log_file = None  # log.txt, once written with the lines so far
        self.wandb = None
        self.signum = 0  # the stop signal that came; 0 while none has
        world_size = int(os.environ.get('WORLD_SIZE', 1))  # torchrun's processes
        launcher = f'torchrun --nproc_per_node={world_size}' if world_size > 1 else 'python'
        args = [sys.argv[0], f'--out_dir={out_dir}', '--init_from=resume']
        self.resume_command = f"{launcher} {shlex.join(args)}"  # as this run was started
        # The last evaluation's val loss, the best so far, and (step, val loss) of the checkpoint
        self.val_loss = checkpoint['val_loss'] if checkpoint else None
        self.best_val_loss = checkpoint['best_val_loss'] if checkpoint else math.inf
        self.saved = (checkpoint['step'], self.val_loss) if checkpoint else None
        # SIGINT (Ctrl-C), SIGTERM (a scheduler), SIGUSR1 (SLURM: the time is nearly up) and SIGHUP
        # (a lost terminal; nohup ignores it) let the step finish, save and exit: see signalled.
        for name in ('SIGINT', 'SIGTERM', 'SIGUSR1', 'SIGHUP'):
            signum = getattr(signal, name, None)  # Windows has the first two only
            if signum is not None and signal.getsignal(signum) != signal.SIG_IGN:
                signal.signal(signum, self.signalled)
        if not MASTER:
            return
        if config['wandb_log']:  # before out_dir is touched
            try:
                import wandb
            except ImportError:
                fail("wandb_log=True needs wandb: pip install wandb (or leave wandb_log False)")
        or_fail(os.makedirs, out_dir, exist_ok=True)  # a file of that name, say: one line
        self.lock = or_fail(open, os.path.join(out_dir, '.lock'), 'a')
        try:
            if os.name == 'posix':  # Windows has no flock
                import fcntl
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fail(f"another run is training into {out_dir}: wait for it, or choose another "
                 "--out_dir")
        for tmp in glob.glob(os.path.join(glob.escape(out_dir), '*.tmp')):
            os.remove(tmp)  # a write's temporary file, left by a run killed (SIGKILL) in it
        if checkpoint:  # resumed: the records past the checkpoint's step go
            with or_fail(open, self.log_path) as f:  # deleted by hand: one line
                self.lines += [line for line in f.readlines()[1:] if line.endswith('\n')
                               and json.loads(line)['step'] <= self.saved[0]]  # a kill's cut
            self.open_log()
        elif not os.path.exists(self.ckpt_path):
            if os.path.exists(self.log_path):
                say(f"note: {self.log_path} is of a run stopped before its first checkpoint, "
                    "with nothing to resume: this run replaces it")
            self.open_log()
        elif not config['overwrite']:  # else the old run is replaced at the first save
            fail(f"{out_dir} holds a run: continue it with --init_from=resume, train into "
                 "another --out_dir, or replace it with --overwrite=True")
        if config['wandb_log']:
            name = config['wandb_run_name'] or '{router} {n_layer}x{n_embd} {out_dir}'.format(
                **config)
            try:  # offline (WANDB_MODE=offline) it needs no account and no network
                self.wandb = wandb.init(project=config['wandb_project'], name=name,
                                        config=dict(config, **header), dir=out_dir)
            except Exception as e:  # no API key, no network: wandb's own words, on one line
                fail(f"wandb could not start a run: {' '.join(str(e).split())} "
                     "(WANDB_MODE=offline logs without an account)")

    def open_log(self):
        text = ''.join(self.lines).encode()
        write_whole(self.log_path, lambda f: f.write(text))
        self.log_file = open(self.log_path, 'a')

    def write(self, record):
        """Add a record to log.txt (and W&B); a number in it that is not finite stops the run."""
        for key, value in record.items():
            if not math.isfinite(value):
                fail(f"{key} is {value} at step {record['step']}: stopping. {self.advice()}")
        if 'val_loss' in record:  # an evaluation's: the val loss of the next save
            self.val_loss = record['val_loss']
            self.best_val_loss = min(self.best_val_loss, self.val_loss)
        if not MASTER:
            return
        self.lines.append(json.dumps(record) + '\n')
        if self.log_file is not None:
            self.log_file.write(self.lines[-1])
            self.log_file.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if k != 'step'}, step=record['step'])

    def save(self, model, optimizer, batches, step):
        """Save step's checkpoint where the rules let it: never weights that are not finite, and
        with always_save_checkpoint=False only after a better evaluation. Else say why not."""
        # (At an evaluation, weights that are not finite have made its val loss so: write stopped.)
        if any(not torch.isfinite(w).all() for w in model.state_dict().values()):
            return f"its weights are not finite. {self.advice()}"
        if (not self.config['always_save_checkpoint'] and self.saved is not None
                and self.val_loss >= self.saved[1]):
            return (f"with always_save_checkpoint=False only a better evaluation replaces the "
                    f"checkpoint ({self.ckpt_path}, step {self.saved[0]}, val loss "
                    f"{self.saved[1]:.4f}): resume from it with {self.resume_command}")
        if MASTER:
            cuda_rng = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
            state = dict(optimizer=optimizer.state_dict(), step=step, config=self.config,
                         rng={'cpu': torch.get_rng_state(), 'cuda': cuda_rng}, data=batches.state(),
                         val_loss=self.val_loss, best_val_loss=self.best_val_loss)
            try:
                write_whole(self.ckpt_path, lambda f: save_checkpoint(f, model, **state))
                if self.log_file is None:  # an overwrite's first save: the old run goes now
                    self.open_log()
            except (OSError, RuntimeError) as e:  # torch.save's RuntimeError holds the OSError
                error = e.__context__ if isinstance(e, RuntimeError) else e
                fail(f"could not write {self.ckpt_path}: {getattr(error, 'strerror', error)}")
            say(f"saved checkpoint to {self.ckpt_path}")
        self.saved = (step, self.val_loss)
        return None

    def signalled(self, signum, frame):
        """A signal again is the same request (a job script forwarding the scheduler's), but a
        second Ctrl-C stops at once: unless under torchrun, which forwards each signal once more."""
        if not self.signum:
            self.signum = signum
        elif signum == signal.SIGINT and 'RANK' not in os.environ:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a third changes nothing
            kept = (f"the last checkpoint ({self.ckpt_path}, step {self.saved[0]}) is kept"
                    if self.saved else "no checkpoint was saved")
            os.write(2, f"stopped at once by a second SIGINT: {kept}\n".encode())
            raise SystemExit(128 + signum)

    def stop(self, signum, model, optimizer, batches, step):
        """Save step where the rules let it, for a run that signum stops, and say so."""
        unsaved = self.save(model, optimizer, batches, step)
        why = f"not saved: {unsaved}" if unsaved else \
            f"its checkpoint saved to {self.ckpt_path}: resume with {self.resume_command}"
        say(f"stopped by {signal.Signals(signum).name} at step {step}, {why}", file=sys.stderr)

    def advice(self):
        if self.saved is None:
            return "No checkpoint was saved: start again with a lower learning_rate"
        return (f"The last good checkpoint ({self.ckpt_path}, step {self.saved[0]}) is kept: "
                "resume from it with --init_from=resume and a lower learning_rate")
