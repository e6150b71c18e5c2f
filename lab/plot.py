"""
plot.py: draw what train.py and arith.py record, one figure and one Markdown table per command; and,
for analyze.py, the figures of what it measures inside checkpoints (every figure is drawn here).

    python -m lab.plot --runs=out/none,out/static,out/dynamic                     # loss curves
    python -m lab.plot --runs='out/text/L8_*' --band=True                         # a band per setting
    python -m lab.plot --mode=arith --runs='out/arith/L4_*'                       # accuracy per operator count
    python -m lab.plot --mode=depth --runs='out/arith/*' --n_ops=6                # accuracy at 6 operators by depth

A run is an out_dir of train.py: its log.txt opens with the run's record (its settings, parameter
count and FLOPs per token), then one JSON record per logged or evaluated step. The arith modes also
read the arith_eval.json that `python -m lab.arith --mode=eval` writes beside the checkpoint. --runs takes
directories or shell patterns, separated by commas.

Runs that differ only in their seed are one setting: the loss curves keep a line per run, one colour
per setting (with --band=True, a line per setting, its seeds' mean, in a band from their least to
their most at each step); the arith figures draw each setting's mean with a band from its worst to
its best seed, and the tables give mean ± standard deviation over the seeds. A setting is named by
its router and by every setting in which the runs given differ (say `static lr=0.003`; a
baseline's router_lr and the static router's start, router_init, in the other routers' runs, which
they never use, do not count), so runs that differ in more than the seed are never averaged
together. What does not change the numbers (where the run
lives, the path it reached its data by, the device, compile, how often it logs) does not count. An
arith_eval.json is drawn only if it scored the checkpoint that the run's log ends with; a run's
training FLOPs add up its steps at each one's own tokens per step (a resume may change the batch).
matplotlib is optional for the rest of the repo, but needed here (pip install matplotlib); without
it the tables still print.
"""
import glob
import json
import math
import os
import statistics
import sys

import numpy as np
import torch

from configurator import configure, fail
from lab import read_json
from bookkeeping import write_whole

try:
    import matplotlib
    if 'ipykernel' not in sys.modules:  # in a notebook its own backend shows figures inline
        matplotlib.use('Agg')  # draw to files; no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
except ImportError:
    plt = None

# -----------------------------------------------------------------------------
mode = 'curves'  # 'curves': losses by step and FLOPs; 'arith': accuracy by operator count; 'depth': by layers
runs = 'out/none,out/static,out/dynamic'  # comma-separated out_dirs or patterns such as out/arith/*
out = ''  # the PNG to write; '' means figures/loss_curves.png, arith_accuracy.png or arith_depth.png
n_ops = 6  # depth mode: the operator count whose accuracy is drawn (the paper's hardest tier)
band = False  # curves mode: each setting's mean over its seeds, with a band from its least to its most
# -----------------------------------------------------------------------------
DEFAULT_OUT = {'curves': 'figures/loss_curves.png', 'arith': 'figures/arith_accuracy.png',
               'depth': 'figures/arith_depth.png'}
# Keys of train.py that do not change what a run computes: not part of a setting.
NOT_A_SETTING = {'seed', 'out_dir', 'init_from', 'overwrite', 'device', 'compile', 'fused',
                 'peak_flops', 'log_interval', 'eval_interval', 'always_save_checkpoint', 'mc_task',
                 'mc_interval', 'mc_examples'}
SHORT = {'learning_rate': 'lr', 'gradient_accumulation_steps': 'accum',
         'router_init': 'init'}  # in settings' names
COLORS = {'none': 'tab:gray', 'static': 'tab:blue', 'dynamic': 'tab:orange'}  # the rest: matplotlib's cycle


def run_dirs(spec):
    """The directories that spec (comma-separated paths or patterns) names, in order, each once."""
    dirs = []
    for part in filter(None, spec.split(',')):
        matches = sorted(glob.glob(part)) if glob.has_magic(part) else [part]
        if not matches:
            fail(f"--runs: no directory matches {part}")
        dirs += [d for d in matches if d not in dirs]
    if not dirs:
        fail("--runs names no directory")
    return dirs


def number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check(ok, path, what):
    """One line, naming the file, for a value plot.py cannot use (a file edited by hand, say)."""
    if not ok:
        fail(f"{path}: {what}: not as train.py and lab/arith.py write it")


