"""
lab/handout.py, the student's copy: the check fails untouched exercises and passes right ones;
no answer line, nor a block's result outside an answer's fold; exercise 6 says what is missing;
an out_dir that holds files, or leads into the repo, is refused.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run
from exercises.checks import EXERCISES
from lab.handout import CHECK, LEFT_OUT
from lab.notebook import page_cells, split_results


def check_command(copy):
    """The page's check command, run in copy as a student runs it there."""
    env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
    env.update(LIME_EXERCISES='exercises/student.py')
    command = CHECK.split(' ', 1)[1].replace('python', sys.executable, 1)  # LIME_EXERCISES: env
    return subprocess.run([*command.split(), '-p', 'no:cacheprovider'], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope='module')
def copy(tmp_path_factory):
    if not (Path(ROOT) / '.git').exists() or shutil.which('git') is None:
        pytest.skip("not a git clone: lab.handout copies the files git tracks")
    copy = tmp_path_factory.mktemp('handout') / 'class'
    run('lab/handout.py', f'--out_dir={copy}')
    return copy


def test_handout_checks_fail_untouched_and_pass_when_right(copy, tmp_path):
    assert (copy / 'exercises' / 'student.py').is_file() and (copy / 'lime.py').is_file()
    assert not [path for path in LEFT_OUT if (copy / path).exists()]
    untouched = check_command(copy)
    assert untouched.returncode == 1, untouched.stdout
    for name in EXERCISES:
        assert f"{name}: not written yet" in untouched.stdout, name
    mine = tmp_path / 'class'  # the repo's answers, written into the student's file
    shutil.copytree(copy, mine)
    shutil.copy(os.path.join(ROOT, 'exercises', 'answers.py'), mine / 'exercises' / 'student.py')
    right = check_command(mine)
    assert right.returncode == 0, right.stdout


def test_handout_holds_no_answer_line_and_no_result_outside_an_answers_fold(copy):
    answers = {line.split('#')[0].strip() for line in  # the code of the answers' bodies
               Path(ROOT, 'exercises', 'answers.py').read_text().splitlines() if line[:1] == ' '}
    answers = {line for line in answers if len(line) >= 25} - {
        line.strip() for line in Path(ROOT, 'exercises', 'student.py').read_text().splitlines()}
    assert len(answers) >= 20
    for path in [*(copy / 'tests').glob('*.py'), *(copy / 'exercises').glob('*.py')]:
        held = {line.split('#')[0].strip() for line in path.read_text().splitlines()} & answers
        assert not held, f"{path.relative_to(copy)} holds lines of the answers: {sorted(held)}"
    page = (copy / 'docs' / 'walkthrough.md').read_text()
    seen = re.sub(r'<details>.*?</details>', '', page, flags=re.S)
    # What a block's results state: a comment that gives what a print shows, or an assert.
    results = [line[line.find('#'):] if '#' in line else line
               for kind, code in page_cells(Path(ROOT, 'docs', 'walkthrough.md').read_text())
               if kind == 'code' for line in split_results(code)[1]
               if '#' in line or line.startswith('assert')]
    assert len(results) >= 10
    for line in results:
        assert line in page and line not in seen, line
    teachers = json.loads(Path(ROOT, 'docs', 'walkthrough.ipynb').read_text())['cells']
    printed = [line.strip() for cell in teachers for output in cell.get('outputs', [])
               for line in ''.join(output.get('text', '')).splitlines()]
    assert not [line for line in printed if len(line) > 5 and line in seen]


def test_handout_ablation_run_plainly_says_the_answer_is_not_in_the_copy(copy):
    result = run('exercises/ablation.py', check=False, cwd=copy, env={'PYTHONPATH': str(copy)})
    assert result.returncode == 1 and result.stderr.strip() == (
        "error: exercises/answers.py, the repo's answer, is not in this copy (a student's handout "
        "leaves it out): train yours with LIME_EXERCISES=exercises/student.py python -m "
        "exercises.ablation")


def test_handout_refuses_an_out_dir_that_holds_files_or_that_a_link_leads_into_the_repo(tmp_path):
    (tmp_path / 'notes.txt').write_text("a teacher's notes\n")
    result = run('lab/handout.py', f'--out_dir={tmp_path}', check=False)
    assert result.stderr.strip() == f"error: {tmp_path} exists and is not an empty directory: " \
                                    "give a new one"
    os.symlink(ROOT, tmp_path / 'repo')
    out_dir = tmp_path / 'repo' / 'class-copy'  # outside, as written; inside, links followed
    result = run('lab/handout.py', f'--out_dir={out_dir}', check=False)
    assert result.stderr.strip() == f"error: {out_dir} is inside the repo (links followed): give " \
                                    "a directory outside it"
    assert not os.path.exists(os.path.join(ROOT, 'class-copy'))
