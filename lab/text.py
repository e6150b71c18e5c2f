"""
text.py: LIMe against the baseline on English text at byte level, fairly (docs/results.md): each
router's rates tuned on seed 1 with one budget (the grid), then the routers compared at the rates
chosen over seeds, the held-out seeds last and reported apart. Runs are named by their settings
and go through lab/runs.py (finished kept, interrupted resumed: the same command again finishes a
set); each is scored on the whole validation split (lab/evaluate.py) into its final.json.

    python -m lab.text --stage=grid                          # 8 layers: every router and rate
    python -m lab.text config/lab/text.py --stage=compare    # `chosen` (config/lab/), seeds 1-4
    python -m lab.text config/lab/text.py --stage=report     # the tables and curves of what finished

The data, Shakespeare's and Milton's works: docs/results.md gets and prepares them.
"""
import json
import os
import subprocess
import sys

from configurator import configure, fail
from lab import plot, read_json, runs as launcher
from bookkeeping import write_json

# -----------------------------------------------------------------------------
stage = 'grid'  # 'grid', 'compare', 'all' (the two) or 'report' (see above)
data_dir = 'data/shakespeare_milton'  # byte-level shards (prepare.py --tokenizer=bytes)
out = 'out/text'  # each run in out/<stage>/<name>, as out/text/grid/L8_static_lr0.003_x1_s1
preset = 'config/depth_text.py'  # the model and batch; the keys below override its schedule
jobs = 2  # runs at a time, one CPU thread each
grid_steps = 1500  # training steps of a grid run: 16 x 128 bytes each, 3.1M bytes, half a pass
steps = 2200  # a comparison run's: within Shakespeare's plays, before Milton (docs/results.md)
warmup_iters = 100
eval_interval = 100  # the curves' validation points
eval_iters = 40  # batches of the validation split at each point (the final score reads all of it)
grid_layers = 8
grid_lrs = [1e-3, 3e-3, 1e-2, 3e-2]  # base learning rates the grid tries for every router
grid_router_x = [1, 3, 10]  # router_lr / learning_rate the grid tries for the routers
grid_routers = ['none', 'static', 'dynamic']  # -v1 (static-v1, dynamic-v1): memory='hidden'
grid_inits = ['noisy']  # the static router's starts the grid tries: 'noisy', 'identity'
chosen = []  # the comparison's (layers, router, lr, router_lr / lr, router_init): the grid's choice
seeds = [1, 2, 3, 4]  # the seed sets the initial weights only: every run sees the same batches
heldout_seeds = []  # seeds run after the others and reported apart
# -----------------------------------------------------------------------------
ROUTERS = ('none', 'static', 'dynamic', 'static-v1', 'dynamic-v1')


def run_name(layers, router, lr, x, init, seed):
    rate = f"lr{lr:g}" + (f"_x{x:g}" if router != 'none' else '')
    return f"L{layers}_{router}_{rate}{'_identity' if init == 'identity' else ''}_s{seed}"


def grid_runs():
    """The grid's settings, seed 1: every router at every rate (and start, for static)."""
    return [(grid_layers, r, lr, 0 if r == 'none' else x, init, 1) for lr in grid_lrs
            for r in grid_routers for x in ([0] if r == 'none' else grid_router_x)
            for init in (grid_inits if r == 'static' else ['noisy'])]


def compare_runs():
    """The chosen settings depth by depth, seed by seed (a set stopped part-way has whole depths to
    show); then the held-out seeds."""
    depths = list(dict.fromkeys(c[0] for c in chosen))
    return [(*c, seed) for group in (seeds, heldout_seeds) for L in depths for seed in group
            for c in chosen if c[0] == L]


def train_args(layers, router, lr, x, init, seed, n_steps):
    v1 = ['--memory=hidden'] if router.endswith('-v1') else []  # paper v1's routers
    return [preset, *v1, f'--seed={seed}', f'--data_dir={data_dir}', f'--n_layer={layers}',
            f"--router={router.removesuffix('-v1')}", f'--router_init={init}',
            f'--learning_rate={lr}', f'--router_lr={lr * x}', f'--min_lr={lr / 10}',
            f'--max_iters={n_steps}', f'--warmup_iters={warmup_iters}',
            f'--eval_interval={eval_interval}', f'--eval_iters={eval_iters}',
            '--always_save_checkpoint=True', '--device=cpu']


def score(run, output):
    """The run's bits per byte on the whole validation split, with its settings, into final.json."""
    result = subprocess.run([sys.executable, '-m', 'lab.evaluate', f'--out_dir={run}', '--task=',
                             f'--data_dir={data_dir}', '--device=cpu'], capture_output=True,
                            text=True, env=launcher.ENV)
    output.write(result.stdout + result.stderr)
    if result.returncode != 0:
        return False
    scored = json.loads(result.stdout.strip().splitlines()[-1])
    c = plot.read_log(run)[0]['config']  # the settings it trained with
    write_json(os.path.join(run, 'final.json'), {
        'layers': c['n_layer'], 'router': c['router'] + ('-v1' if c['memory'] == 'hidden' else ''),
        'learning_rate': c['learning_rate'], 'router_lr': c['router_lr'],
        'router_init': c['router_init'], 'seed': c['seed'], 'step': scored['step'],
        'bpb': scored['bpb']})
    return True