def read_log(run):
    """(the run's record, its step records) from run/log.txt, each checked for what plot.py uses."""
    path = os.path.join(run, 'log.txt')
    records = read_json(path, 'log', lines=True)  # train.py's log.txt
    if not records or not isinstance(records[0], dict) or 'config' not in records[0]:
        fail(f"{path} does not open with the run's record (train.py writes one since plot.py exists): "
             "train the run again to plot it")
    header, config = records[0], records[0]['config']
    check(isinstance(config, dict) and number(header.get('flops_per_token'))
          and number(header.get('params')), path,
          "its first line's config, params or flops_per_token")
    ints = ('seed', 'n_layer', 'batch_size', 'block_size', 'gradient_accumulation_steps')
    check(isinstance(config.get('router'), str) and all(type(config.get(k)) is int for k in ints),
          path, f"its config's router or {', '.join(ints)}")
    for n, record in enumerate(records[1:], 2):
        check(isinstance(record, dict) and type(record.get('step')) is int
              and all(number(v) for k, v in record.items() if k != 'step'), path,
              f"record {n} (a step's numbers)")
    return header, records[1:]


def read_eval(run, records):
    """run/arith_eval.json: accuracy per operator count, keys turned back into ints. It must have
    scored the checkpoint the run's log ends with: its step, and the best validation loss up to it
    (the checkpoint's; step 0's counts), are in the log, and no later evaluation (whose
    checkpoint replaced it)."""
    path = os.path.join(run, 'arith_eval.json')
    again = f"python -m lab.arith --mode=eval --ckpt_dir={run}"
    result = read_json(path, 'evaluation', f"run `{again}` first")
    check(isinstance(result, dict) and isinstance(result.get('accuracy'), dict)
          and isinstance(result.get('accuracy_all'), dict)
          and all(k.isdigit() and (number(v) or v is None and number(result['accuracy_all'].get(k)))
                  for k, v in result['accuracy'].items()), path, "its accuracy per operator count")
    step, best = result.get('step'), result.get('best_val_loss')
    vals = [(r['step'], r['val_loss']) for r in records if 'val_loss' in r]
    always = read_log(run)[0]['config'].get('always_save_checkpoint', True)
    if not (type(step) is int and number(best) and any(s == step for s, _ in vals)
            and min((v for s, v in vals if s <= step), default=None) == best
            and not (always and any(s > step and math.isfinite(v) for s, v in vals))):
        fail(f"{path} scored another checkpoint than the one {run}/log.txt ends with (left by an "
             f"earlier run, or by an older arith.py?): run `{again}` again")
    # Held-out accuracy is the paper's measure; where every expression is in training (1 operator)
    # there is none, and accuracy over all of them is what there is.
    return {int(k): v if v is not None else result['accuracy_all'][k] for k, v in result['accuracy'].items()}


def setting_keys(configs):
    """The keys of train.py whose values differ among configs: what a setting's name shows."""
    keys = sorted({k for config in configs for k in config} - NOT_A_SETTING)
    return [k for k in keys if len({json.dumps(c.get(k)) for c in configs if not no_router(c, k)}) > 1]


def no_router(config, key):
    """Whether key is a router's rate or start in a run without a router: it changes nothing there
    (nor does the start in a dynamic run: lime.py keeps it at the authors')."""
    if key == 'router_init':
        return config.get('router') != 'static'
    return key == 'router_lr' and config.get('router') == 'none'


def real_data_dir(run, config):
    """The run's data_dir as a real path, so one directory reached by two paths (relative and
    absolute, or through a link) is one setting. The log keeps data_dir as given, relative to where
    train.py started, which it does not record; out_dir was given from there too, so where it is
    relative and the run's path ends with it, the rest of that path is the start. Otherwise nothing
    says where: the current directory stands in, right when plot.py runs where train.py did."""
    data_dir, out_dir, path = config.get('data_dir'), config.get('out_dir'), os.path.abspath(run)
    if not isinstance(data_dir, str) or '\0' in data_dir:  # no path (a log edited by hand?): as is
        return data_dir
    start = os.getcwd()
    if isinstance(out_dir, str) and not os.path.isabs(out_dir):
        tail = os.sep + os.path.normpath(out_dir)
        start = (path[:-len(tail)] or os.sep) if path.endswith(tail) else start
    return os.path.realpath(os.path.join(start, data_dir))


def shown(value, values):
    """A key's value in a setting's name: a float at 4 significant digits (3e-3/10 as 0.0003),
    unless that would name two of the key's values alike."""
    if not isinstance(value, float):
        return value
    text = f"{value:.4g}"
    alike = {v for v in values if isinstance(v, float) and f"{v:.4g}" == text}
    return text if alike == {value} else value


