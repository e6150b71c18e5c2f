"""
plot.py: the tables and figures of what train.py, lab/arith.py and lab/runs.py record; and, for
analyze.py, the figures of what it measures inside checkpoints (every figure is drawn here).

    python -m lab.plot --runs=out/none,out/static,out/dynamic          # loss curves
    python -m lab.plot --mode=arith --runs='out/arith/L4_*'            # accuracy per operator count
    python -m lab.plot --mode=depth --runs='out/arith/*' --n_ops=6     # accuracy at 6 operators by depth

A run is an out_dir of train.py (its log.txt: the run's record, then a record per step; the arith
modes also read the arith_eval.json of `python -m lab.arith --mode=eval`, and lab/runs.py's
time.json where there is one). A run's directory is named by its settings and ends in _s<seed>
(out/arith/L4_static_s1): runs whose names differ only there are the seeds of one setting, named by
the rest (L4_static; in the depth figure also without L<layers>_). Tables give each seed, the
mean ± standard deviation, and each setting paired seed by seed with the baseline (router none);
figures draw each setting's mean in a band from its least to its most seed. Without matplotlib the
tables print and a line says so.
"""
import glob
import math
import os
import statistics
import sys

import numpy as np

from configurator import configure, fail
from lab import read_json
from bookkeeping import write_whole

# -----------------------------------------------------------------------------
mode = 'curves'  # 'curves': losses by step and FLOPs; 'arith': accuracy by operator count; 'depth': by layers
runs = 'out/none,out/static,out/dynamic'  # comma-separated out_dirs or patterns such as out/arith/*
out = ''  # the PNG to write; '' means figures/<mode's figure>.png (DEFAULT_OUT)
n_ops = 6  # depth mode: the operator count whose accuracy is drawn (the paper's hardest tier)
# -----------------------------------------------------------------------------
DEFAULT_OUT = {'curves': 'figures/loss_curves.png', 'arith': 'figures/arith_accuracy.png',
               'depth': 'figures/arith_depth.png'}
COLORS = {'none': 'tab:gray', 'static': 'tab:blue', 'dynamic': 'tab:orange'}  # the rest: the cycle's


def pyplot():
    """matplotlib.pyplot, drawing to files (in a notebook, inline), or None where not installed."""
    try:
        import matplotlib
        if 'ipykernel' not in sys.modules:
            matplotlib.use('Agg')  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def __getattr__(name):
    if name == 'plt':  # `from lab.plot import plt`: pyplot, or None without matplotlib
        return pyplot()
    raise AttributeError(f"module 'lab.plot' has no attribute {name!r}")


def run_dirs(spec):
    """The directories that spec (comma-separated paths or patterns) names, in order, each once."""
    dirs = []
    for part in filter(None, spec.split(',')):
        matches = sorted(glob.glob(part)) if glob.has_magic(part) else [part]
        if not matches:
            fail(f"--runs: no directory matches {part}")
        dirs += [d for d in matches if d not in dirs]
    return dirs


def read_log(run):
    """(the run's record, its step records) from run/log.txt."""
    path = os.path.join(run, 'log.txt')
    records = read_json(path, 'log', lines=True)  # train.py's log.txt
    ints = ('seed', 'n_layer', 'batch_size', 'block_size', 'gradient_accumulation_steps')
    if not (records and isinstance(records[0], dict) and isinstance(records[0].get('config'), dict)
            and all(type(records[0]['config'].get(k)) is int for k in ints)
            and all(isinstance(r, dict) and type(r.get('step')) is int for r in records[1:])):
        fail(f"{path}: not the log.txt that train.py writes (its first line the run's record)")
    return records[0], records[1:]


def read_eval(run):
    """run/arith_eval.json's accuracy per operator count (int keys): held out, the paper's measure,
    or where every expression is in training (1 operator) over all. It must have scored the
    checkpoint the log ends with: the last evaluation's, or the lowest's where only a lower one saves."""
    path = os.path.join(run, 'arith_eval.json')
    again = f"python -m lab.arith --mode=eval --ckpt_dir={run}"
    result = read_json(path, 'evaluation', f"run `{again}` first")
    header, records = read_log(run)
    vals = [(r['val_loss'], r['step']) for r in records if 'val_loss' in r and math.isfinite(r['val_loss'])]
    saved = vals[-1:] if header['config'].get('always_save_checkpoint', True) else sorted(vals)[:1]
    if not isinstance(result, dict) or [result.get('step')] != [step for _, step in saved]:
        fail(f"{path} scored another checkpoint than the one {run}/log.txt ends with: run `{again}`")
    return {int(k): result['accuracy_all'][k] if v is None else v for k, v in result['accuracy'].items()}


