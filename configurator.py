"""
configurator.py: how every script starts: its settings (the defaults block at its top, then
command-line overrides, nanoGPT style), the checks every value must pass, the device, and
one-line errors instead of tracebacks. A script calls configure() once; see its docstring.

    python train.py config/cpu_demo.py --router=dynamic --learning_rate=3e-4
    python train.py --help                       # every key, its default and what it means

Arguments apply left to right: a path is a config file of `key = value` lines (Python literals
only; it is parsed, never executed), `--key=value` sets one key. Every key must already exist
in the script's defaults and keep its type (an int may stand for a float), and then lie in its
range (check_values); anything else stops the script with one line naming the problem.
"""
import ast
import ctypes
import difflib
import io
import json
import math
import os
import sys
import time
import tokenize
from contextlib import nullcontext

import torch

PLAIN = (int, float, bool, str, type(None))  # the types a setting may have


def configure(namespace, kinds, argv=None):
    """Start a script: returns (config, given, autocast). namespace holds the script's defaults: its
    lowercase names bound to plain values (numbers, text, True/False, None); scripts pass globals().
    argv (default: the command line) updates them (apply_overrides), and every value is checked
    against kinds (check_values). config is the settings, a dict (namespace is left as it was);
    given, the keys argv set. With a 'device' key the device is set up: on a CPU, dtype and compile
    default to float32 and False unless given (CPUs have no fast bfloat16 matmuls, and compiling
    rarely pays off there), and freed memory is kept (keep_freed_memory); on a GPU, float32 matmuls
    may use TF32. autocast is the context to run the model in: bfloat16 autocast, or nothing."""
    config = {k: v for k, v in namespace.items() if k.islower() and not k.startswith('_') and type(v) in PLAIN}
    given = apply_overrides(config, sys.argv[1:] if argv is None else argv)
    check_values(config, kinds)
    if 'device' not in config:
        return config, given, nullcontext()
    device_type = 'cuda' if config['device'].startswith('cuda') else 'cpu'
    if device_type == 'cpu':
        config.update({key: value for key, value in (('dtype', 'float32'), ('compile', False))
                       if key in config and key not in given})
        keep_freed_memory()
    else:
        torch.backends.cuda.matmul.allow_tf32 = True  # only float32 work is affected; bf16 is unchanged
        torch.backends.cudnn.allow_tf32 = True
    bf16 = config.get('dtype') == 'bfloat16'
    return config, given, torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else nullcontext()


def fail(message):
    """Stop the script with one line on stderr, `error: message`, and a non-zero exit status.
    Under torchrun every process meets the same checks, so only rank 0 reports: one line, not one
    per process, interleaved. The others first wait a moment, because torchrun stops all processes
    as soon as one has ended, and rank 0 must get to say why."""
    if os.environ.get('RANK', '0') not in ('', '0'):
        time.sleep(2)
        raise SystemExit(1)
    raise SystemExit(f"error: {message}")


def or_fail(call, *args, **kwargs):
    """call(*args, **kwargs), with a ValueError it raises (lime.py's and prepare.py's checks raise
    them, with a message for the user) turned into fail's one line."""
    try:
        return call(*args, **kwargs)
    except ValueError as e:
        fail(str(e))


def parse_value(text):
    """'3e-4' -> 0.0003, 'True' / 'true' -> True, 'static' -> 'static' (bare words are strings)."""
    if text.lower() in ('true', 'false'):
        return text.lower() == 'true'
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text


def set_key(config, key, value, where):
    if key not in config:
        close = difflib.get_close_matches(key, list(config), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        fail(f"{where}: unknown key '{key}'{hint}")
    default = config[key]
    if default is None:  # an automatic choice (like fused): None keeps it automatic, a bool forces it
        if value is not None and not isinstance(value, bool):
            fail(f"{where}: {key} must be None (automatic), True or False, got {value!r}")
        config[key] = value
        return
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not type(default):
        fail(f"{where}: {key} must be {type(default).__name__} (like {default!r}), got {value!r}")
    config[key] = value


def read_text(path, what, hint=''):
    """The UTF-8 text of a file the user named (what it is: 'config file', 'prompt file', ...), or
    one line saying why it cannot be read (with hint, what to do, if it is not there)."""
    if not os.path.isfile(path):
        fail(f"{what} not found: {path}" + (f" ({hint})" if hint else ""))
    try:
        with open(path, encoding='utf-8') as f:
            return f.read()
    except UnicodeDecodeError as e:
        fail(f"{what} {path}: not UTF-8 text ({e.reason} at byte {e.start})")
    except OSError as e:
        fail(f"{what} {path}: could not read it ({e.strerror})")


def read_json(path, what, hint='', lines=False):
    """The JSON value in a file, or with lines a list of one per non-blank line (read_text's what and
    hint), or one line saying why it cannot be read."""
    text = read_text(path, what, hint)
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()] if lines else json.loads(text)
    except ValueError as e:
        fail(f"{what} {path}: not {'one JSON value a line' if lines else 'JSON'} ({e})")


def read_config_file(path, config):
    """Apply a config file's `key = value` lines; returns the keys it set."""
    text = read_text(path, 'config file', 'overrides are written --key=value')
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as e:  # null bytes too
        where = f"{path}:{e.lineno}" if e.lineno else path
        fail(f"{where}: not a config file of `key = value` lines ({e.msg})")
    except (OSError, ValueError, MemoryError, RecursionError) as e:
        fail(f"{path}: could not read it ({e})")
    keys = set()
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring or comment string
        where = f"{path}:{node.lineno}"
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            fail(f"{where}: config files may only hold `key = value` lines")
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, TypeError, MemoryError, RecursionError):
            fail(f"{where}: the value of {node.targets[0].id} must be a plain literal")
        set_key(config, node.targets[0].id, value, where)
        keys.add(node.targets[0].id)
    return keys


