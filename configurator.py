"""
configurator.py: what the scripts share: command-line overrides (nanoGPT style), one-line errors,
and reading checkpoints and the models in them.

    python train.py config/cpu_demo.py --router=dynamic --learning_rate=3e-4

Arguments apply left to right: a path is a config file of `key = value` lines (Python literals
only; it is parsed, never executed), `--key=value` sets one key. Every key must already exist
in the script's defaults and keep its type (an int may stand for a float); anything else stops
the script with one line naming the problem and the closest known keys.
"""
import ast
import difflib
import os
import sys
from contextlib import nullcontext

import torch

from lime import GPT, GPTConfig


def fail(message):
    raise SystemExit(f"error: {message}")


def parse_value(text):
    """'3e-4' -> 0.0003, 'True' / 'true' -> True, 'static' -> 'static' (bare words are strings)."""
    if text.lower() in ('true', 'false'):
        return text.lower() == 'true'
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def set_key(config, key, value, where):
    if key not in config:
        close = difflib.get_close_matches(key, list(config), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        fail(f"{where}: unknown key '{key}'{hint}")
    default = config[key]
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not type(default):
        fail(f"{where}: {key} must be {type(default).__name__} (like {default!r}), got {value!r}")
    config[key] = value


def read_config_file(path, config):
    """Apply a config file's `key = value` lines; returns the keys it set."""
    if not os.path.isfile(path):
        fail(f"config file not found: {path} (overrides are written --key=value)")
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
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
        except ValueError:
            fail(f"{where}: the value of {node.targets[0].id} must be a plain literal")
        set_key(config, node.targets[0].id, value, where)
        keys.add(node.targets[0].id)
    return keys


def apply_overrides(config, argv):
    """Update the dict config in place from argv; returns the set of keys that were given."""
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



def resolve_device(config, given):
    """(device_type, autocast context) from config's device and dtype. On a CPU, dtype and compile
    default to float32 and False unless given: CPUs have no fast bfloat16 matmuls, and compiling
    there rarely pays off. Updates config in place."""
    device_type = 'cuda' if 'cuda' in config['device'] else 'cpu'
    if device_type == 'cpu':
        config['dtype'] = config['dtype'] if 'dtype' in given else 'float32'
        if 'compile' in config and 'compile' not in given:
            config['compile'] = False
    if config['dtype'] not in ('float32', 'bfloat16'):
        fail(f"dtype must be 'float32' or 'bfloat16', got {config['dtype']!r}")
    bf16 = config['dtype'] == 'bfloat16'
    return device_type, torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else nullcontext()

def load_checkpoint(path, device):
    """The dict train.py saved at path, with a one-line error if it is missing or unreadable."""
    if not os.path.isfile(path):
        fail(f"no checkpoint at {path} (train.py writes one to its out_dir)")
    try:
        return torch.load(path, map_location=device)
    except Exception as e:  # torch's messages run to many lines: keep the last, most specific one
        lines = [line for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        fail(f"could not read checkpoint {path} (damaged, or not saved by train.py): {lines[-1].strip()}")


def load_model(path, device):
    """The model in the checkpoint at path, in eval mode on device, and the checkpoint itself."""
    checkpoint = load_checkpoint(path, device)
    model = GPT(GPTConfig(**checkpoint['model_args']))
    model.load_state_dict(checkpoint['model'])
    print(f"loaded {path}: step {checkpoint['step']}, router={model.config.router}, "
          f"val loss {checkpoint['best_val_loss']:.4f}", file=sys.stderr)
    return model.eval().to(device), checkpoint
