"""
demo.py: LIMe's effect in a class. The baseline and static LIMe train side by side, one thread each
(lab/runs.py), on the arithmetic task (config/arith_demo.py), starting over each time; their
validation losses print as they come, then lab/plot.py's table and curves (docs/teaching.md).

    python -m lab.demo                  # makes data/arith if missing; runs into out/demo/
    python -m lab.demo --seed=3 --max_iters=1500   # another seed, shorter (a busy machine)
"""
import math
import os
import shutil
import threading
import time

from configurator import configure, fail
from lab import arith, plot, runs

# -----------------------------------------------------------------------------
seed = 1  # both runs start from this seed: the same weights, routers aside
max_iters = 3000  # config/arith_demo.py's
out_dir = 'out/demo'  # the two runs, their output and the figure
data_dir = 'data/arith'  # python -m lab.arith --mode=prepare writes it here if missing
# -----------------------------------------------------------------------------


def val_losses(run):
    """{step: validation loss} of the run's log so far."""
    records = plot.read_log(run)[1] if os.path.isfile(os.path.join(run, 'log.txt')) else []
    return {r['step']: r['val_loss'] for r in records if 'val_loss' in r}


def main():
    config, _, _ = configure(globals(), {'positive': ['max_iters'], 'seed': ['seed'],
                                         'path': ['out_dir', 'data_dir']})
    if not os.path.isfile(os.path.join(config['data_dir'], 'task.json')):
        arith.main(['--mode=prepare', f"--out_dir={config['data_dir']}"])
    dirs = {r: os.path.join(config['out_dir'], f"{r}_s{config['seed']}") for r in ('none', 'static')}
    for run in dirs.values():
        shutil.rmtree(run, ignore_errors=True)  # a demonstration starts over
    args = [f"--{key}={config[key]}" for key in ('seed', 'max_iters', 'data_dir')]
    training = threading.Thread(target=runs.launch, args=(
        {run: ['config/arith_demo.py', *args, f'--router={r}'] for r, run in dirs.items()},))
    training.start()
    shown, started = set(), time.time()
    while True:
        ended = not training.is_alive()  # then read the logs once more
        none, static = (val_losses(run) for run in dirs.values())
        for step in sorted(set(none) & set(static) - shown):
            print(f"step {step:>5}: validation loss none {none[step]:.4f}, static {static[step]:.4f}",
                  flush=True)
            shown.add(step)
        if ended:
            break
        training.join(2)
    for router, run in dirs.items():
        if not os.path.isfile(os.path.join(run, 'time.json')):  # lab/runs.py writes it once trained
            fail(f"the {router} run stopped: its output is in {run}.txt")
    print(f"\nboth trained in {(time.time() - started) / 60:.1f} minutes\n")
    figure = plot.plot_curves(list(dirs.values()))
    # A loss in nats per character: e to the difference is the ratio of the perplexities.
    lower = 100 * (1 - math.exp(static[max(static)] - none[max(none)]))
    print(f"\nstatic LIMe's perplexity per character is {lower:.1f}% below the baseline's" if lower > 0
          else "\nhere the baseline ended lower")
    plot.save(figure, os.path.join(config['out_dir'], f"demo_s{config['seed']}.png"))


if __name__ == '__main__':
    main()
