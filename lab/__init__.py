"""Research tools beside the model: evaluation, analysis, plots, the arithmetic task, benchmarks.
Run each from the repository root as python -m lab.NAME (e.g. python -m lab.evaluate --help)."""

import json

from configurator import fail, read_text


def read_json(path, what, hint='', lines=False):
    """The JSON value in a file, or with lines a list of one per non-blank line (read_text's
    what and hint), or one line saying why it cannot be read."""
    text = read_text(path, what, hint)
    try:
        return [json.loads(l) for l in text.splitlines() if l.strip()] if lines else json.loads(text)
    except ValueError as e:
        fail(f"{what} {path}: not {'one JSON value a line' if lines else 'JSON'} ({e})")