def setting(config, differ, depth_axis):
    """A run's setting, the name its seeds share: the router (with hyper-connections), then each
    key in differ ({key: its values over the runs}), but n_layer where depth is an axis of its
    own."""
    hc = config.get('hyper_connections')
    name = config['router'] + (f"-hc{hc}" if hc else '')
    if 'n_layer' in differ and not depth_axis:
        name += f" {config['n_layer']}L"
    for key in differ:
        if no_router(config, key):
            continue
        if key not in ('router', 'hyper_connections', 'n_layer'):
            name += f" {SHORT.get(key, key)}={shown(config.get(key), differ[key])}"
    return name


def by_setting(runs, depth_axis):
    """{setting: [run dir, ...]} in the order the settings first appear; and each run's config. A
    setting (at one depth) is never two runs of one seed (the same run twice, copied?)."""
    configs = {}
    for run in runs:
        config = dict(read_log(run)[0]['config'])
        # train.py saves 0 as what it means (max_iters) now, as older logs do not
        config['lr_decay_iters'] = config.get('lr_decay_iters') or config.get('max_iters')
        config.setdefault('router_init', 'noisy')  # logs from before the key: the authors' start
        config.setdefault('memory', 'kv')  # and from before v1's routers: v2's keys and values
        config['data_dir'] = real_data_dir(run, config)
        configs[run] = config
    keys = setting_keys(list(configs.values()))
    # each key that tells runs apart, with its value in every run (to name floats short)
    differ = {k: [c.get(k) for c in configs.values()] for k in keys}
    groups, seeds = {}, {}
    for run, config in configs.items():
        name = setting(config, differ, depth_axis)
        key = name, config['n_layer'], config['seed']
        if key in seeds:
            fail(f"{seeds[key]} and {run} are the same setting with the same seed "
                 f"({config['seed']}): the same run twice? Give one of them")
        seeds[key] = run
        groups.setdefault(name, []).append(run)
    return groups, configs


def flops_by_step(header, records):
    """A run's training FLOPs after a given step: its FLOPs per token times the tokens trained on
    so far. Each log record's tokens per step is its tokens/s times its s/step (a resume with
    another batch size changes it), counted over the steps since the record before; the run's
    record gives it where a record lacks those, and the last one's holds past the last record."""
    c = header['config']
    per_step = c['batch_size'] * c['block_size'] * c['gradient_accumulation_steps']
    steps, tokens = [0], [0.0]
    for r in records:
        if 'train_loss' in r and r['step'] > steps[-1]:
            logged = r.get('tokens_per_sec', math.nan) * r.get('ms_per_step', math.nan) / 1000
            per_step = round(logged) if math.isfinite(logged) and logged > 0 else per_step
            tokens.append(tokens[-1] + per_step * (r['step'] - steps[-1]))
            steps.append(r['step'])

    def flops(step):
        past = max(0, step - steps[-1]) * per_step
        return header['flops_per_token'] * (float(np.interp(step, steps, tokens)) + past)
    return flops


def mean_std(values):
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def seeds_cell(points):
    """Mean ± std of the seeds' (step, last val loss), if they ended at one step; else the steps."""
    steps = sorted({step for step, _ in points})
    if len(steps) > 1:
        return f"- (the seeds ended at steps {', '.join(map(str, steps))})"
    return '{:.4f} ± {:.4f}'.format(*mean_std([v for _, v in points])) + f" (step {steps[0]})"


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
        lines.append(f"{name} - {baseline}, paired by seed: {mean:+.{digits}f} ± {std:.{digits}f}; "
                     f"better in {better} of {len(diffs)}")
    return lines


