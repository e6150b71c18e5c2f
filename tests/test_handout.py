"""
Tests for lab/handout.py, the student's copy: in it, the page's check command fails each of the six
exercises untouched with "not written yet", passes them written right, and the tests that need
the answers skip, saying why. A clone with exercises/answers.py and exercises/wrong.py deleted by
hand is the same copy.

    python -m pytest -q tests/test_handout.py
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

from lab.handout import CHECK
from test_exercises import EXERCISES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IN_A_CLONE = subprocess.run(['git', 'ls-files', 'lime.py'], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() == 'lime.py' if shutil.which('git') else False


def check_command(copy):
    """The page's check command, run in copy as a student runs it there."""
    env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
    env.update(LIME_EXERCISES='exercises/student.py', OMP_NUM_THREADS='1')
    command = CHECK.split(' ', 1)[1].replace('python', sys.executable, 1)  # LIME_EXERCISES: env
    return subprocess.run([*command.split(), '-p', 'no:cacheprovider'], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not IN_A_CLONE, reason="not a git clone: lab.handout copies the files git "
                    "tracks")
def test_handout_checks_fail_untouched_and_pass_when_right_with_no_answers_in_it(tmp_path):
    copy = tmp_path / 'class'
    result = subprocess.run([sys.executable, '-m', 'lab.handout', f'--out_dir={copy}'], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (copy / 'exercises' / 'student.py').is_file() and (copy / 'lime.py').is_file()
    assert not (copy / 'exercises' / 'answers.py').exists()
    assert not (copy / 'exercises' / 'wrong.py').exists()

    untouched = check_command(copy)
    summary = untouched.stdout.strip().splitlines()
    assert untouched.returncode == 1 and re.search(r'\b6 failed\b', summary[-1]), untouched.stdout
    for name in EXERCISES:
        assert f"{name}: not written yet" in untouched.stdout, name
    assert "skipped: exercises/wrong.py is not in this copy" in untouched.stdout

    # The repo's answers, written into the student's file: the same command goes green.
    shutil.copy(os.path.join(ROOT, 'exercises', 'answers.py'), copy / 'exercises' / 'student.py')
    right = check_command(copy)  # the six checks, and the tests of the checks that need no file
    assert right.returncode == 0 and re.search(r'\b8 passed\b', right.stdout), right.stdout


def test_handout_refuses_a_directory_that_holds_files(tmp_path):
    (tmp_path / 'notes.txt').write_text('a teacher\'s notes\n')
    result = subprocess.run([sys.executable, '-m', 'lab.handout', f'--out_dir={tmp_path}'],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: {tmp_path} exists and is not an empty directory: " \
                                    "give a new one"


def test_handout_refuses_an_out_dir_that_a_link_leads_into_the_repo(tmp_path):
    os.symlink(ROOT, tmp_path / 'repo')
    out_dir = tmp_path / 'repo' / 'class-copy'  # outside, as written; inside, links followed
    result = subprocess.run([sys.executable, '-m', 'lab.handout', f'--out_dir={out_dir}'],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: {out_dir} is inside the repo (links followed): give " \
                                    "a directory outside it"
    assert not os.path.exists(os.path.join(ROOT, 'class-copy'))
