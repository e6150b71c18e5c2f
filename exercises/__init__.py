"""The exercises of docs/walkthrough.md: student.py to fill in, answers.py, checks.py (the check of
each exercise, against lime.py's own code) and ablation.py, exercise 6's experiment. A file of
answers is read by path (load); a student's copy (python -m lab.handout) has no answers.py."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(path):
    """The Python file at path (relative to the working directory or to the repo root)."""
    path = Path(path) if Path(path).exists() else ROOT / path
    if not path.is_file():
        raise FileNotFoundError(f"no exercises file at {path}")
    spec = importlib.util.spec_from_file_location(f'exercises_{path.stem}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
