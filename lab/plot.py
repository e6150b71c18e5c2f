"""
plot.py: tables and figures of the runs of train.py, lab/arith.py and lab/runs.py, and the figures
of lab/analyze.py's measurements. Without matplotlib the tables print.

    python -m lab.plot --runs=out/none,out/static,out/dynamic          # loss curves
    python -m lab.plot --mode=arith --runs='out/arith/L4_*'            # accuracy per operator count
    python -m lab.plot --mode=depth --runs='out/arith/*' --n_ops=6     # accuracy at 6 operators by depth

A run's directory is named by its settings and ends in _s<seed> (out/arith/L4_static_s1): runs
whose names differ only there are one setting's seeds, named by the rest (L4_static; by depth also
without L<layers>_). Figures draw a setting's mean in a band from its least to its most seed.
"""
import glob
import math
import os
import statistics

import numpy as np

from bookkeeping import write_whole
from configurator import configure, fail, or_fail
from lab import read_json

# -----------------------------------------------------------------------------
mode = 'curves'  # 'curves': losses by step and FLOPs; 'arith': accuracy by operator count; 'depth': by layers
runs = 'out/none,out/static,out/dynamic'  # comma-separated out_dirs or patterns such as out/arith/*
out = ''  # the PNG to write; '' means figures/<mode's figure>.png (DEFAULT_OUT)
n_ops = 6  # depth mode: the operator count whose accuracy is drawn (the paper's hardest tier)
# -----------------------------------------------------------------------------
DEFAULT_OUT = {'curves': 'figures/loss_curves.png', 'arith': 'figures/arith_accuracy.png',
               'depth': 'figures/arith_depth.png'}
COLORS = {'none': 'tab:gray', 'static': 'tab:blue', 'dynamic': 'tab:orange'}  # the rest: the cycle's


def pyplot():  # its backend: inline in a notebook, to files without a display
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return None  # matplotlib is optional
    return plt


def __getattr__(name):
    if name == 'plt':  # `from lab.plot import plt`: pyplot, or None without matplotlib
        return pyplot()
    raise AttributeError(f"module 'lab.plot' has no attribute {name!r}")


def run_dirs(spec):
    dirs = {}  # each once, in order
    for part in filter(None, spec.split(',')):  # paths or patterns
        if not (matches := sorted(glob.glob(part))):
            fail(f"--runs: no directory matches {part}")
        dirs.update(dict.fromkeys(matches))
    return list(dirs)


def read_log(run):
    records = read_json(os.path.join(run, 'log.txt'), 'log', lines=True)  # train.py's
    return records[0], records[1:]  # the run's record, then a record per step


def read_eval(run):
    """run/arith_eval.json's held-out accuracy per operator count (over all where none is held
    out), if it scored the checkpoint the log ends with: the last evaluation's (or lowest's, if only lower save)."""
    path = os.path.join(run, 'arith_eval.json')
    again = f"python -m lab.arith --mode=eval --ckpt_dir={run}"
    result = read_json(path, 'evaluation', f"run `{again}` first")
    header, records = read_log(run)
    vals = [(r['val_loss'], r['step']) for r in records if 'val_loss' in r and math.isfinite(r['val_loss'])]
    saved = vals[-1:] if header['config'].get('always_save_checkpoint', True) else sorted(vals)[:1]
    if [result.get('step')] != [step for _, step in saved]:
        fail(f"{path} scored another checkpoint than the one {run}/log.txt ends with: run `{again}`")
    return {int(k): result['accuracy_all'][k] if v is None else v for k, v in result['accuracy'].items()}


