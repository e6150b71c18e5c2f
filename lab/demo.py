"""
demo.py: a class demonstration of LIMe's effect on a laptop. The LLaMA baseline and static LIMe
train side by side, one process and one thread each, on the paper's arithmetic task (lab/arith.py,
config/arith_demo.py: 4 layers, width 32, 3,000 steps); it prints their validation losses as they
come and a table at the end, and draws both curves if matplotlib is installed. docs/teaching.md
gives its time and the seeds at which static LIMe ended below the baseline.

    python -m lab.demo             # makes data/arith if missing; runs into out/demo/
    python -m lab.demo --seed=3    # another seed
"""
import json
import math
import os
import subprocess
import sys
import time

from configurator import configure, fail

# -----------------------------------------------------------------------------
seed = 1  # both runs start from this seed: the same weights, routers aside
threads = 1  # per run: two runs side by side fill two cores
max_iters = 3000  # config/arith_demo.py's; fewer for a quick look
out_dir = 'out/demo'  # the two runs, their logs and the figure
data_dir = 'data/arith'  # python -m lab.arith --mode=prepare writes it here if missing
# -----------------------------------------------------------------------------
ROUTERS = ('none', 'static')
CONFIG = 'config/arith_demo.py'


def start(router, env):
    """train.py on CONFIG with router, in the background; its output goes to a file beside."""
    run = os.path.join(out_dir, f'{router}_s{seed}')
    os.makedirs(out_dir, exist_ok=True)
    command = [sys.executable, 'train.py', CONFIG, f'--router={router}', f'--seed={seed}',
               f'--max_iters={max_iters}', f'--out_dir={run}', f'--data_dir={data_dir}',
               '--overwrite=True']  # a demonstration starts over
    with open(f'{run}.train.txt', 'w') as output:
        return subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)


def val_losses(router):
    """{step: validation loss} of the run's log.txt so far (its records after the first)."""
    path = os.path.join(out_dir, f'{router}_s{seed}', 'log.txt')
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        lines = f.read().splitlines()
    records = []
    for line in lines[1:]:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return {r['step']: r['val_loss'] for r in records if 'val_loss' in r}


def train_both():
    """Both runs, side by side, each eval printed as it lands; their curves when both end."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    runs = {router: start(router, env) for router in ROUTERS}
    shown = set()
    try:
        while any(run.poll() is None for run in runs.values()):
            time.sleep(2)
            show_new(shown)
    except KeyboardInterrupt:
        for run in runs.values():
            run.terminate()
        raise
    for router, run in runs.items():
        if run.returncode != 0:
            output = os.path.join(out_dir, f'{router}_s{seed}.train.txt')
            with open(output) as f:
                said = (f.read().strip() or '(nothing)').splitlines()[-1]
            fail(f"the {router} run stopped: {said} (its output: {output})")
    show_new(shown)
    return {router: val_losses(router) for router in ROUTERS}


def show_new(shown):
    """Prints each step at which both runs have a validation loss, once."""
    curves = {router: val_losses(router) for router in ROUTERS}
    for step in sorted(set(curves['none']) & set(curves['static']) - shown):
        none, static = curves['none'][step], curves['static'][step]
        print(f"step {step:>5}: validation loss none {none:.4f}, static {static:.4f}", flush=True)
        shown.add(step)


def draw(curves, path):
    """Both curves, validation loss against step, into path; one line where matplotlib is not."""
    try:
        import matplotlib
        matplotlib.use('Agg')  # a file, no window
        import matplotlib.pyplot as plt
    except ImportError:
        return print("no figure: matplotlib is not installed (pip install matplotlib); the "
                     "numbers above are the whole result")
    fig, ax = plt.subplots(figsize=(6, 4))
    for router, label in (('none', 'LLaMA baseline'), ('static', 'static LIMe')):
        steps = sorted(curves[router])
        ax.plot(steps, [curves[router][s] for s in steps], marker='.', label=label)
    ax.set_xlabel('step')
    ax.set_ylabel('validation loss (nats per character)')
    ax.set_title(f'Arithmetic task, 4 layers, seed {seed}')
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main():
    config, _, _ = configure(globals(), {
        'positive': ['threads', 'max_iters'], 'seed': ['seed'], 'path': ['out_dir', 'data_dir']})
    globals().update(config)
    if not os.path.isfile(os.path.join(data_dir, 'task.json')):
        made = subprocess.run([sys.executable, '-m', 'lab.arith', '--mode=prepare',
                               f'--out_dir={data_dir}'], capture_output=True, text=True)
        if made.returncode != 0:
            fail(f"making {data_dir}: {made.stderr.strip().splitlines()[-1]}")
    print(f"training none and static side by side, {max_iters} steps, seed {seed}, {threads} "
          f"thread(s) each, into {out_dir}/", flush=True)
    t0 = time.time()
    curves = train_both()
    minutes = (time.time() - t0) / 60
    last = max(curves['none'])
    none, static = curves['none'][last], curves['static'][last]
    print(f"\nafter {last} steps ({minutes:.1f} minutes): validation loss none {none:.4f}, "
          f"static {static:.4f}")
    # A loss in nats per character: e to the difference is the ratio of the perplexities.
    lower = 100 * (1 - math.exp(static - none))
    if lower > 0:
        print(f"static LIMe's perplexity per character is {lower:.1f}% below the baseline's")
    else:
        print("here the baseline ended lower")
    draw(curves, os.path.join(out_dir, f'demo_s{seed}.png'))


if __name__ == '__main__':
    main()
