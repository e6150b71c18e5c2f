"""
reading_path.py: the repo's lines that run on the way from `python train.py config/cpu_demo.py` to
its first optimizer step, measured rather than counted by hand: train.py runs (one step, into a
temporary out_dir) under a line tracer, and every line of a .py file of this repo that executes
before torch's optimizer step starts is counted once, per file, whatever folder it lives in
(kernels/ included, were it imported). The README's reading order states the result, and
tests/test_layout.py checks that it still does.

    python -m lab.reading_path
"""
import contextlib
import io
import os
import runpy
import subprocess
import sys
import tempfile
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIS = os.path.abspath(__file__)  # the tracer's own lines are not the path


def lines_run(argv):
    """{path relative to the repo: the line numbers that ran} for train.py run with argv, up to
    its first optimizer step."""
    ran = defaultdict(set)
    stopped = False

    def trace(frame, event, arg):
        nonlocal stopped
        code = frame.f_code
        if stopped:
            return None
        optim = os.sep + 'optim' + os.sep in code.co_filename
        if event == 'call' and code.co_name == 'step' and optim:
            stopped = True  # the first optimizer step: the path ends here
            return None
        path = os.path.abspath(code.co_filename)  # '<frozen os>' and the like: no file
        if not (path.startswith(ROOT + os.sep) and os.path.isfile(path)) or path == THIS:
            # torch's and the standard library's lines are not the repo's: no line events in
            # their frames (their calls into the repo still come here, as every call does)
            return None
        ran[os.path.relpath(path, ROOT)].add(frame.f_lineno)
        return trace

    old_argv = sys.argv
    sys.argv = ['train.py', *argv]
    sys.settrace(trace)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(os.path.join(ROOT, 'train.py'), run_name='__main__')
    finally:
        sys.settrace(None)
        sys.argv = old_argv
    return ran


if __name__ == '__main__':
    os.chdir(ROOT)  # train.py reads config/ from the repo root
    with tempfile.TemporaryDirectory() as out:
        # The demo's data is made first where missing, in a process of its own: a first run's
        # preparing it is not the path, and this one must import every module afresh.
        one_step = ['config/cpu_demo.py', '--max_iters=1', '--eval_iters=1']
        subprocess.run([sys.executable, 'train.py', *one_step, f'--out_dir={out}/first'],
                       check=True, capture_output=True)
        ran = lines_run([*one_step, f'--out_dir={out}/run'])
    for path, lines in sorted(ran.items(), key=lambda item: -len(item[1])):
        print(f"{path}: {len(lines)}")
    print(f"lines run: {sum(map(len, ran.values()))} in {len(ran)} files")