def by_setting(runs, depth_axis=False):
    """{setting: [run dir, ...]} in the order the settings first appear, each run's config, and the
    baseline: the setting whose runs have no router, if it is the only one."""
    configs = {run: read_log(run)[0]['config'] for run in runs}
    groups, seen = {}, {}
    for run, c in configs.items():
        name = os.path.basename(os.path.normpath(run)).removesuffix(f"_s{c['seed']}")
        name = name.removeprefix(f"L{c['n_layer']}_") if depth_axis else name
        if seen.setdefault((name, c['n_layer'], c['seed']), run) != run:
            fail(f"{seen[name, c['n_layer'], c['seed']]} and {run} are one setting's seed {c['seed']} twice")
        groups.setdefault(name, []).append(run)
    baselines = [name for name, members in groups.items() if configs[members[0]]['router'] == 'none']
    return groups, configs, baselines[0] if len(baselines) == 1 else None


def mean_std(values):
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def seed_table(results, baseline=None, higher_is_better=False, digits=4):
    """results: {setting name: {seed: value}} -> Markdown lines: a row per seed, mean ± std, and
    each setting's differences from the baseline (if present) on the seeds both have, how many better."""
    names = list(results)
    seeds = sorted({seed for values in results.values() for seed in values})
    number = f"{{:.{digits}f}}".format
    rows = [[str(seed)] + [number(results[n][seed]) if seed in results[n] else '-' for n in names]
            for seed in seeds]
    spreads = ['mean ± std'] + [' ± '.join(map(number, mean_std(list(results[n].values())))) for n in names]
    lines = markdown(['seed'] + names, rows + [spreads]).split('\n')
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
        lines.append(f"{name} - {baseline}, seed by seed: {', '.join(f'{d:+.{digits}f}' for d in diffs)}; "
                     f"mean {mean:+.{digits}f} ± {std:.{digits}f}; better in {better} of {len(diffs)}")
    return lines


def markdown(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    return '\n'.join(lines + ['| ' + ' | '.join(row) + ' |' for row in rows])


def draw_band(ax, x, values, router, i, label, marker=None):
    """A line through the mean of each row of values, in a band from its least to its most."""
    c = COLORS.get(router, f'C{i + 3}')  # the i-th setting's of the cycle for other routers
    ax.plot(x, [statistics.mean(v) for v in values], color=c, label=label, marker=marker)
    ax.fill_between(x, [min(v) for v in values], [max(v) for v in values], color=c, alpha=0.2, linewidth=0)


def plot_curves(runs):
    """Train and validation loss against step (top) and training FLOPs (bottom), a band per setting;
    a table of each run's last and best validation loss, and the last one by seed."""
    groups, configs, base = by_setting(runs)
    rows, last, plt = [], {}, pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.3), sharey='col') if plt else (None, None)
    for i, (name, members) in enumerate(groups.items()):
        curves = ([], [])  # train, val: {step: loss} of each seed
        for run in members:
            header, records = read_log(run)
            for curve, key in zip(curves, ('train_loss', 'val_loss')):
                curve.append({r['step']: r[key] for r in records if key in r})
            val = curves[1][-1]
            if val:
                last.setdefault(name, {})[configs[run]['seed']] = val[max(val)]
            rows.append([f"{name} seed {configs[run]['seed']}" if len(members) > 1 else name, run,
                         f"{header['params'] / 1e6:.2f}M", f"{val[max(val)]:.4f} (step {max(val)})" if val else '-',
                         f"{min(val.values()):.4f}" if val else '-'])
        c = configs[run]  # a setting's seeds train alike: a step's FLOPs
        flops = header['flops_per_token'] * c['batch_size'] * c['block_size'] * c['gradient_accumulation_steps']
        for col, seeds in enumerate(curves if fig else []):
            steps = sorted(set.intersection(*map(set, seeds)))  # where every seed has a loss
            for row, scale in enumerate((1, flops)):
                draw_band(axes[row, col], [scale * t for t in steps], [[d[t] for d in seeds] for t in steps],
                          configs[run]['router'], i, None if row + col else f"{name} ({len(members)})")
    print(markdown(['run', 'out_dir', 'parameters', 'last val loss', 'best val loss'], rows))
    if any(len(seeds) > 1 for seeds in last.values()):
        print('\nlast val loss, by seed\n', *seed_table(last, base), sep='\n')
    if fig:
        for col, what in enumerate(('train loss', 'validation loss')):
            axes[0, col].set(title=what, xlabel='step', ylabel='loss')
            axes[1, col].set(xlabel='training FLOPs', ylabel='loss')
        axes[0, 0].legend()
    return fig


