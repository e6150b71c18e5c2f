"""
Tests for lab/class_times.py, the teacher's timing of the plans: every time it prints beside the
machine's own is the one docs/teaching.md gives, a part whose packages are missing is skipped
saying which, and a bad part name is one line. (No test times anything: a machine's load would
decide it.)

    python -m pytest -q tests/test_class_times.py
"""
import importlib.util
import os
import subprocess
import sys

from lab import class_times

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_time_the_tool_prints_beside_is_the_pages():
    page = open(os.path.join(ROOT, 'docs', 'teaching.md'), encoding='utf-8').read()
    missing = [f"{part}: {time}" for part, time in class_times.PAGE.items() if time not in page]
    assert not missing, f"docs/teaching.md does not give {missing}"
    assert 'python -m lab.class_times' in page


def test_the_notebook_is_skipped_saying_which_packages_are_missing(monkeypatch, capsys):
    found = importlib.util.find_spec
    # nbclient missing, its two companions there (on a machine without them too)
    present = {'nbformat', 'ipykernel'}
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *a: None if name == 'nbclient' else
                        object() if name in present else found(name, *a))
    class_times.time_notebook({}, None)
    line = capsys.readouterr().out.strip()
    assert line.startswith("the student's notebook, Run All")
    assert "skipped: nbclient not installed (pip install nbformat nbclient ipykernel)" in line


def test_an_unknown_part_is_refused_in_one_line():
    result = subprocess.run([sys.executable, '-m', 'lab.class_times', '--parts=walkthrough,lunch'],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.strip() == (
        "error: --parts=walkthrough,lunch: a comma-separated list of handout, walkthrough, "
        "notebook, check, ablation, demo")


def test_the_students_copy_is_timed_beside_the_pages_time():
    result = subprocess.run([sys.executable, '-m', 'lab.class_times', '--parts=handout'],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("the student's copy (lab.handout)")
    assert line.endswith(class_times.PAGE["the student's copy (lab.handout)"])