def print_help(config):
    """The running script's docstring, then every key with its default and the comment beside it in
    the script's defaults block: the block is the documentation, so --help cannot drift from it."""
    script = sys.modules['__main__']
    print((script.__doc__ or '').strip() + '\n')
    comments = {}
    path = getattr(script, '__file__', None)
    if path and os.path.isfile(path):
        with open(path, encoding='utf-8') as f:
            source = f.read()
        notes = {token.start[0]: token.string.lstrip('#').strip()
                 for token in tokenize.generate_tokens(io.StringIO(source).readline)
                 if token.type == tokenize.COMMENT}
        for node in ast.parse(source).body:  # the first top-level `key = ...` is the default
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                comments.setdefault(node.targets[0].id, notes.get(node.end_lineno, ''))

    def shown(value):  # 9.89e+14 rather than 989000000000000.0, where that loses nothing
        short = isinstance(value, float) and len(repr(value)) > 10 and float(format(value, 'g')) == value
        return format(value, 'g') if short else value

    print("keys, with their defaults (set them by config files of `key = value` lines, then --key=value):")
    settings = {key: f"--{key}={shown(value)}" for key, value in config.items()}
    width = max(map(len, settings.values()))
    for key, setting in settings.items():
        print(f"  {setting:<{width}}  {comments.get(key, '')}".rstrip())


def apply_overrides(config, argv):
    """Update the dict config in place from argv; returns the set of keys that were given.
    -h or --help anywhere prints the keys instead, and exits."""
    if '-h' in argv or '--help' in argv:
        print_help(config)
        raise SystemExit(0)
    given = set()
    for arg in argv:
        if arg.startswith('--'):
            key, eq, text = arg[2:].partition('=')
            if not eq:
                fail(f"expected --key=value, got '{arg}'")
            set_key(config, key, parse_value(text), f"--{key}")
            given.add(key)
        else:
            given |= read_config_file(arg, config)
    return given


# The kinds of value a key may hold, each with its test and how an error message states it. Each script
# gives every one of its keys a kind (check_values); true/false keys, and automatic ones (None), need none.
KINDS = {
    'positive': (lambda v: v > 0, '> 0'),
    'non-negative': (lambda v: v >= 0, '>= 0'),
    'fraction': (lambda v: 0 < v <= 1, 'in (0, 1]'),
    'below one': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    'seed': (lambda v: 0 <= v < 2**63, 'from 0 to 2**63 - 1'),
    'path': (lambda v: v.strip() != '', 'a non-empty path'),
    'text': (lambda v: True, 'text'),
}


def check_values(config, kinds):
    """Check every key's value against its kind, so that no value outside its range reaches code that
    would misuse it (a negative grad_clip silently climbs the loss; a zero peak_flops divides by zero
    an hour in). kinds maps a kind (a name in KINDS, 'device', or a tuple of the allowed values) to its
    keys. A key of the script missing from kinds is a bug in the script, reported as one."""
    kind_of = {key: kind for kind, keys in kinds.items() for key in keys}
    for key, value in config.items():
        if isinstance(value, bool) or value is None:
            continue  # its type, checked by set_key, is its whole range
        if key not in kind_of:
            raise KeyError(f"{key} has no kind in the script's list for check_values")
        kind = kind_of[key]
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"{key} must be a finite number, got {value}")
        if isinstance(kind, tuple):
            if value not in kind:
                fail(f"{key} must be one of {', '.join(map(repr, kind))}, got {value!r}")
        elif kind == 'device':
            check_device(value)
        elif not KINDS[kind][0](value):
            fail(f"{key} must be {KINDS[kind][1]}, got {value!r}")


def check_device(device):
    """'cpu', or a CUDA GPU this machine has: one line here rather than torch's traceback at first use
    (or, loading a checkpoint, a message that blames the file)."""
    if device == 'cpu':
        return
    kind, colon, index = device.partition(':')
    if kind != 'cuda' or (colon and not index.isdigit()):
        fail(f"device must be 'cpu', 'cuda' or 'cuda:N' (mps and others are not supported), got {device!r}")
    if not torch.cuda.is_available():
        build = 'a CPU-only build' if torch.version.cuda is None else f'built for CUDA {torch.version.cuda}'
        fail(f"device {device!r}: torch {torch.__version__} ({build}) sees no CUDA GPU here; "
             "use --device=cpu")
    if colon and int(index) >= torch.cuda.device_count():
        fail(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s), numbered from 0")


def keep_freed_memory():
    """A CPU speed-up, on Linux with glibc. glibc hands large freed blocks back to the OS and
    page-faults them in again on the next step, for the big logits tensors of every step; keeping
    up to 1 GiB of freed memory in the heap avoids that. Measured side by side on a 2-core x86-64 VM
    (torch 2.13, 2026-11-23): without it, config/cpu_demo.py's steps take 1.6x as long (2 threads;
    1.45x with one thread, 1.42x at batch 16), median of 3 alternating pairs each."""
    if sys.platform != 'linux':
        return
    try:
        libc = ctypes.CDLL('libc.so.6')
    except OSError:  # not glibc (musl, say): nothing to tune
        return
    libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: serve blocks up to 1 GiB from the heap, not mmap
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: give memory back only past 1 GiB of free heap