def by_setting(runs, depth_axis=False):
    """{setting: [run dir, ...]} in the order the settings first appear; and each run's config."""
    configs = {run: read_log(run)[0]['config'] for run in runs}
    groups, seen = {}, {}
    for run, c in configs.items():
        name = os.path.basename(os.path.normpath(run)).removesuffix(f"_s{c['seed']}")
        name = name.removeprefix(f"L{c['n_layer']}_") if depth_axis else name
        if seen.setdefault((name, c['n_layer'], c['seed']), run) != run:
            fail(f"{seen[name, c['n_layer'], c['seed']]} and {run} are one setting's seed "
                 f"{c['seed']} twice: give one of them")
        groups.setdefault(name, []).append(run)
    return groups, configs


def baseline(groups, configs):
    """The setting whose runs have no router, if it is the only one."""
    names = [name for name, members in groups.items() if configs[members[0]]['router'] == 'none']
    return names[0] if len(names) == 1 else None


def mean_std(values):
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def seed_table(results, baseline=None, higher_is_better=False, digits=4):
    """results: {setting name: {seed: value}} -> Markdown lines (a list of str): a row per seed, a
    mean ± std row, and per setting beside the baseline (if given and present) how many of the seeds
    both share it is better at, with the mean ± std of the paired differences."""
    names = list(results)
    seeds = sorted({seed for values in results.values() for seed in values})

    def number(value):
        return f"{value:.{digits}f}"

    def spread(values):
        values = list(values)
        if not values:
            return '-'
        cell = ' ± '.join(number(v) for v in mean_std(values))
        return cell if len(values) == len(seeds) else f"{cell} (n={len(values)})"

    lines = ['| seed | ' + ' | '.join(names) + ' |', '|---|' + '---|' * len(names)]
    for seed in seeds:
        cells = [number(results[n][seed]) if seed in results[n] else '-' for n in names]
        lines.append(f"| {seed} | " + ' | '.join(cells) + ' |')
    lines.append('| mean ± std | ' + ' | '.join(spread(results[n].values()) for n in names) + ' |')
    if baseline not in results:
        return lines
    lines.append('')
    for name in names:
        shared = [s for s in seeds if s in results[name] and s in results[baseline]]
        if name == baseline or not shared:
            continue
        diffs = [results[name][s] - results[baseline][s] for s in shared]
        better = sum(d > 0 if higher_is_better else d < 0 for d in diffs)
        mean, std = mean_std(diffs)
        each = ', '.join(f"{d:+.{digits}f}" for d in diffs)
        lines.append(f"{name} - {baseline}, seed by seed: {each}; mean {mean:+.{digits}f} ± "
                     f"{std:.{digits}f}; better in {better} of {len(diffs)}")
    return lines


def markdown(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    return '\n'.join(lines + ['| ' + ' | '.join(row) + ' |' for row in rows])


def color(members, configs, i):
    """A setting's colour, by its router."""
    return COLORS.get(configs[members[0]]['router'], f'C{i + 3}')


def draw_band(ax, x, values, c, label, marker=None):
    """A line through the mean of each row of values, in a band from its least to its most."""
    ax.plot(x, [statistics.mean(v) for v in values], color=c, label=label, marker=marker)
    ax.fill_between(x, [min(v) for v in values], [max(v) for v in values], color=c, alpha=0.2, linewidth=0)


# -----------------------------------------------------------------------------
# the three figures


def plot_curves(runs):
    """Train and validation loss against step (top) and training FLOPs (bottom), a line per setting:
    its seeds' mean, in a band from their least to their most."""
    groups, configs = by_setting(runs)
    rows, last, plt = [], {}, pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.3), sharey='col') if plt else (None, None)
    for i, (name, members) in enumerate(groups.items()):
        curves = ([], [])  # train, val: {step: loss} of each seed
        for run in members:
            header, records = read_log(run)
            c = header['config']
            for curve, key in zip(curves, ('train_loss', 'val_loss')):
                curve.append({r['step']: r[key] for r in records if key in r})
            val = curves[1][-1]
            if val:
                last.setdefault(name, {})[c['seed']] = val[max(val)]
            rows.append([f"{name} seed {c['seed']}" if len(members) > 1 else name, run,
                         f"{header['params'] / 1e6:.2f}M",
                         f"{val[max(val)]:.4f} (step {max(val)})" if val else '-',
                         f"{min(val.values()):.4f}" if val else '-'])
        flops = header['flops_per_token'] * c['batch_size'] * c['block_size'] * c[
            'gradient_accumulation_steps']  # a step's (a setting's seeds train alike)
        for col, seeds in enumerate(curves if fig else []):
            steps = sorted(set.intersection(*map(set, seeds)))  # where every seed has a loss
            for row, scale in enumerate((1, flops)):
                draw_band(axes[row, col], [scale * t for t in steps], [[d[t] for d in seeds] for t in steps],
                          color(members, configs, i), None if row + col else
                          name + (f" ({len(members)} seeds)" if len(members) > 1 else ''))
    print(markdown(['run', 'out_dir', 'parameters', 'last val loss', 'best val loss'], rows))
    if any(len(seeds) > 1 for seeds in last.values()):
        print('\nlast val loss, by seed\n\n' + '\n'.join(seed_table(last, baseline(groups, configs))))
    if fig:
        for col, what in enumerate(('train loss', 'validation loss')):
            axes[0, col].set(title=what, xlabel='step', ylabel='loss')
            axes[1, col].set(xlabel='training FLOPs', ylabel='loss')
        axes[0, 0].legend()
    return fig


