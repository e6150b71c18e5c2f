"""
reading_path.py: how much code a reader visits on the way from `python train.py config/cpu_demo.py`
to its first optimizer step, measured rather than counted by hand. train.py runs (one step, into a
temporary out_dir) under a profiler that records each function of the top-level files that is
called on the way by train.py or by lime.py / prepare.py code (configurator.or_fail passes calls
through); the functions' source lines are then summed per file. The README's reading order states
the result, and tests/test_layout.py checks that it still does.

    python -m lab.reading_path                                # on data/pydoc_bytes, as the demo
    python -m lab.reading_path --data_dir=data/pydoc_bytes

What counts: all of train.py; of lime.py its docstring and imports; a function's lines from its
first decorator to its last line; a class's header, docstring and fields, and the methods that ran.
bookkeeping.py's functions are taken at their names (a first reading need not
open them), as are the configurator's helpers behind configure. Two totals: every function run,
and the same with prepare.py's file helpers (HELPERS: the shard format, the tokenizer, the bytes
per token, the quick start's data) also taken at their names, so that of prepare.py only Batches
is read.
"""
import ast
import contextlib
import io
import os
import runpy
import sys
import tempfile

from configurator import configure
from prepare import prepare_if_default

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLLOWED = ('train.py', 'lime.py', 'prepare.py')  # calls made from these files are followed
COUNTED = ('lime.py', 'prepare.py', 'configurator.py')  # the files whose functions are counted
HELPERS = ('read_shard', 'shard_path', 'shard_paths', 'token_bytes', 'data_tokenizer',
           'prepare_if_default')
# -----------------------------------------------------------------------------
data_dir = 'data/pydoc_bytes'  # the demo's data (train.py prepares it where missing)
# -----------------------------------------------------------------------------


def repo_file(code):
    """The top-level file of this repo that code comes from, or None."""
    path = os.path.abspath(code.co_filename)
    if os.path.dirname(path) == ROOT and path.endswith('.py'):
        return os.path.basename(path)
    return None


def functions_run(argv):
    """{(file, first line, name)} of the functions of COUNTED that train.py, run with argv, calls
    (through FOLLOWED files) before its first optimizer step."""
    seen = set()
    stopped = False

    def profile(frame, event, arg):
        nonlocal stopped
        if event != 'call' or stopped:
            return
        code = frame.f_code
        if code.co_name == 'step' and os.sep + 'optim' + os.sep in code.co_filename:
            stopped = True  # the first optimizer step: the path ends here
            return
        name = repo_file(code)
        if name not in COUNTED:
            return
        caller = frame.f_back  # the nearest frame of a repo file, or_fail passed through
        while caller is not None and (repo_file(caller.f_code) is None
                                      or caller.f_code.co_name == 'or_fail'):
            caller = caller.f_back
        if caller is not None and repo_file(caller.f_code) in FOLLOWED:
            seen.add((name, code.co_firstlineno, code.co_name))

    old_argv = sys.argv
    sys.argv = ['train.py', *argv]
    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(os.path.join(ROOT, 'train.py'), run_name='__main__')
    finally:
        sys.setprofile(None)
        sys.argv = old_argv
    return seen


def lines_read(name, seen, skip=()):
    """{function or class name: its lines read} of file name, given the functions run."""
    tree = ast.parse(open(os.path.join(ROOT, name), encoding='utf-8').read())

    def first_line(node):  # a decorated function's code starts at its first decorator
        return min([node.lineno] + [d.lineno for d in node.decorator_list])

    def ran(node):
        return any(file == name and fn == node.name and first_line(node) <= line <= node.end_lineno
                   for file, line, fn in seen)

    def span(node):
        return set(range(first_line(node), node.end_lineno + 1))

    read = {}
    if name == 'lime.py':  # the model is read from its top: the docstring says what differs
        first = next(n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)))
        read['docstring and imports'] = set(range(1, first.lineno))
        read['docstring and imports'] -= span(first)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and ran(node) and node.name not in skip:
            read[node.name] = span(node)
        elif isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef) and ran(m)]
            if methods:
                lines = {node.lineno} | set().union(*(span(m) for m in methods))
                for part in node.body:  # the docstring and the fields
                    if isinstance(part, (ast.Expr, ast.Assign, ast.AnnAssign)):
                        lines |= set(range(part.lineno, part.end_lineno + 1))
                read[node.name] = lines
    return {key: len(lines) for key, lines in read.items()}


def measure(data_dir):
    """{'train.py': lines, file: {name: lines}} for both totals: (every function run, helpers
    at their names)."""
    # Made first where missing, so that the count is the same on a fresh clone: a first run's
    # preparing the data is not the path to the training step.
    with contextlib.redirect_stdout(io.StringIO()):
        prepare_if_default(data_dir)
    with tempfile.TemporaryDirectory() as out:
        seen = functions_run(['config/cpu_demo.py', f'--data_dir={data_dir}', f'--out_dir={out}',
                              '--max_iters=1', '--eval_iters=1'])
    train_lines = len(open(os.path.join(ROOT, 'train.py'), encoding='utf-8').readlines())
    every = {'train.py': train_lines, **{f: lines_read(f, seen) for f in COUNTED}}
    named = {'train.py': train_lines, **{f: lines_read(f, seen, HELPERS) for f in COUNTED}}
    return every, named


def total(counts):
    return sum(v if isinstance(v, int) else sum(v.values()) for v in counts.values())


if __name__ == '__main__':
    config, _, _ = configure(globals(), {'path': ['data_dir']})
    data_dir = config['data_dir']
    os.chdir(ROOT)  # train.py reads config/ from the repo root
    every, named = measure(data_dir)
    for file, counts in every.items():
        if isinstance(counts, int):
            print(f"{file}: {counts} (all of it)")
        else:
            parts = ', '.join(f"{k} {v}" for k, v in counts.items())
            print(f"{file}: {sum(counts.values())} ({parts})")
    print(f"every function run: {total(every)} lines in {len(every)} files")
    print(f"prepare.py's helpers at their names ({', '.join(HELPERS)}): {total(named)} lines")
