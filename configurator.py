"""
configurator.py: nanoGPT's configurator, made safe. A script's defaults block holds its settings;
config files (`key = value` lines of Python literals, parsed, never executed) and --key=value
change them, left to right. A key must exist (a typo gets "did you mean"), keep its type (an
int may stand for a float) and lie in its range (KINDS); else one line, `error: ...`, stops it.

    python train.py config/cpu_demo.py --router=dynamic --learning_rate=3e-4
    python train.py --help                       # every key, its default and what it means
"""
import ast
import difflib
import math
import os
import re
import sys
import time
from contextlib import nullcontext

import torch


def configure(namespace, kinds, argv=None):
    """Start a script: returns (config, given, autocast). The defaults are the lowercase plain
    values of namespace (the script's globals()); argv (default: the command line) overrides
    them, given is the keys it set, and check_values checks each against kinds {kind: [keys]}.
    On a CPU, dtype and compile default to float32 and False (no fast bfloat16 matmuls there,
    and compiling rarely pays); on a GPU, float32 matmuls may use TF32. autocast: the context to
    run the model in (bfloat16 autocast, or nothing)."""
    config = {k: v for k, v in namespace.items()
              if k.islower() and not k.startswith('_') and type(v) in (int, float, bool, str)}
    config.update({k: v for k, v in namespace.items() if k == 'fused'})  # None: automatic
    given = apply_overrides(config, sys.argv[1:] if argv is None else argv)
    check_values(config, kinds)
    device_type = 'cuda' if config.get('device', 'cpu').startswith('cuda') else 'cpu'
    if device_type == 'cpu':
        config.update({k: v for k, v in (('dtype', 'float32'), ('compile', False))
                       if k in config and k not in given})
    else:
        torch.backends.cuda.matmul.allow_tf32 = True  # only float32 work is affected
        torch.backends.cudnn.allow_tf32 = True
    bf16 = config.get('dtype') == 'bfloat16'
    return config, given, torch.autocast(device_type, torch.bfloat16) if bf16 else nullcontext()


def fail(message):
    """Stop with one line, `error: message`, on stderr. Under torchrun only rank 0 says it; the
    others wait a moment first, since torchrun stops all when one ends, and rank 0 must speak."""
    if os.environ.get('RANK', '0') not in ('', '0'):
        time.sleep(2)
        raise SystemExit(1)
    raise SystemExit(f"error: {message}")


def or_fail(call, *args, **kwargs):
    """call(*args, **kwargs), a ValueError (lime.py's and prepare.py's checks) made fail's line."""
    try:
        return call(*args, **kwargs)
    except ValueError as e:
        fail(str(e))


