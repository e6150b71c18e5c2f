"""
Tests for lab/handout.py, the student's copy: in it, the page's check command fails each of the six
exercises untouched with "not written yet", passes them written right, and the tests that need
the answers skip, saying why; it holds no block's result outside an answer's fold, and no test or
check holds a line of the answers; exercise 6's experiment, run plainly there, says what is
missing. A clone with exercises/answers.py and exercises/wrong.py deleted by hand checks the same.

    python -m pytest -q tests/test_handout.py
"""
import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exercises.checks import EXERCISES
from lab.handout import CHECK
from lab.notebook import page_cells, split_results

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


def answer_lines():
    """The code lines of exercises/answers.py's answers (not their docstrings, nor the lines
    exercises/student.py hands out), long enough to be more than a commonplace."""
    source = Path(ROOT, 'exercises', 'answers.py').read_text()
    lines = source.splitlines()
    code = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for inner in ast.walk(node):
                if not isinstance(inner, ast.FunctionDef):
                    continue
                docstring = inner.body[0]
                code |= set(range(docstring.end_lineno + 1, inner.end_lineno + 1))
    handed_out = Path(ROOT, 'exercises', 'student.py').read_text()
    given = {line.strip() for line in handed_out.splitlines()}
    found = {lines[n - 1].split('#')[0].strip() for n in code}
    return {line for line in found if len(line) >= 25 and line not in given}


@pytest.fixture(scope='module')
def copy(tmp_path_factory):
    if not IN_A_CLONE:
        pytest.skip("not a git clone: lab.handout copies the files git tracks")
    copy = tmp_path_factory.mktemp('handout') / 'class'
    result = subprocess.run([sys.executable, '-m', 'lab.handout', f'--out_dir={copy}'], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return copy


def test_handout_checks_fail_untouched_and_pass_when_right_with_no_answers_in_it(copy, tmp_path):
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
    mine = tmp_path / 'class'
    shutil.copytree(copy, mine)
    shutil.copy(os.path.join(ROOT, 'exercises', 'answers.py'), mine / 'exercises' / 'student.py')
    right = check_command(mine)  # the six checks, and the tests of the checks that need no file
    assert right.returncode == 0 and re.search(r'\b9 passed\b', right.stdout), right.stdout


def test_handout_shows_no_blocks_result_outside_an_answers_fold(copy):
    assert (copy / 'docs' / 'walkthrough_student.ipynb').is_file()
    assert not (copy / 'docs' / 'walkthrough.ipynb').exists()
    page = (copy / 'docs' / 'walkthrough.md').read_text()
    seen = re.sub(r'<details>.*?</details>', '', page, flags=re.S)
    original = Path(ROOT, 'docs', 'walkthrough.md').read_text()
    # What a block's results state: a comment that gives what a print shows, or an assert.
    results = [line[line.find('#'):] if '#' in line else line
               for kind, code in page_cells(original) if kind == 'code'
               for line in split_results(code)[1] if '#' in line or line.startswith('assert')]
    assert len(results) >= 10
    for line in results:
        assert line in page and line not in seen, line


def test_no_test_or_check_in_the_handout_holds_an_answer_line(copy):
    answers = answer_lines()
    assert len(answers) >= 20
    files = [*(copy / 'tests').glob('*.py'), copy / 'test_lime.py',
             *(copy / 'exercises').glob('*.py')]
    for path in files:
        held = {line.split('#')[0].strip() for line in path.read_text().splitlines()} & answers
        assert not held, f"{path.relative_to(copy)} holds lines of the answers: {sorted(held)}"


def test_handout_ablation_run_plainly_says_the_answer_is_not_in_the_copy(copy):
    env = {key: value for key, value in os.environ.items()
           if key not in ('LIME_EXERCISES', 'PYTHONPATH')}
    result = subprocess.run([sys.executable, '-m', 'exercises.ablation'], cwd=copy, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stderr.strip() == (
        "error: exercises/answers.py, the repo's answer, is not in this copy (a student's handout "
        "leaves it out): train yours with LIME_EXERCISES=exercises/student.py python -m "
        "exercises.ablation")


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
