"""
bookkeeping.py: a run's safety, in the standard library's idioms. train.py calls it; prepare.py
and lab/ write their files whole with it.

- A file is written whole (write_whole): a temporary file beside it, synced, then os.replace.
- One run trains in an out_dir at a time (RunDir.claim): fcntl.flock on out_dir/.lock, held
  while the process lives (Windows has no fcntl: there, keep to one run per out_dir by hand).
- A finished or stopped run is replaced only with --overwrite=True, and its ckpt.pt and log.txt
  stay as they were until the new run's first save.
- No checkpoint holds weights that are not finite; a loss that is not stops the run.
- A stop signal (Stop) lets the step finish, saves, and exits with 128 + its number.

    out_dir/ckpt.pt   the checkpoint (lime.save_checkpoint), with what a resumed run needs
    out_dir/log.txt   a JSON object a line: the run's settings first, then each log line's record
"""
import glob
import json
import math
import os
import shlex
import signal
import sys
import tempfile

import torch

from configurator import fail
from lime import save_checkpoint

try:
    import fcntl  # POSIX file locks
except ImportError:  # Windows
    fcntl = None


def write_whole(path, write):
    """write(f) fills a new temporary file beside path, which then takes path's name in one step:
    path holds the whole new file, or the old one as it was (a full disk, a kill, Ctrl-C)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=os.path.basename(path) + '.', suffix='.tmp')
    try:
        with open(fd, 'wb') as f:
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


def say(message):
    """print, on one process only (rank 0 under torchrun)."""
    if os.environ.get('RANK', '0') == '0':
        print(message, flush=True)


class Stop:
    """The stop signals: SIGINT (Ctrl-C), SIGTERM (a scheduler, before it kills a job), SIGUSR1
    (SLURM's warning that the time is nearly up) and SIGHUP (a lost terminal; not under nohup,
    which ignores it). The first is noted in `signum`: train.py finishes the step, saves and
    exits. The same signal again is the same request (a job script forwarding it while the
    scheduler signals the whole group); a second Ctrl-C stops at once, the last checkpoint whole
    (a save under way removes its temporary). Under torchrun, which forwards every signal to each
    process once more, a second is ignored."""

    def __init__(self, ddp, kept):
        self.ddp = ddp
        self.kept = kept  # says what out_dir holds, for the line of a stop at once
        self.signum = 0
        self.at_once = False
        for name in ('SIGINT', 'SIGTERM', 'SIGUSR1', 'SIGHUP'):  # Windows: the first two only
            signum = getattr(signal, name, None)
            if signum is not None and signal.getsignal(signum) != signal.SIG_IGN:
                signal.signal(signum, self.note)

    def note(self, signum, frame):
        if not self.signum:
            self.signum = signum
        elif signum == signal.SIGINT and not self.ddp and not self.at_once:
            self.at_once = True  # stopping: what comes from now on changes nothing
            line = f"stopped at once by a second SIGINT: {self.kept()}\n"
            os.write(2, line.encode())  # not print: this may be in the middle of one
            raise SystemExit(128 + signum)


class RunDir:
    """out_dir as the home of one run: its log.txt and ckpt.pt. Only rank 0 writes; the others
    follow the same rules, so that every process decides alike."""

    def __init__(self, config, master, checkpoint=None):
        self.config = config
        self.master = master
        self.out_dir = config['out_dir']
        self.ckpt_path = os.path.join(self.out_dir, 'ckpt.pt')
        self.log_path = os.path.join(self.out_dir, 'log.txt')
        self.lines = []  # log.txt's lines until it is written (an overwrite: at the first save)
        self.log_file = None
        self.wandb = None
        self.saved = None  # (step, val loss) of the checkpoint in out_dir; None: none yet
        self.evaluated = None  # (step, val loss) of the run's last evaluation
        self.best_val_loss = math.inf
        if checkpoint is not None:
            self.evaluated = (checkpoint['val_step'], checkpoint['val_loss'])
            self.saved = (checkpoint['step'], checkpoint['val_loss'])
            self.best_val_loss = checkpoint['best_val_loss']

    def claim(self, header):
        """Hold out_dir while this process lives, and begin log.txt with header (the run's
        record). A new run refuses a run already there unless overwrite is set; a resumed one
        keeps log.txt's records up to its checkpoint's step."""
        if not self.master:
            return
        if self.config['wandb_log']:  # before out_dir is touched
            try:
                import wandb  # optional: imported only when asked for
            except ImportError:
                fail("wandb_log=True needs wandb: pip install wandb (or leave wandb_log False)")
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            self.lock = open(os.path.join(self.out_dir, '.lock'), 'a')
        except OSError as e:
            fail(f"cannot write to out_dir {self.out_dir}: {e.strerror}")
        if fcntl is not None:
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fail(f"another run is training into {self.out_dir}: wait for it, or choose "
                     "another --out_dir")
        for tmp in glob.glob(os.path.join(glob.escape(self.out_dir), '*.tmp')):
            os.remove(tmp)  # a write's temporary file, left by a run killed (SIGKILL) in it
        records = []
        held = [name for name in ('ckpt.pt', 'log.txt')
                if os.path.exists(os.path.join(self.out_dir, name))]
        if self.config['init_from'] == 'resume':
            with open(self.log_path, errors='replace') as f:
                records = [line for line in f.readlines()[1:] if line.endswith('\n')
                           and json.loads(line)['step'] <= self.saved[0]]  # a kill's cut line
        elif held and not self.config['overwrite']:
            fail(f"{self.out_dir} holds a run ({', '.join(held)}): continue it with "
                 "--init_from=resume, train into another --out_dir, or replace it with "
                 "--overwrite=True")
        self.lines = [json.dumps(header) + '\n', *records]
        if not held or self.config['init_from'] == 'resume':
            self.open_log()
        if self.config['wandb_log']:
            name = self.config['wandb_run_name'] or (f"{self.config['router']} "
                                                     f"{self.config['n_layer']}x"
                                                     f"{self.config['n_embd']} {self.out_dir}")
            try:  # offline (WANDB_MODE=offline) it needs no account and no network
                self.wandb = wandb.init(project=self.config['wandb_project'], name=name,
                                        config=dict(self.config, **header), dir=self.out_dir)
            except Exception as e:  # no API key, no network: wandb's own words, on one line
                fail(f"wandb could not start a run: {' '.join(str(e).split())} "
                     "(WANDB_MODE=offline logs without an account)")

    def open_log(self):
        """Write log.txt whole with the lines so far; from now on each record is added to it."""
        text = ''.join(self.lines).encode()
        write_whole(self.log_path, lambda f: f.write(text))
        self.log_file = open(self.log_path, 'a')

    def write(self, record):
        """Add a record (a dict, its numbers finite) to log.txt, and to W&B where it logs."""
        if not self.master:
            return
        line = json.dumps(record) + '\n'
        if self.log_file is None:
            self.lines.append(line)
        else:
            self.log_file.write(line)
            self.log_file.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if k != 'step'}, step=record['step'])

    def evaluated_at(self, step, val_loss):
        """Note an evaluation; one that is not finite stops the run."""
        self.check_finite(val_loss, 'the validation loss', step)
        self.evaluated = (step, val_loss)
        self.best_val_loss = min(self.best_val_loss, val_loss)

    def check_finite(self, value, what, step):
        if not math.isfinite(value):
            fail(f"{what} is {value} at step {step}: stopping. {self.advice()}")

    def save(self, model, optimizer, batches, step, stopping=False):
        """Save the checkpoint of step, whole, where the rules let it: weights that are not finite
        never (at an evaluation the run stops; on a stop, why is returned), and with
        always_save_checkpoint=False only after an evaluation better than the saved one's.
        Returns None where it saved, else why not."""
        if any(not torch.isfinite(w).all() for w in model.state_dict().values()):
            if not stopping:
                fail(f"its weights are not finite at step {step}: stopping. {self.advice()}")
            return f"its weights are not finite. {self.advice()}"
        val_step, val_loss = self.evaluated
        if (not self.config['always_save_checkpoint'] and self.saved is not None
                and val_loss >= self.saved[1]):
            return (f"with always_save_checkpoint=False only a better evaluation replaces the "
                    f"checkpoint ({self.ckpt_path}, step {self.saved[0]}, val loss "
                    f"{self.saved[1]:.4f}): resume from it with {self.resume_command()}")
        if self.master:
            rng = {'cpu': torch.get_rng_state(),
                   'cuda': torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None}
            state = dict(optimizer=optimizer.state_dict(), step=step, rng=rng, val_loss=val_loss,
                         val_step=val_step, best_val_loss=self.best_val_loss, config=self.config,
                         data=batches.state())
            try:
                write_whole(self.ckpt_path, lambda f: save_checkpoint(f, model, **state))
                if self.log_file is None:  # an overwrite's first save: the old run goes now
                    self.open_log()
            except (OSError, RuntimeError) as e:  # torch.save's RuntimeError holds the OSError
                error = e.__context__ if isinstance(e, RuntimeError) else e
                fail(f"could not write {self.ckpt_path}: {getattr(error, 'strerror', error)}")
            say(f"saved checkpoint to {self.ckpt_path}")
        self.saved = (step, val_loss)
        return None

    def stop(self, signum, step, unsaved):
        """The line of a run stopped by signum after step, then the exit code a shell gives it."""
        stopped = f"stopped by {signal.Signals(signum).name} at step {step}"
        if unsaved is None:
            line = (f"{stopped}, its checkpoint saved to {self.ckpt_path}: resume with "
                    f"{self.resume_command()}")
        else:
            line = f"{stopped}, not saved: {unsaved}"
        if self.master:
            print(line, file=sys.stderr)
        raise SystemExit(128 + signum)

    def resume_command(self):
        """The command that resumes this run, as it was started: with python, or torchrun."""
        world_size = int(os.environ.get('WORLD_SIZE', 1))
        launcher = f'torchrun --nproc_per_node={world_size}' if world_size > 1 else 'python'
        return f"{launcher} {shlex.join([sys.argv[0], f'--out_dir={self.out_dir}'])} " \
               "--init_from=resume"

    def kept(self):
        if self.saved is None:
            return "no checkpoint was saved"
        return f"the last checkpoint ({self.ckpt_path}, step {self.saved[0]}) is kept"

    def advice(self):
        """How to go on after the weights went bad: from the last good checkpoint, if any."""
        if self.saved is not None:
            return (f"The last good checkpoint ({self.ckpt_path}, step {self.saved[0]}) is kept: "
                    "resume from it with --init_from=resume and a lower learning_rate")
        return "No checkpoint was saved: start again with a lower learning_rate"
