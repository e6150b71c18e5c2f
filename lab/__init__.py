"""Research tools beside the model: evaluation, analysis, plots, the arithmetic task, benchmarks.
Run each from the repository root as python -m lab.NAME (e.g. python -m lab.evaluate --help)."""

import json
import sys

from configurator import fail, read_text


def read_json(path, what, hint='', lines=False):
    """The JSON value in a file, or with lines a list of one per non-blank line (read_text's
    what and hint), or one line saying why it cannot be read. A last line cut short (no newline:
    a process killed while writing it) is left out, with a note."""
    text = read_text(path, what, hint)
    if not lines:
        try:
            return json.loads(text)
        except ValueError as e:
            fail(f"{what} {path}: not JSON ({e})")
    values, split = [], text.split('\n')
    for n, line in enumerate(split, 1):
        try:
            if line.strip():
                values.append(json.loads(line))
        except ValueError as e:
            if n == len(split):  # after the last newline: cut short
                print(f"note: {path}:{n}: the last line is cut short (a run killed while writing "
                      "it?): left out", file=sys.stderr)
            else:
                fail(f"{what} {path}:{n}: not JSON ({e.msg}, at character {e.pos + 1})")
    return values