def plot_arith(runs):
    """Exact-match accuracy against the number of operators, a line per setting; the tables: each
    count's mean ± std, the hardest count seed by seed, and the training minutes."""
    groups, configs = by_setting(runs)
    accuracy = {name: {configs[run]['seed']: read_eval(run) for run in members}
                for name, members in groups.items()}
    counts = sorted({k for results in accuracy.values() for result in results.values() for k in result})
    rows = [[str(k), str(k + 1)] + [' ± '.join(f"{100 * v:.1f}" for v in mean_std(
        [r[k] for r in results.values() if k in r])) for results in accuracy.values()] for k in counts]
    print(markdown(['operators', 'operands'] + [f"{name} ({len(groups[name])} seeds)" for name in groups],
                   rows))
    hardest = {name: {seed: 100 * r[counts[-1]] for seed, r in results.items()}
               for name, results in accuracy.items()}
    print(f"\nheld-out exact match at {counts[-1]} operators, %, by seed\n")
    print('\n'.join(seed_table(hardest, baseline(groups, configs), higher_is_better=True, digits=1)))
    minutes = {}  # lab/runs.py's time.json
    for name, members in groups.items():
        for run in [run for run in members if os.path.isfile(os.path.join(run, 'time.json'))]:
            spent = read_json(os.path.join(run, 'time.json'), 'time record')
            for what in ('cpu', 'wall'):
                minutes.setdefault(f"{name} {what}", {})[configs[run]['seed']] = spent[f'train_{what}_s'] / 60
    if minutes:
        print("\ntraining minutes a run, CPU (the process's user time) and wall\n")
        print('\n'.join(seed_table(minutes, digits=1)))
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (name, results) in enumerate(accuracy.items()):
        ks = [k for k in counts if all(k in r for r in results.values())]
        draw_band(ax, ks, [[100 * r[k] for r in results.values()] for k in ks], color(groups[name], configs, i),
                  f"{name} ({len(results)} seeds)", 'o')
    ax.set(title='arithmetic expressions: exact match', xlabel="operators (the paper's tiers, see arith.py)",
           ylabel='accuracy on held-out expressions (%)', xticks=counts, ylim=(0, 100))
    ax.legend()
    return fig


def plot_depth(runs, k):
    """Accuracy at k operators against the number of layers, a line per setting."""
    groups, configs = by_setting(runs, depth_axis=True)
    points = {}  # setting -> {n_layer: [accuracy of each seed]}
    for name, members in groups.items():
        for run in members:
            result = read_eval(run)
            if k not in result:
                fail(f"{run}/arith_eval.json has no {k}-operator accuracy (choose --n_ops among {sorted(result)})")
            points.setdefault(name, {}).setdefault(configs[run]['n_layer'], []).append(100 * result[k])
    depths = sorted({d for by_depth in points.values() for d in by_depth})
    print(markdown(['layers'] + [f"{name}: % at {k} operators (seeds)" for name in points], [
        [str(d)] + [' ± '.join(f"{v:.1f}" for v in mean_std(by_depth[d])) + f" ({len(by_depth[d])})"
                    if d in by_depth else '-' for by_depth in points.values()] for d in depths]))
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (name, by_depth) in enumerate(points.items()):
        ds = sorted(by_depth)
        draw_band(ax, ds, [by_depth[d] for d in ds], color(groups[name], configs, i), name, 'o')
    ax.set(title=f'accuracy at {k} operators against depth', xlabel='layers', xscale='log',
           ylabel='accuracy on held-out expressions (%)', ylim=(0, 100))
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.legend()
    return fig


