"""
runs.py: train.py runs, `jobs` at a time with one CPU thread each. A run is a directory, named by
its settings, and train.py's arguments; train.py's output goes to <directory>.txt. A finished run
(its `done` file exists) is kept, an interrupted one (a checkpoint) resumed, the rest start from
scratch: the same command again finishes a set. `then` (a command, {run} the directory) scores a
run after training; time.json holds the training's wall and CPU seconds (its last start's).

    python -m lab.runs --done=arith_eval.json --then='python -m lab.arith --mode=eval --ckpt_dir={run}' \
        'out/arith/none_s1 config/arith.py --router=none' 'out/arith/static_s1 config/arith.py'
"""
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bookkeeping import write_json
from configurator import configure, fail

# -----------------------------------------------------------------------------
jobs = 2  # runs at a time, one CPU thread each
done = 'time.json'  # the file in a run's directory that says it is finished
then = ''  # a command run after training, {run} standing for the run's directory
# -----------------------------------------------------------------------------
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}  # one core a run: a second thread mostly waits


def train(run, args, then=None):
    """train.py on args into run (resumed from its checkpoint), then then(run, output file): whether both did."""
    if os.path.exists(os.path.join(run, 'ckpt.pt')):  # interrupted: its settings are saved
        args = ['--init_from=resume']
    os.makedirs(os.path.dirname(run) or '.', exist_ok=True)
    with open(run + '.txt', 'a') as output:
        started = time.time()
        child = subprocess.Popen([sys.executable, 'train.py', *args, f'--out_dir={run}'],
                                 stdout=output, stderr=subprocess.STDOUT, env=ENV)
        _, status, usage = os.wait4(child.pid, 0)  # the child's own CPU time, beside the others'
        ok = os.waitstatus_to_exitcode(status) == 0
        if ok:
            write_json(os.path.join(run, 'time.json'), {'train_wall_s': time.time() - started,
                                                        'train_cpu_s': usage.ru_utime})
            ok = then is None or then(run, output)
    print(f"done: {run}" if ok else f"failed: {run} (see {run}.txt)", flush=True)
    return ok


def launch(runs, jobs=2, then=None, done='time.json'):
    """runs: {directory: train.py's arguments}. Trains every run not finished, jobs at a time;
    returns the finished ones."""
    todo = {run: args for run, args in runs.items() if not os.path.exists(os.path.join(run, done))}
    print(f"{len(runs) - len(todo)} of {len(runs)} runs finished; running {len(todo)}, {jobs} at "
          "a time", flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda run: train(run, todo[run], then), todo))
    return [run for run in runs if os.path.exists(os.path.join(run, done))]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    config, _, _ = configure(globals(), {'positive': ['jobs'], 'path': ['done'], 'text': ['then']},
                             [arg for arg in argv if arg.startswith('-')])
    runs = dict((spec[0], spec[1:]) for spec in (shlex.split(a) for a in argv if a[:1] != '-'))

    def score(run, output):
        command = shlex.split(config['then'].replace('{run}', shlex.quote(run)))
        return subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, env=ENV).returncode == 0
    finished = launch(runs, config['jobs'], score if config['then'] else None, config['done'])
    if len(finished) < len(runs):
        fail(f"{len(runs) - len(finished)} of {len(runs)} runs failed: their output is in <run>.txt")


if __name__ == '__main__':
    main()
