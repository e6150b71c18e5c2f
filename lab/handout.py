"""
handout.py: a student's copy of the lab, for a class: the files git tracks (as they are on disk)
without the answers and the results a student is asked to predict. Left out: LEFT_OUT below;
docs/walkthrough.md becomes its student edition, each block's results in the answer below it. In
the copy the page's check command fails each untouched exercise with "not written yet" and passes
them written right. From the repo root of a clone (docs/teaching.md says more):

    python -m lab.handout --out_dir=../lime-class
"""
import os
import shutil
import subprocess

from configurator import configure, fail, or_fail
from lab.notebook import student_page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# -----------------------------------------------------------------------------
out_dir = ''  # the student's copy: a new directory, or an empty one
# -----------------------------------------------------------------------------
# The answers, the wrong answers that test the checks, the teacher's notebook and its test.
LEFT_OUT = ('exercises/answers.py', 'tests/exercise_mistakes.py', 'docs/walkthrough.ipynb',
            'tests/test_walkthrough.py')
PAGE = 'docs/walkthrough.md'  # written as its student edition
CHECK = 'LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py'


def write_handout(out_dir):
    if not out_dir.strip():
        fail("name the student's copy: python -m lab.handout --out_dir=DIR")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        fail(f"{out_dir} exists and is not an empty directory: give a new one")
    root = os.path.realpath(ROOT)  # links followed: one that leads back in would copy into it
    if os.path.commonpath([root, os.path.realpath(out_dir)]) == root:
        fail(f"{out_dir} is inside the repo (links followed): give a directory outside it")
    listed = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        fail(f"lab.handout copies the files git tracks, and git cannot list them here: run it in "
             f"a clone ({listed.stderr.strip()})")
    for path in listed.stdout.split('\0'):
        source, target = os.path.join(ROOT, path), os.path.join(out_dir, path)
        if path in LEFT_OUT or not os.path.isfile(source):  # deleted, but not yet in a commit
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if path == PAGE:
            with open(source) as f, open(target, 'w') as out:
                out.write(student_page(f.read()))
        else:
            shutil.copy2(source, target)


if __name__ == '__main__':
    config, _, _ = configure(globals(), {})
    or_fail(write_handout, config['out_dir'])
    print(f"wrote {config['out_dir']}: without {', '.join(LEFT_OUT)}; {PAGE} as its student "
          f"edition; students check their answers there with: {CHECK}")
