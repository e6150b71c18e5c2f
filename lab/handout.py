"""
handout.py: a student's copy of the lab, for a class: the repo's files without the results a
student is asked to predict and without the answers. Left out: the exercises' answers
(exercises/answers.py), the wrong answers that test the checks (exercises/wrong.py), the teacher's
notebook (docs/walkthrough.ipynb, every block's output beside it) and its test
(tests/test_walkthrough.py); docs/walkthrough.md becomes its student edition, each block's
results folded into the answer below it, as in docs/walkthrough_student.ipynb, which stays. In
the copy the page's check command runs the six checks on exercises/student.py: untouched, each
fails with "not written yet"; written right, all pass; the tests that need the answers skip,
saying why. It copies the files git tracks, as they are on disk, so run it in a clone, from the
repo root (docs/teaching.md says more):

    python -m lab.handout --out_dir=../lime-class
    cd ../lime-class    # then, as the page says:
    LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py
"""
import os
import shutil
import subprocess

from configurator import configure, fail
from lab.notebook import student_page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# -----------------------------------------------------------------------------
out_dir = ''  # the student's copy: a new directory, or an empty one
# -----------------------------------------------------------------------------
# The answers, the checks' tests, and the teacher's notebook with its test.
LEFT_OUT = ('exercises/answers.py', 'exercises/wrong.py', 'docs/walkthrough.ipynb',
            'tests/test_walkthrough.py')
PAGE = 'docs/walkthrough.md'  # written as its student edition (lab/notebook.py's student_page)
CHECK = 'LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py'


def tracked_files():
    """The paths, relative to the repo root, of the files git tracks; one line where git cannot
    say (not a clone, or no git)."""
    try:
        listed = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        why = e.stderr.strip() if getattr(e, 'stderr', None) else str(e)
        fail(f"lab.handout copies the files git tracks, and git cannot list them here ({why}): "
             "run it in a clone of the repo")
    return [path for path in listed.split('\0') if path]


def write_handout(out_dir):
    """Copies the tracked files but LEFT_OUT into out_dir; how many it copied."""
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        fail(f"{out_dir} exists and is not an empty directory: give a new one")
    # Links followed: a link outside that leads back in would have the copy written into the repo
    root = os.path.realpath(ROOT)
    if os.path.commonpath([root, os.path.realpath(out_dir)]) == root:
        fail(f"{out_dir} is inside the repo (links followed): give a directory outside it")
    copied = 0
    for path in tracked_files():
        source = os.path.join(ROOT, path)
        if path in LEFT_OUT or not os.path.isfile(source):  # deleted, but not yet in a commit
            continue
        target = os.path.join(out_dir, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if path == PAGE:
            with open(source) as f:
                page = student_page(f.read())
            with open(target, 'w') as f:
                f.write(page)
        else:
            shutil.copy2(source, target)
        copied += 1
    return copied


def main():
    config, _, _ = configure(globals(), {})
    if not config['out_dir'].strip():
        fail("name the student's copy: python -m lab.handout --out_dir=DIR")
    try:
        copied = write_handout(config['out_dir'])
    except OSError as e:
        fail(f"cannot write {e.filename or config['out_dir']}: {e.strerror or e}")
    print(f"wrote {config['out_dir']}: {copied} files, without {', '.join(LEFT_OUT)}, and "
          f"{PAGE} as its student edition")
    print(f"students check their answers there with: {CHECK}")


if __name__ == '__main__':
    main()