def plot_arith(runs, k=None):
    """Held-out exact match (%) by operator count, or given k, at k operators by depth: a table and
    a band per setting; by operator count also the hardest count by seed, and training minutes."""
    groups, configs, base = by_setting(runs, depth_axis=k is not None)
    points, minutes = {name: {} for name in groups}, {}  # setting -> {x: {seed: %}}; minutes by seed
    for name, members in groups.items():
        for run in members:
            result = read_eval(run)
            if k is None and os.path.isfile(os.path.join(run, 'time.json')):  # lab/runs.py's
                spent = read_json(os.path.join(run, 'time.json'), 'time record')
                for what in ('cpu', 'wall'):
                    minutes.setdefault(f"{name} {what}", {})[configs[run]['seed']] = spent[f'train_{what}_s'] / 60
            if k is not None and k not in result:
                fail(f"{run}/arith_eval.json has no {k}-operator accuracy (choose --n_ops among {sorted(result)})")
            for x, share in ([(configs[run]['n_layer'], result[k])] if k else result.items()):
                points[name].setdefault(x, {})[configs[run]['seed']] = 100 * share
    xs = sorted({x for by_x in points.values() for x in by_x})
    xlabel = 'layers' if k else 'operators'
    print(markdown([xlabel] + [f"{name}: %{f' at {k} operators' if k else ''} (seeds)" for name in points], [
        [str(x)] + [' ± '.join(f"{v:.1f}" for v in mean_std(list(by_x[x].values()))) + f" ({len(by_x[x])})"
                    if x in by_x else '-' for by_x in points.values()] for x in xs]))
    if k is None:
        hardest = {name: by_x[xs[-1]] for name, by_x in points.items() if xs[-1] in by_x}
        print(f"\nheld-out exact match at {xs[-1]} operators, %, by seed\n",
              *seed_table(hardest, base, higher_is_better=True, digits=1), sep='\n')
        if minutes:
            print("\ntraining minutes a run, CPU (the process's user time) and wall\n",
                  *seed_table(minutes, digits=1), sep='\n')
    if (plt := pyplot()) is None:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (name, by_x) in enumerate(points.items()):
        x = sorted(by_x)
        draw_band(ax, x, [list(by_x[v].values()) for v in x], configs[groups[name][0]]['router'], i, name, 'o')
    ax.set(title=f'accuracy at {k} operators against depth' if k else 'arithmetic expressions: exact match',
           xlabel=xlabel, ylabel='accuracy on held-out expressions (%)', xscale='log' if k else 'linear',
           ylim=(0, 100))
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.legend()
    return fig


def main(argv=None):
    config, _, _ = configure(globals(), {('curves', 'arith', 'depth'): ['mode'], 'text': ['runs', 'out'],
                                         'positive': ['n_ops']}, argv)
    dirs = run_dirs(config['runs'])
    k = config['n_ops'] if config['mode'] == 'depth' else None
    fig = plot_curves(dirs) if config['mode'] == 'curves' else plot_arith(dirs, k)
    save(fig, config['out'] or DEFAULT_OUT[config['mode']], dpi=100)


def save(fig, path, dpi=120):
    """Write fig to path, whole or not at all (or one line why not); for None (no matplotlib) say so."""
    if fig is None:
        return print("no figure: matplotlib is not installed (pip install matplotlib); the tables above stand")
    or_fail(os.makedirs, os.path.dirname(path) or '.', exist_ok=True)
    fig.tight_layout()
    or_fail(write_whole, path, lambda f: fig.savefig(f, format=os.path.splitext(path)[1][1:] or 'png', dpi=dpi))
    pyplot().close(fig)
    print(f"wrote {path}")


# lab/analyze.py's figures: routing weights, a number per layer, the linear probe
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
