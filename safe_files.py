"""
safe_files.py: how the scripts keep what they write safe on disk, in one place. prepare.py writes
data sets with it, bookkeeping.py a run's checkpoints and log, lab/ its results and figures.

- Written whole: every file takes its name only when whole (write_atomically), from a temporary
  file beside it that this process has just created, under a name nobody can know beforehand.
- Never through a link: no file is written through a symbolic link this process did not make. A
  temporary's name is new and opened exclusively; a lock file or a log that is a link is refused.
- One writer: a directory is held by one process at a time through its file .lock (lock), for as
  long as that process keeps it open; the system frees it when the process ends, however it ends.
- Finished or not: a data set is written between two versions of its dataset.json (the marker),
  {"finished": false} first and {"finished": true, ...} after every shard (writing_data_set), so
  that a reader never takes half a set for one (check_finished).
"""
import json
import os
import secrets
import struct
import sys
from contextlib import contextmanager

try:
    import fcntl  # POSIX file locks
except ImportError:  # Windows: none (keep to one writer per directory by hand)
    fcntl = None

MARKER = "dataset.json"
# Opens that refuse a symbolic link as the last part of the path (ELOOP). Windows has no such flag:
# there links are followed (making one takes an administrator or developer mode).
NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation under os.open


def no_follow(path, flags):
    """An opener for open(): path opened as open() asks, unless it is a symbolic link."""
    return os.open(path, flags | NO_FOLLOW | BINARY, 0o666)


def file_identity(path):
    """What tells a file from one renamed over it (its inode) or rewritten (size, mtime)."""
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


# -----------------------------------------------------------------------------
# files written whole


def write_atomically(path, write):
    """Write a file whole or not at all: write(f) fills a temporary file of this process's own,
    which then replaces path in one step. On any failure (a full disk, a file-size limit, Ctrl-C)
    the temporary goes and path is as it was; an OSError names path."""
    # Beside path, so that the rename stays within one filesystem. The name is random, never this
    # process's id (which anyone can read in ps): a link planted under a name known beforehand
    # would have the write go wherever it points. O_EXCL fails on any file of that name, link or
    # not, rather than write into it.
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"
    made = False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NO_FOLLOW | BINARY, 0o666)
        made = True
        with open(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the bytes must be on disk before the rename makes them visible
        os.replace(tmp, path)  # atomic: readers see no file, or the old one, or the whole new one
    except BaseException as e:
        if made:
            os.remove(tmp)
        # torch.save reports a failed write as a RuntimeError of its own, the failure its context
        if isinstance(e, RuntimeError) and isinstance(e.__context__, (OSError, KeyboardInterrupt,
                                                                      SystemExit)):
            e = e.__context__
        if isinstance(e, OSError) and e.errno is not None:  # named by path, not its temporary
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise e


def write_json(path, value):
    """value as a JSON file, written whole (write_atomically). Raises ValueError, naming the file,
    for a number that is not finite: JSON has none, and a file holding NaN is not JSON."""
    try:
        text = json.dumps(value, indent=1, allow_nan=False) + "\n"
    except ValueError:
        raise ValueError(f"{path}: not written: a value is not a finite number") from None
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))


# -----------------------------------------------------------------------------
# one writer per directory


def lock(directory, shared=False, wait=False):
    """Lock directory, through its file .lock, for as long as the file returned stays open and
    this process lives: one writer, or (shared) readers. None where another process holds it;
    without wait this never blocks. A POSIX record lock: unlike flock's, it does not pass to the
    processes this one forks (prepare.py's tokenizers), which could outlive it; and the system
    drops it when its process ends, so a lock of a process that died blocks nothing. Where the
    system has no locks (Windows, a network filesystem without them), the file comes back
    unlocked: keep to one writer at a time by hand there. Raises ValueError where .lock is a
    symbolic link: opening it would create or lock the file it names instead."""
    path = os.path.join(directory, ".lock")
    try:
        f = open(path, "rb" if shared else "ab", opener=no_follow)
    except OSError:
        if os.path.islink(path):
            raise ValueError(f"{path} is a symbolic link, which a lock file never is: not "
                             "followed (remove it)") from None
        raise
    try:
        if fcntl is not None:
            kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
            fcntl.lockf(f, kind if wait else kind | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: another process holds it
        f.close()
        return None
    except OSError:  # no locks on this filesystem
        pass
    return f


def lock_holder(directory):
    """The id of the process that holds directory's lock, as the system says (F_GETLK), or None:
    free by now, or where the system's answer is not read (its layout, struct flock, is Linux's
    here: short type, short whence, off_t start, off_t length, pid_t pid)."""
    if fcntl is None or sys.platform != "linux":
        return None
    layout = "hhqqi"
    # Asked only by a process that does not hold the lock: closing any file of it drops all of a
    # process's POSIX locks on it.
    try:
        with open(os.path.join(directory, ".lock"), "rb", opener=no_follow) as f:
            asked = struct.pack(layout, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
            kind, _, _, _, pid = struct.unpack(layout, fcntl.fcntl(f, fcntl.F_GETLK, asked))
    except OSError:
        return None
    return None if kind == fcntl.F_UNLCK else pid


def being_written(data_dir):
    """Whether a process holds data_dir's lock to write a data set there now."""
    try:
        reader = lock(data_dir, shared=True)
    except OSError:  # no .lock: no writer has ever locked it
        return False
    if reader is None:
        return True
    reader.close()
    return False


# -----------------------------------------------------------------------------
# data sets marked finished


def data_record(data_dir, name):
    """The JSON object in data_dir/name (tokenizer.json, dataset.json), or None if there is no such
    file. Raises ValueError, naming it, if it is not one."""
    path = os.path.join(data_dir, name)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: not prepare.py's {name} ({e})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not prepare.py's {name} (not a JSON object)")
    return record


def check_finished(data_dir):
    """Raise ValueError, saying why, if data_dir holds a set that was begun and not finished: one
    being written now, or one whose writer stopped. A directory without dataset.json holds shards
    from elsewhere (modded-nanogpt's, or an older prepare.py's): they are read as they are."""
    marker = data_record(data_dir, MARKER)
    if marker is None or marker.get("finished") is True:
        return
    if being_written(data_dir):
        raise ValueError(f"{data_dir} is being written now (prepare.py, or train.py preparing it): "
                         "wait until it has finished")
    raise ValueError(f"{data_dir} holds an unfinished data set (its writer stopped before the "
                     "end): prepare it again")


def holds_finished_set(data_dir, last):
    """Whether data_dir holds a finished data set: its dataset.json says so, or, with none (a set
    of an older version), the file that version wrote last is there (path `last`)."""
    marker = data_record(data_dir, MARKER)
    if marker is not None:
        return marker.get("finished") is True
    return os.path.exists(last)


@contextmanager
def writing_data_set(out_dir):
    """Around the writing of a data set into out_dir, which this process has locked: dataset.json
    says "unfinished" until the end, then "finished" with the summary (a dict yielded to fill).
    On any failure (a full disk, Ctrl-C) every file written meanwhile goes instead, and only
    those: the set is whole or absent."""
    before = set(os.listdir(out_dir))
    summary = {}
    try:
        write_json(os.path.join(out_dir, MARKER), {"finished": False})
        yield summary
        write_json(os.path.join(out_dir, MARKER), {"finished": True, **summary})
    except BaseException:
        for name in set(os.listdir(out_dir)) - before:
            os.remove(os.path.join(out_dir, name))
        raise
