"""
memory_limits.py: the memory a job may still take, checked before it takes it, and what happens
when it runs out all the same. Past the memory a job ends in torch's traceback, or is killed (the
OOM killer, a scheduler) with nothing said; here it ends in one line, `error: ...`, naming the
limit and what to lower. lime.GPTConfig checks a model's weights; train.py, sample.py and
lab/bench.py the rest of a job (check_memory), and train.py makes a step that runs out anyway one
line too (out_of_memory_in_one_line).
"""
import os
import re
import sys

import torch

from configurator import fail

try:
    import resource  # a process's limits (POSIX)
except ImportError:  # Windows: none
    resource = None


def check_memory(nbytes, device, what, hint=''):
    """Stop in one line where what, nbytes at the least, cannot fit in what this process has left
    on device (memory_limit: the least of its limits, named): a job's arrays, sized by a
    script's keys (the model's weights are lime.GPTConfig's to check). Beyond the memory they
    would end in torch's traceback, or in the OOM killer's kill. hint: what to lower."""
    have, limit = memory_limit(device)
    if have is not None and nbytes > have:
        fail(f"{what} take {nbytes / 2**30:,.1f} GiB, more than the {max(have, 0) / 2**30:,.1f} "
             f"GiB {limit}" + (f": {hint}" if hint else ""))


def memory_limit(device):
    """(the bytes this process may still allocate on device, what leaves it that: words that
    follow "more than N GiB"), or (None, None) where nothing is known: a GPU's free memory, or
    the least that any of cpu_limits leaves."""
    if str(device).startswith('cuda'):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return free, f"free on {device} (of its {total / 2**30:,.1f} GiB)"
    return min(cpu_limits(), default=(None, None))


def cpu_limits():
    """Each limit on this process's memory, as (what it leaves, what it is), each less what the
    process holds of it now: this machine's memory, its cgroup's (a container's or a scheduler's
    job's) and its address space (ulimit -v, which counts every mapping, so what it has mapped
    counts too)."""
    mapped, resident = held_bytes()
    left = []
    if hasattr(os, 'sysconf'):  # not on Windows
        ram = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
        left.append((ram - resident, f"left to this process of this machine's {ram / 2**30:,.1f} "
                                     "GiB"))
    if (cgroup := cgroup_limit()) is not None:
        limit, path = cgroup
        left.append((limit - resident, f"left to this process by its cgroup's limit ({path}: "
                                       f"{limit / 2**30:,.1f} GiB)"))
    if resource is not None:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]  # the soft limit: the one that holds
        if limit != resource.RLIM_INFINITY:
            left.append((limit - mapped, f"left to this process by its address-space limit "
                                         f"(ulimit -v, RLIMIT_AS: {limit / 2**30:,.1f} GiB)"))
    return left


def held_bytes():
    """(the address space this process has mapped, the memory it holds): Linux's /proc/self/statm,
    else (0, 0)."""
    try:
        with open('/proc/self/statm') as f:
            pages = f.read().split()
    except OSError:  # not Linux
        return 0, 0
    return int(pages[0]) * os.sysconf('SC_PAGE_SIZE'), int(pages[1]) * os.sysconf('SC_PAGE_SIZE')


def cgroup_limit():
    """(the least memory limit of this process's cgroup and those above it, its file), or None:
    cgroup v2's memory.max, or v1's memory.limit_in_bytes (Linux only)."""
    try:
        with open('/proc/self/cgroup') as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:  # hierarchy-id:controllers:path, and v2's controllers are ''
        _, controllers, path = line.split(':', 2)
        if controllers == '':
            root, name = '/sys/fs/cgroup', 'memory.max'
        elif 'memory' in controllers.split(','):
            root, name = '/sys/fs/cgroup/memory', 'memory.limit_in_bytes'
        else:
            continue
        directory = os.path.normpath(root + path)
        while directory.startswith(root):  # a limit on a cgroup holds for those below it too
            try:
                with open(os.path.join(directory, name)) as f:
                    limits.append((int(f.read()), os.path.join(directory, name)))
            except (OSError, ValueError):  # none there, or 'max': no limit
                pass
            directory = os.path.dirname(directory)
    return min(limits, default=None)


# -----------------------------------------------------------------------------
# When memory runs out all the same: check_memory counts a floor (what torch keeps of a step
# beyond it, and what its threads map, are not counted), so a job it lets through can still fail.
def out_of_memory_in_one_line(hint, kept=None):
    """From here an allocation that fails (torch's CPU allocator, torch.OutOfMemoryError on a
    GPU, Python's MemoryError) ends the script with one line, `error: out of memory ...: hint`,
    then kept()'s sentence on what is left, rather than a traceback (exit status 1, as fail's).
    By then the error has unwound the script: a file being written has removed its temporary,
    and the one it was to replace (a run's last checkpoint) is as it was."""
    others = sys.excepthook  # Ctrl-C's line (configurator.interrupted), or a traceback

    def one_line(kind, error, traceback):
        reason = out_of_memory(error)
        if reason is None:
            return others(kind, error, traceback)
        left = kept() if kept is not None else None
        print(f"error: out of memory ({reason}): {hint}" + (f"; {left}" if left else ""),
              file=sys.stderr)

    sys.excepthook = one_line


def out_of_memory(error):
    """What ran out, in a few words, where error is an allocation that failed; else None."""
    if isinstance(error, torch.OutOfMemoryError):  # CUDA's, whose first sentence says enough
        return str(error).split('. ')[0].strip()
    if isinstance(error, RuntimeError) and 'DefaultCPUAllocator' in str(error):
        wanted = re.search(r'allocate (\d+) bytes', str(error))
        more = f" {int(wanted[1]) / 2**30:,.2f} GiB" if wanted else ""
        return f"torch could not allocate{more} more on the CPU"
    if isinstance(error, MemoryError):  # Python's own, or numpy's "Unable to allocate ..."
        return str(error) or "Python could not allocate more"
    return None
