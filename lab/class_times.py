"""
class_times.py: this machine's time for every part of docs/teaching.md's plans, beside the times
the page gives, for a teacher to run once on a lab machine before class. Each part runs as the
page's commands run it, at the thread count the page measured with (--threads): the student's
copy, the walkthrough's blocks by section, the student's notebook in a Jupyter kernel (skipped,
saying why, without the notebook's packages), the check, one training run of exercise 6 and a
tenth of the demonstration. From the repo root of a clone; about 3-5 minutes:

    python -m lab.class_times
    python -m lab.class_times --parts=walkthrough,check    # some parts only
"""
import contextlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from configurator import configure, fail, read_text

# -----------------------------------------------------------------------------
threads = 1  # OMP_NUM_THREADS for every part, as the page's commands set it
parts = 'handout,walkthrough,notebook,check,ablation,demo'  # which parts to time, in this order
# -----------------------------------------------------------------------------
PARTS = ('handout', 'walkthrough', 'notebook', 'check', 'ablation', 'demo')
# The page's times (docs/teaching.md, "What runs, and how long it takes"): CPU time, which a quiet
# machine shows on the clock. tests/test_class_times.py holds the page to them.
PAGE = {
    "the student's copy (lab.handout)": '1.5 s',
    'walkthrough, every section but 9': '0.1 s',
    'walkthrough, section 9 (two trainings, heatmaps)': '4.0 s',
    "the student's notebook, Run All": '8.1 s',
    'the check, untouched': '4.0 s',
    'the check, all six right': '5.0 s',
    'exercise 6: making data/pydoc_bytes, once': '',
    'exercise 6: one training run': '63.8 s',
    'exercise 6 as handed out: 9 runs': 'about 9.6 min',
    'the demonstration (lab.demo)': '5.1 min',
}
NOTEBOOK_PACKAGES = ('nbformat', 'nbclient', 'ipykernel')
DEMO_STEPS = 300  # a tenth of config/arith_demo.py's 3,000 steps


def row(part, here):
    print(f"{part:<50} {here:<32} {PAGE.get(part, '')}", flush=True)


def seconds(s):
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def timed(wall, cpu):
    """A part's time: its CPU time (what a quiet machine takes on the clock), and the clock's."""
    if cpu is None:  # the OS cannot say (Windows)
        return f"{seconds(wall)} on the clock"
    return f"{seconds(cpu)} CPU, {seconds(wall)} clock"


def run(command, env, cwd=None, ok=(0,)):
    """(wall seconds, CPU seconds of the child or None where the OS cannot say) of command; one
    line and a stop where it ends with another exit status than ok's."""
    try:
        import resource
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
    except ImportError:  # Windows
        resource = None
    t0 = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode not in ok:
        said = (done.stderr.strip() or done.stdout.strip() or '(nothing)').splitlines()[-1]
        fail(f"{' '.join(command[1:])} failed: {said}")
    cpu = None
    if resource is not None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu


def time_handout(env, copy):
    wall, cpu = run([sys.executable, '-m', 'lab.handout', f'--out_dir={copy}'], env)
    row("the student's copy (lab.handout)", timed(wall, cpu))


def time_walkthrough(env, copy):
    """Every block of the page in order, in one namespace, as a student types them (here, in
    this process); the time of section 9's blocks apart from the others'."""
    import torch
    from lab.notebook import page_cells
    torch.set_num_threads(threads)
    os.environ.setdefault('MPLBACKEND', 'Agg')  # section 9's heatmaps, drawn nowhere
    namespace = {'__name__': '__main__'}
    spent = {'9': [0.0, 0.0], 'other': [0.0, 0.0]}  # [clock, CPU] seconds
    section = None
    with torch.random.fork_rng(devices=[]):
        for kind, source in page_cells(read_text('docs/walkthrough.md', 'the walkthrough')):
            heading = re.match(r'## (\d+)\.', source) if kind == 'markdown' else None
            if heading:
                section = heading[1]
            if kind != 'code':
                continue
            t0, cpu0 = time.perf_counter(), time.process_time()
            try:
                with open(os.devnull, 'w') as quiet, contextlib.redirect_stdout(quiet):
                    exec(compile(source, 'docs/walkthrough.md', 'exec'), namespace)
            except Exception as e:
                fail(f"a block of docs/walkthrough.md's section {section} failed: "
                     f"{type(e).__name__}: {e}")
            part = spent['9' if section == '9' else 'other']
            part[0] += time.perf_counter() - t0
            part[1] += time.process_time() - cpu0
    row('walkthrough, every section but 9', timed(*spent['other']))
    row('walkthrough, section 9 (two trainings, heatmaps)', timed(*spent['9']))