def main(argv=None):
    config, _, _ = configure(globals(), {('curves', 'arith', 'depth'): ['mode'], 'text': ['runs', 'out'],
                                         'positive': ['n_ops']}, argv)
    dirs = run_dirs(config['runs'])
    if not dirs:
        fail("--runs names no directory")
    if config['mode'] == 'curves':
        fig = plot_curves(dirs)
    elif config['mode'] == 'arith':
        fig = plot_arith(dirs)
    else:
        fig = plot_depth(dirs, config['n_ops'])
    save(fig, config['out'] or DEFAULT_OUT[config['mode']], dpi=100)


def save(fig, path, dpi=120):
    """Write fig to path (making its directory), whole or not at all, or one line saying why not;
    for a fig of None (no matplotlib), one line saying so."""
    if fig is None:
        return print("no figure: matplotlib is not installed (pip install matplotlib); the tables "
                     "above stand")
    try:
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        fig.tight_layout()
        write_whole(path, lambda f: fig.savefig(f, format=os.path.splitext(path)[1][1:] or 'png', dpi=dpi))
    except (OSError, ValueError) as e:  # ValueError: a format matplotlib does not write
        fail(f"cannot write {path}: {getattr(e, 'strerror', None) or e}")
    pyplot().close(fig)
    print(f"wrote {path}")


# -----------------------------------------------------------------------------
# analyze.py's figures: routing weights, a number per layer, the linear probe


def routing_figure(name, weights):
    """A checkpoint's routing weights (n_layer, G, n_layer) as a heatmap: a row per layer and kv head."""
    plt, L, G, _ = pyplot(), *weights.shape
    unreadable = weights.new_ones(L, L).triu(1).bool()[:, None, :]  # (L, 1, L): source m > layer l
    image = weights.masked_fill(unreadable, float('nan')).reshape(L * G, L)  # row l * G + g; nan: blank
    fig, ax = plt.subplots(figsize=(1.5 + 0.4 * L, 1.5 + min(6.0, 0.25 * L * G)))
    im = ax.imshow(image.numpy(), vmin=0.0, vmax=1.0, aspect='auto', interpolation='nearest')
    for l in range(1, L):
        ax.axhline(l * G - 0.5, color='white', linewidth=1)  # separates the layers' blocks of heads
    ax.locator_params(axis='x', integer=True)
    labelled = range(0, L, max(1, L // 12))  # at most about a dozen layer labels
    ax.set_yticks([l * G + (G - 1) / 2 for l in labelled], [str(l) for l in labelled])
    ax.set(title=f'{name}: routing weights', xlabel='source layer', ylabel=f'layer ({G} kv heads each)')
    fig.colorbar(im, ax=ax, label='share of the weight')
    return fig


def layer_figure(curves, title, xlabel, ylabel):
    """Curves {checkpoint name: a number per layer}, a line each."""
    fig, ax = pyplot().subplots(figsize=(5, 3.5))
    for name, ys in curves.items():
        ax.plot(range(len(ys)), ys, marker='o', label=name)
    ax.locator_params(axis='x', integer=True)  # layers are whole numbers
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend()
    return fig


def probe_figure(accuracy, chance):
    """accuracy: {feature kind: {checkpoint name: [(mean, std) per layer]}}, a panel per kind."""
    fig, axes = pyplot().subplots(1, len(accuracy), figsize=(4.5 * len(accuracy), 3.5), sharey=True, squeeze=False)
    for ax, (kind, curves) in zip(axes[0], accuracy.items()):
        for name, points in curves.items():
            mean, std = np.array(points).T
            layers = np.arange(len(mean))
            line, = ax.plot(layers, mean, marker='o', label=name)
            ax.fill_between(layers, mean - std, mean + std, color=line.get_color(), alpha=0.2)  # mean ± std
        ax.axhline(chance, color='gray', linestyle='--', label='chance')
        ax.locator_params(axis='x', integer=True)  # layers are whole numbers
        ax.set(title=f'linear probe: {kind}', xlabel='layer', ylim=(0.0, 1.05))
    axes[0, 0].set_ylabel('held-out accuracy')
    axes[0, 0].legend()
    return fig


if __name__ == '__main__':
    main()
