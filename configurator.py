"""
nanoGPT's configurator, made safe: config files (`key = value` lines of literals, parsed, never
executed) and --key=value change a script's defaults block, left to right. A key must exist, keep
its type and lie in its range, else one line stops the script; `--help` lists the keys.
"""
import ast
import difflib
import os
import re
import sys
import time
from contextlib import nullcontext, suppress

import torch

# What a key may hold: a test, and how an error states it. A script gives a kind (or a tuple of
# allowed values) to the keys it uses itself ('text': any); lime.GPTConfig checks the model's.
KINDS = {
    'positive': (lambda v: v > 0, '> 0'),
    'non-negative': (lambda v: v >= 0, '>= 0'),
    'seed': (lambda v: v >= 0, '>= 0'),
    'below one': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    'path': (lambda v: v.strip() != '', 'a non-empty path'),
    'device': (lambda v: re.fullmatch(r'cpu|cuda(:\d+)?', v), "'cpu', 'cuda' or 'cuda:N'"),
}


def configure(namespace, kinds, argv=None):
    """(config, the keys argv set, the autocast context): the lowercase plain values of namespace
    (the script's globals()) changed by argv, each checked against kinds, {kind: [keys]}."""
    config = {k: v for k, v in namespace.items() if k.islower() and not k.startswith('_')
              and type(v) in (int, float, bool, str, list)}
    argv = sys.argv[1:] if argv is None else argv
    given = set()
    for arg in argv:
        if arg in ('-h', '--help'):  # with the values of the arguments before it
            print_help(config)
        if not arg.startswith('--'):
            given |= read_config_file(arg, config)
            continue
        key, eq, text = arg[2:].partition('=')
        if not eq:
            fail(f"expected --key=value, got '{arg}'")
        value = text  # a bare word (--router=static), and a text key's value as typed (--seeds=1)
        if not isinstance(config.get(key), str):
            literal = text.title() if text.lower() in ('true', 'false') else text  # true: True
            with suppress(Exception):  # not a literal: text
                value = ast.literal_eval(literal)
        given.add(set_key(config, key, value, f"--{key}"))
    kind_of = {key: kind for kind, keys in kinds.items() for key in keys}
    for key, value in config.items():
        check_value(key, value, kind_of.get(key))
    device_type = 'cuda' if config.get('device', 'cpu').startswith('cuda') else 'cpu'
    if device_type == 'cpu':  # no fast bf16 matmuls, and compiling rarely pays
        config.update({k: v for k, v in {'dtype': 'float32', 'compile': False}.items()
                       if k in config and k not in given})
    bf16 = config.get('dtype') == 'bfloat16'
    return config, given, torch.autocast(device_type, torch.bfloat16) if bf16 else nullcontext()


def check_value(key, value, kind):
    if isinstance(kind, tuple) and value not in kind:
        fail(f"{key} must be one of {', '.join(map(repr, kind))}, got {value!r}")
    if kind in KINDS and not KINDS[kind][0](value):
        fail(f"{key} must be {KINDS[kind][1]}, got {value!r}")
    if kind == 'device' and value.startswith('cuda'):
        if int(value.partition(':')[2] or 0) >= torch.cuda.device_count():
            fail(f"device {value!r}: torch {torch.__version__} sees {torch.cuda.device_count()} "
                 "CUDA GPU(s) here (use --device=cpu)")


def fail(message):
    """Stop with one line, `error: message`, on stderr. Under torchrun only rank 0 says it; the
    others wait a moment first, since torchrun stops all when one ends, and rank 0 must speak."""
    if os.environ.get('RANK', '0') not in ('', '0'):
        time.sleep(2)
        raise SystemExit(1)
    raise SystemExit(f"error: {message}")


def or_fail(call, *args, **kwargs):
    """call(*args, **kwargs), a ValueError (lime.py's and prepare.py's checks) or an OSError (a
    file that cannot be read or written: the OS says why) made fail's line."""
    try:
        return call(*args, **kwargs)
    except ValueError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.filename}: {e.strerror}" if e.filename else str(e))


def read_config_file(path, config):
    """Apply a config file's `key = value` lines; returns the keys it set."""
    text = read_text(path, 'config file', 'overrides are written --key=value')
    try:
        body = ast.parse(text, filename=path).body
    except Exception as e:  # a SyntaxError, or a ValueError for NUL bytes
        fail(f"{path}:{getattr(e, 'lineno', '')}: not a config file of `key = value` lines")
    for node in body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        try:
            (target,) = node.targets
            set_key(config, target.id, ast.literal_eval(node.value), f"{path}:{node.lineno}")
        except Exception:  # not `name = literal`
            fail(f"{path}:{node.lineno}: config files hold `key = value` lines of plain literals")
    return {node.targets[0].id for node in body if isinstance(node, ast.Assign)}


def set_key(config, key, value, where):
    if key not in config:
        close = ', '.join(difflib.get_close_matches(key, list(config), n=3))
        fail(f"{where}: unknown key '{key}'" + (f" (did you mean {close}?)" if close else ""))
    default = config[key]
    if isinstance(default, float) and type(value) is int:
        value = float(value)
    if type(value) is not type(default):
        fail(f"{where}: {key} must be {type(default).__name__} (like {default!r}), got {value!r}")
    config[key] = value
    return key


def read_text(path, what, hint=''):
    """The text of a file the user named (what: 'config file', ...), or one line saying why not."""
    if not os.path.isfile(path):
        fail(f"{what} not found: {path}" + (f" ({hint})" if hint else ""))
    try:
        with open(path, encoding='utf-8') as f:
            return f.read()
    except (UnicodeDecodeError, OSError) as e:
        fail(f"{what} {path}: could not read it as UTF-8 text ({e})")


def print_help(config):
    """The script's docstring, then each key, its value (the default, or a config file's) and its
    comment in the defaults block; then exit. A reader that stops early (`| head`) is fine."""
    script = sys.modules['__main__']
    with open(script.__file__, encoding='utf-8') as f:  # the first `key = ...` is the default
        comments = dict(reversed(re.findall(r"^(\w+) = [^#\n]*(?:#\s*(.*))?$", f.read(), re.M)))
    settings = {k: f"--{k}={v}" for k, v in config.items()}
    width = max(map(len, settings.values()), default=0)
    lines = [(script.__doc__ or '').strip() + '\n',
             "keys, with their values (config files of `key = value` lines, then --key=value):"]
    lines += [f"  {setting:<{width}}  {comments.get(key, '')}".rstrip()
              for key, setting in settings.items()]
    try:
        print('\n'.join(lines), flush=True)
    except BrokenPipeError:  # the reader has its lines: the rest goes nowhere, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(0)