def time_notebook(env, copy):
    missing = [name for name in NOTEBOOK_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        return row("the student's notebook, Run All",
                   f"skipped: {', '.join(missing)} not installed (pip install nbformat nbclient "
                   "ipykernel)")
    script = ("import nbformat\nfrom nbclient import NotebookClient\n"
              "nb = nbformat.read('docs/walkthrough_student.ipynb', as_version=4)\n"
              "NotebookClient(nb, timeout=600, kernel_name='python3',"
              " resources={'metadata': {'path': 'docs'}}).execute()\n")
    wall, cpu = run([sys.executable, '-c', script], env)
    row("the student's notebook, Run All", timed(wall, cpu))


def time_check(env, copy):
    """The student's check command in a class's copy: untouched (6 failed), then with the repo's
    answers in exercises/student.py (all pass)."""
    if not os.path.isdir(copy):
        run([sys.executable, '-m', 'lab.handout', f'--out_dir={copy}'], env)
    command = [sys.executable, '-m', 'pytest', '-q', 'tests/test_exercises.py', '-p',
               'no:cacheprovider']
    env = dict(env, LIME_EXERCISES='exercises/student.py')
    wall, cpu = run(command, env, cwd=copy, ok=(1,))  # exit 1: nothing is written yet
    row('the check, untouched', timed(wall, cpu))
    if not os.path.isfile('exercises/answers.py'):
        return row('the check, all six right', "skipped: exercises/answers.py is not in this copy")
    shutil.copy('exercises/answers.py', os.path.join(copy, 'exercises', 'student.py'))
    wall, cpu = run(command, env, cwd=copy)
    row('the check, all six right', timed(wall, cpu))


def time_ablation(env, copy):
    if not os.path.isfile('exercises/answers.py'):
        return row('exercise 6: one training run', "skipped: exercises/answers.py, the repo's "
                   "router, is not in this copy")
    if not os.path.isdir('data/pydoc_bytes'):  # prepare.py renames a whole set into place
        wall, cpu = run([sys.executable, 'prepare.py', '--tokenizer=bytes',
                         '--out_dir=data/pydoc_bytes'], env)
        row('exercise 6: making data/pydoc_bytes, once', timed(wall, cpu))
    wall, cpu = run([sys.executable, '-m', 'exercises.ablation', '--routers=first', '--seeds=1',
                     '--exercises=exercises/answers.py'], env)
    row('exercise 6: one training run', timed(wall, cpu))
    one = cpu if cpu is not None else wall
    row('exercise 6 as handed out: 9 runs', f"about {seconds(9 * one)} (9 x one run)")


def time_demo(env, copy):
    if not os.path.isfile('data/arith/task.json'):
        wall, cpu = run([sys.executable, '-m', 'lab.arith', '--mode=prepare'], env)
        row('the demonstration: making data/arith, once', timed(wall, cpu))
    with tempfile.TemporaryDirectory() as folder:
        wall, cpu = run([sys.executable, '-m', 'lab.demo', f'--max_iters={DEMO_STEPS}',
                         f'--threads={threads}', f'--out_dir={folder}'], env)
    # Two runs side by side: on two quiet cores the clock shows half their CPU time.
    row('the demonstration (lab.demo)', f"about {seconds(10 * (cpu or 2 * wall) / 2)} on two "
        f"cores (10 x {DEMO_STEPS} of its 3,000 steps)")


def main():
    config, _, _ = configure(globals(), {'positive': ['threads'], 'text': ['parts']})
    globals().update(config)
    chosen = [part.strip() for part in parts.split(',') if part.strip()]
    unknown = [part for part in chosen if part not in PARTS]
    if unknown or not chosen:
        fail(f"--parts={parts}: a comma-separated list of {', '.join(PARTS)}")
    if not os.path.isfile('lime.py'):
        fail("run it from the repo root, where lime.py is: python -m lab.class_times")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop('LIME_EXERCISES', None)
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, 'getloadavg') else ''
    print(f"this machine: {os.cpu_count()} CPUs{load}; {threads} thread(s) per part, "
          "OMP_NUM_THREADS as the page's commands set it")
    print(f"{'part':<50} {'here':<32} the page (docs/teaching.md, CPU)")
    with tempfile.TemporaryDirectory() as folder:
        copy = os.path.join(folder, 'class')  # the student's copy, for the check's times
        for part in PARTS:
            if part in chosen:
                globals()[f'time_{part}'](env, copy)


if __name__ == '__main__':
    main()