def label(record):
    """A record's router, with its start where it is not the authors': 'static (identity)'."""
    init = record.get('router_init', 'noisy')
    return record['router'] + ('' if init == 'noisy' else f" ({init})")


def grid_table(records):
    """Each router's bits per byte at each base rate (a column each) and router rate (a row each);
    then `as chosen`: each router's best setting, as `chosen` takes it."""
    lrs = sorted({r['learning_rate'] for r in records})
    lines = ['| router | router_lr | ' + ' | '.join(f"lr {lr:g}" for lr in lrs) + ' |',
             '|---|---|' + '---|' * len(lrs)]
    cells = {(label(r), round(r['router_lr'] / r['learning_rate'], 6), r['learning_rate']): r['bpb']
             for r in records}
    for router, x in sorted({key[:2] for key in cells}, key=lambda k: (ROUTERS.index(k[0].split()[0]), k)):
        lines.append(f"| {router} | {'-' if x == 0 else f'{x:g}x'} | " + ' | '.join(
            f"{cells[router, x, lr]:.4f}" if (router, x, lr) in cells else '-' for lr in lrs) + ' |')
    best = {}
    for r in sorted(records, key=lambda r: r['bpb']):
        best.setdefault(r['router'], r)
    lines.append('\nas chosen: [' + ', '.join(
        f"({r['layers']}, '{r['router']}', {r['learning_rate']:g}, "
        f"{round(r['router_lr'] / r['learning_rate'], 6):g}, '{r.get('router_init', 'noisy')}')"
        for r in sorted(best.values(), key=lambda r: ROUTERS.index(r['router']))) + ']')
    return '\n'.join(lines)


def compare_table(records):
    """Per depth: each router's bits per byte by seed, mean ± std, and its paired difference from
    none seed by seed (negative: better), over the seeds seen while choosing, the held-out, all."""
    lines, by_router = [], sorted(records, key=lambda r: ROUTERS.index(r['router']))
    groups = [('', seeds)] + [(', held out', heldout_seeds), (', all', seeds + heldout_seeds)] * bool(heldout_seeds)
    for L in sorted({r['layers'] for r in records}):
        for what, group in groups:
            bpb = {}
            for r in (r for r in by_router if r['layers'] == L and r['seed'] in group):
                bpb.setdefault(label(r), {})[r['seed']] = r['bpb']
            lines += ['', f"{L} layers{what}: final bits per byte on the whole validation split", '',
                      *plot.seed_table(bpb, 'none')]
    return '\n'.join(lines)


def main():
    config, _, _ = configure(globals(), {
        ('grid', 'compare', 'all', 'report'): ['stage'], 'path': ['data_dir', 'out', 'preset'],
        'positive': ['jobs', 'grid_steps', 'steps', 'eval_interval', 'eval_iters', 'grid_layers'],
        'non-negative': ['warmup_iters']})
    globals().update(config)
    if not all(isinstance(c, (tuple, list)) and len(c) == 5 and c[1] in ROUTERS for c in chosen):
        fail("chosen: expected (layers, router, learning_rate, router_lr multiple, router_init) "
             f"items, router one of {', '.join(ROUTERS)}, such as (8, 'static', 0.01, 1, 'noisy')")
    if stage in ('compare', 'all') and not chosen:
        fail("chosen is empty: run the grid (--stage=grid), read its table, and set chosen")
    if stage != 'report' and not os.path.isdir(data_dir):
        fail(f"no data in {data_dir}: docs/results.md says how to get the texts and prepare them")
    for name, settings, table, n_steps in (('grid', grid_runs(), grid_table, grid_steps),
                                           ('compare', compare_runs(), compare_table, steps)):
        if stage not in (name, 'all', 'report'):
            continue
        planned = {os.path.join(out, name, run_name(*s)): s for s in settings}
        if stage != 'report':
            launcher.launch({run: train_args(*s, n_steps) for run, s in planned.items()}, jobs,
                            score, 'final.json')
        records = {run: read_json(os.path.join(run, 'final.json'), 'run record') for run in planned
                   if os.path.exists(os.path.join(run, 'final.json'))}
        print(f"\n## {name}: {len(records)} of {len(planned)} runs finished")
        if records:
            print(table(list(records.values())))
        for L in sorted({r['layers'] for r in records.values()}) if name == 'compare' else []:
            at_depth = [run for run, r in records.items() if r['layers'] == L]
            plot.save(plot.plot_curves(at_depth), os.path.join(out, name, f'curves_L{L}.png'))


if __name__ == '__main__':
    main()