def markdown(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    return '\n'.join(lines + ['| ' + ' | '.join(row) + ' |' for row in rows])


def color(name, i):
    return COLORS.get(name.split()[0], f'C{i + 3}')


# -----------------------------------------------------------------------------
# the three figures


def plot_curves(runs, band=False):
    """Train and validation loss against step (top) and against training FLOPs (bottom): a line per
    run, or with band, a line per setting (its seeds' mean) in a band from their least to most."""
    groups, _ = by_setting(runs, depth_axis=False)
    rows, series, last_val = [], [], {}
    for i, (name, members) in enumerate(groups.items()):
        seeds = []
        for j, run in enumerate(members):
            header, records = read_log(run)
            c = header['config']
            flops = flops_by_step(header, records)
            label = f"{name} seed {c['seed']}" if len(members) > 1 else name
            train = [(r['step'], r['train_loss']) for r in records if 'train_loss' in r]
            val = [(r['step'], r['val_loss']) for r in records if 'val_loss' in r]
            style = ('-', '--', ':', '-.')[j % 4]  # a setting's seeds: one colour, a dash pattern each
            seeds.append((label, color(name, i), style, flops, train, val))
            last = f"{val[-1][1]:.4f} (step {val[-1][0]})" if val else '-'
            last_val.setdefault(name, []).extend(val[-1:])
            rows.append([label, run, f"{header['params'] / 1e6:.2f}M", last,
                         f"{min(v for _, v in val):.4f}" if val else '-'])
        series += [banded(name, seeds)] if band else seeds
    print(markdown(['run', 'out_dir', 'parameters', 'last val loss', 'best val loss'], rows))
    if any(len(members) > 1 for members in groups.values()):  # and over each setting's seeds
        print('\n' + markdown(['setting', 'seeds', 'last val loss, mean ± std'], [
            [name, str(len(points)), seeds_cell(points)]
            for name, points in last_val.items() if points]))
    if plt is None:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.3), sharey='col')
    for label, c, style, flops, train, val in series:
        for col, points in enumerate((train, val)):
            if not points:
                continue
            steps, losses = zip(*points)
            spread = None
            if isinstance(losses[0], tuple):  # a band: (mean, least, most) at each step
                losses, *spread = zip(*losses)
            for row, x in ((0, steps), (1, [flops(s) for s in steps])):
                axes[row, col].plot(x, losses, color=c, linestyle=style, alpha=0.85,
                                    label=label if row == 0 else None)
                if spread:
                    axes[row, col].fill_between(x, *spread, color=c, alpha=0.2, linewidth=0)
    for col, what in enumerate(('train loss', 'validation loss')):
        axes[0, col].set(title=what, xlabel='step', ylabel='loss')
        axes[1, col].set(xlabel='training FLOPs', ylabel='loss')
    axes[0, 0].legend()
    return fig


def banded(name, seeds):
    """One series for a setting's seeds: at each step all of them logged, (mean, least, most) of
    their losses. Its FLOPs are the first seed's (the seeds of a setting train alike)."""
    label = f"{name} ({len(seeds)} seeds)" if len(seeds) > 1 else name
    _, c, _, flops, _, _ = seeds[0]
    curves = []
    for k in (4, 5):  # train, then val
        by_step = [dict(s[k]) for s in seeds]
        steps = sorted(set.intersection(*(set(d) for d in by_step)))
        values = [[d[step] for d in by_step] for step in steps]
        curves.append([(step, (statistics.mean(v), min(v), max(v))) for step, v in zip(steps, values)])
    return label, c, '-', flops, *curves


def plot_arith(runs):
    """Exact-match accuracy against the number of operators, a line per setting."""
    groups, _ = by_setting(runs, depth_axis=False)
    accuracy = {name: [read_eval(run, read_log(run)[1]) for run in members]
                for name, members in groups.items()}
    counts = sorted({k for results in accuracy.values() for result in results for k in result})
    rows = []
    for k in counts:
        cells = [f"{100 * m:.1f} ± {100 * s:.1f}" for m, s in
                 (mean_std([r[k] for r in results if k in r]) for results in accuracy.values())]
        rows.append([str(k), str(k + 1)] + cells)
    print(markdown(['operators', 'operands'] + [f"{name} ({len(groups[name])} seeds)" for name in groups],
                   rows))
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (name, results) in enumerate(accuracy.items()):
        ks = [k for k in counts if all(k in r for r in results)]
        values = [[100 * r[k] for r in results] for k in ks]
        ax.plot(ks, [statistics.mean(v) for v in values], marker='o', color=color(name, i),
                label=f"{name} ({len(results)} seeds)")
        ax.fill_between(ks, [min(v) for v in values], [max(v) for v in values], color=color(name, i), alpha=0.2)
    ax.set(title='arithmetic expressions: exact match', xlabel="operators (the paper's tiers, see arith.py)",
           ylabel='accuracy on held-out expressions (%)', xticks=counts, ylim=(0, 100))
    ax.legend()
    return fig