def apply_overrides(config, argv):
    """Update config from argv; returns the keys given. -h / --help prints the keys and exits."""
    if '-h' in argv or '--help' in argv:
        print_help(config)
        raise SystemExit(0)
    given = set()
    for arg in argv:
        if not arg.startswith('--'):
            given |= read_config_file(arg, config)
            continue
        key, eq, text = arg[2:].partition('=')
        if not eq:
            fail(f"expected --key=value, got '{arg}'")
        try:  # 3e-4, True or true, None; a bare word is a string: --router=static
            value = ast.literal_eval(text.title() if text.lower() in ('true', 'false') else text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value = text
        set_key(config, key, value, f"--{key}")
        given.add(key)
    return given


def set_key(config, key, value, where):
    if key not in config:
        close = ', '.join(difflib.get_close_matches(key, list(config), n=3))
        fail(f"{where}: unknown key '{key}'" + (f" (did you mean {close}?)" if close else ""))
    default = config[key]
    if isinstance(default, float) and type(value) is int:
        value = float(value)
    if default is None and value is not None and type(value) is not bool:
        fail(f"{where}: {key} must be None (automatic), True or False, got {value!r}")
    if default is not None and type(value) is not type(default):
        fail(f"{where}: {key} must be {type(default).__name__} (like {default!r}), got {value!r}")
    config[key] = value


def read_config_file(path, config):
    """Apply a config file's `key = value` lines (Python literals); returns the keys it set."""
    text = read_text(path, 'config file', 'overrides are written --key=value')
    try:
        body = ast.parse(text, filename=path).body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:  # ValueError: NUL bytes
        fail(f"{path}:{getattr(e, 'lineno', '')}: not a config file of `key = value` lines")
    keys = set()
    for node in body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        try:
            (target,) = node.targets
            set_key(config, target.id, ast.literal_eval(node.value), f"{path}:{node.lineno}")
            keys.add(target.id)
        except (AttributeError, ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            fail(f"{path}:{node.lineno}: config files hold only `key = value` lines, the values "
                 "plain literals")
    return keys


def read_text(path, what, hint=''):
    """The UTF-8 text of a file the user named (what: 'config file', ...), or one line saying
    why it cannot be read (with hint, what to do, if the file is not there)."""
    if not os.path.isfile(path):
        fail(f"{what} not found: {path}" + (f" ({hint})" if hint else ""))
    try:
        with open(path, encoding='utf-8') as f:
            return f.read()
    except UnicodeDecodeError as e:
        fail(f"{what} {path}: not UTF-8 text ({e.reason} at byte {e.start})")
    except OSError as e:
        fail(f"{what} {path}: could not read it ({e.strerror})")


def print_help(config):
    """The script's docstring, then every key with its default and the comment beside it in the
    defaults block: the block is the documentation, so --help cannot drift from it."""
    script = sys.modules['__main__']
    print((script.__doc__ or '').strip() + '\n')
    with open(script.__file__, encoding='utf-8') as f:  # the first `key = ...` is the default
        comments = dict(reversed(re.findall(r"^(\w+) = [^#\n]*(?:#\s*(.*))?$", f.read(), re.M)))
    shown = {k: format(v, 'g') if isinstance(v, float) and len(repr(v)) > 10
             and float(format(v, 'g')) == v else v for k, v in config.items()}  # 9.89e+14
    settings = {key: f"--{key}={value}" for key, value in shown.items()}
    width = max(map(len, settings.values()))
    print("keys, with their defaults (config files of `key = value` lines, then --key=value):")
    for key, setting in settings.items():
        print(f"  {setting:<{width}}  {comments.get(key, '')}".rstrip())


# The kinds of value a key may hold: test, and how an error states it. Each script gives every
# key a kind (or a tuple of allowed values, or 'device'); true/false and None keys need none.
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
    """Check each value against its kind, so none out of range reaches code that would misuse
    it (a negative grad_clip silently climbs the loss). A key with no kind is a script's bug."""
    kind_of = {key: kind for kind, keys in kinds.items() for key in keys}
    for key, value in config.items():
        if isinstance(value, bool) or value is None:
            continue  # its type, checked by set_key, is its whole range
        kind = kind_of[key]  # a KeyError here: the script gave this key no kind
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"{key} must be a finite number, got {value}")
        if kind == 'device':
            check_device(value)
        elif isinstance(kind, tuple) and value not in kind:
            fail(f"{key} must be one of {', '.join(map(repr, kind))}, got {value!r}")
        elif kind in KINDS and not KINDS[kind][0](value):
            fail(f"{key} must be {KINDS[kind][1]}, got {value!r}")


def check_device(device):
    """'cpu', or a CUDA GPU this machine has: one line here, not torch's traceback at first use."""
    kind, colon, index = device.partition(':')
    if device != 'cpu' and (kind != 'cuda' or colon and not index.isdigit()):
        fail(f"device must be 'cpu', 'cuda' or 'cuda:N' (mps and others are not supported), "
             f"got {device!r}")
    if kind == 'cuda' and not torch.cuda.is_available():
        fail(f"device {device!r}: torch {torch.__version__} sees no CUDA GPU here; use --device=cpu")
    if kind == 'cuda' and colon and int(index) >= torch.cuda.device_count():
        fail(f"device {device!r}: there are {torch.cuda.device_count()} CUDA GPUs, numbered from 0")