def plot_depth(runs, k):
    """Accuracy at k operators against the number of layers, a line per router."""
    groups, configs = by_setting(runs, depth_axis=True)
    points = {}  # setting -> {n_layer: [accuracy of each seed]}
    for name, members in groups.items():
        for run in members:
            result = read_eval(run, read_log(run)[1])
            if k not in result:
                fail(f"{run}/arith_eval.json has no {k}-operator accuracy (choose --n_ops among {sorted(result)})")
            by_depth = points.setdefault(name, {})
            by_depth.setdefault(configs[run]['n_layer'], []).append(100 * result[k])
    depths = sorted({d for by_depth in points.values() for d in by_depth})
    def cell(seeds):
        return '{:.1f} ± {:.1f}'.format(*mean_std(seeds)) + f" ({len(seeds)})" if seeds else '-'

    rows = [[str(d)] + [cell(by_depth.get(d)) for by_depth in points.values()] for d in depths]
    print(markdown(['layers'] + [f"{name}: % at {k} operators (seeds)" for name in points], rows))
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (name, by_depth) in enumerate(points.items()):
        ds = sorted(by_depth)
        ax.plot(ds, [statistics.mean(by_depth[d]) for d in ds], marker='o', color=color(name, i), label=name)
        for d in ds:  # each seed as a dot: the spread is the data, with 2 or 3 seeds
            ax.scatter([d] * len(by_depth[d]), by_depth[d], color=color(name, i), s=12, alpha=0.6)
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
    if config['band'] and config['mode'] != 'curves':
        fail(f"band is for the loss curves (--mode=curves): the {config['mode']} figure always draws one")
    if config['mode'] == 'curves':
        fig = plot_curves(dirs, config['band'])
    elif config['mode'] == 'arith':
        fig = plot_arith(dirs)
    else:
        fig = plot_depth(dirs, config['n_ops'])
    if fig is None:
        fail("drawing the figure needs matplotlib: pip install matplotlib (the table above is all there is)")
    save(fig, config['out'] or DEFAULT_OUT[config['mode']], dpi=100)


def save(fig, path, dpi=120, metadata=None):
    """Write fig to path (making its directory), whole or not at all (an earlier figure there is
    kept on a full disk), or one line saying why it cannot be written. metadata: text the file
    keeps ({key: value}, a PNG's tEXt chunks)."""
    kinds = fig.canvas.get_supported_filetypes()  # matplotlib's: png, pdf, svg, ...
    kind = os.path.splitext(path)[1][1:].lower()
    if os.path.isdir(path) or kind not in kinds:
        fail(f"cannot write {path}: name a file ending in .png (or .{', .'.join(sorted(kinds))})")
    try:
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        fig.tight_layout()
        write_whole(path, lambda f: fig.savefig(f, format=kind, dpi=dpi, metadata=metadata))
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror}")
    plt.close(fig)
    print(f"wrote {path}")


# -----------------------------------------------------------------------------
# analyze.py's figures: routing weights, a number per layer, the linear probe


def routing_figure(name, weights):
    """A checkpoint's routing weights (n_layer, G, n_layer) as a heatmap: a row per layer and kv head."""
    L, G, _ = weights.shape
    unreadable = torch.ones(L, L, dtype=torch.bool).triu(1)[:, None, :]  # (L, 1, L): source m > layer l
    image = weights.masked_fill(unreadable, float('nan')).reshape(L * G, L)  # row l * G + g; nan: blank
    fig, ax = plt.subplots(figsize=(1.5 + 0.4 * L, 1.5 + min(6.0, 0.25 * L * G)))
    im = ax.imshow(image.numpy(), vmin=0.0, vmax=1.0, aspect='auto', interpolation='nearest')
    for l in range(1, L):
        ax.axhline(l * G - 0.5, color='white', linewidth=1)  # separates the layers' blocks of heads
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    labelled = range(0, L, max(1, L // 12))  # at most about a dozen layer labels
    ax.set_yticks([l * G + (G - 1) / 2 for l in labelled], [str(l) for l in labelled])
    ax.set(title=f'{name}: routing weights', xlabel='source layer', ylabel=f'layer ({G} kv heads each)')
    fig.colorbar(im, ax=ax, label='share of the weight')
    return fig


def layer_figure(curves, title, xlabel, ylabel):
    """Curves {checkpoint name: a number per layer}, a line each."""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, ys in curves.items():
        ax.plot(range(len(ys)), ys, marker='o', label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend()
    return fig


def probe_figure(accuracy, chance):
    """accuracy: {feature kind: {checkpoint name: [(mean, std) per layer]}}, a panel per kind."""
    fig, axes = plt.subplots(1, len(accuracy), figsize=(4.5 * len(accuracy), 3.5), sharey=True, squeeze=False)
    for ax, (kind, curves) in zip(axes[0], accuracy.items()):
        for name, points in curves.items():
            mean, std = np.array(points).T
            layers = np.arange(len(mean))
            line, = ax.plot(layers, mean, marker='o', label=name)
            ax.fill_between(layers, mean - std, mean + std, color=line.get_color(), alpha=0.2)  # mean ± std
        ax.axhline(chance, color='gray', linestyle='--', label='chance')
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
        ax.set(title=f'linear probe: {kind}', xlabel='layer', ylim=(0.0, 1.05))
    axes[0, 0].set_ylabel('held-out accuracy')
    axes[0, 0].legend()
    return fig


if __name__ == '__main__':
    main()
