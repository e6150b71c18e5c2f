"""
analyze.py: look inside trained checkpoints, as the paper's analysis does (arXiv 2502.09245, Sec. 5):
how each LIMe layer spreads its reading over the earlier layers, and how much information each
layer's values hold (their matrix entropy).

    python analyze.py --out_dirs=out/none,out/static,out/dynamic --data_dir=data/pydoc
    python analyze.py --out_dirs=out/cpu_demo --alpha=0.5 --fig_dir=figures/cpu_demo

It prints three kinds of table: per LIMe checkpoint, its routing weights (paper Fig. 13), as
percentages with a row of shading characters per layer and kv head; the mean weight that later
layers give each source layer (Fig. 2); and the matrix entropy of each layer's values (Fig. 5).
With matplotlib installed (pip install matplotlib) it also writes them as PNGs to fig_dir:
routing_<name>.png per LIMe checkpoint, retrieval.png and entropy.png, a checkpoint being named by
its directory's basename.
"""
import glob
import os
import sys

import numpy as np
import torch

from configurator import apply_overrides, check_values, fail, load_model
from prepare import read_shard

try:  # optional: without it the tables are all there is
    import matplotlib
    matplotlib.use('Agg')  # draw to files; no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
except ImportError:
    plt = None

# -----------------------------------------------------------------------------
out_dirs = 'out/cpu_demo'  # comma-separated directories, each holding a ckpt.pt written by train.py
data_dir = 'data/pydoc'  # where the validation shard (*_val_*.bin) is
fig_dir = 'figures'  # where the PNGs go
batch_size = 8  # validation sequences (of the smallest block_size) that all averages run over
alpha = 1.0  # order of the matrix (Renyi) entropy; 1 = Shannon, the limit of the paper's 0.99
device = 'cuda' if torch.cuda.is_available() else 'cpu'
seed = 1337  # picks the validation sequences; every checkpoint sees the same ones
# -----------------------------------------------------------------------------
DEFAULTS = {k: v for k, v in globals().items()
            if not k.startswith('_') and type(v) in (int, float, bool, str)}
SHADES = '.:-=+*#%@'  # a routing weight w in [0, 1] is drawn as SHADES[round(8 w)]; darker = more


def matrix_entropy(Z, alpha=1.0):
    """Matrix entropy of token representations Z (..., T, d) (paper Sec. 5): with Z z-scored per
    feature and K = Z Z^T, S = 1/(1-alpha) log sum_i p_i^alpha, where p_i = lambda_i(K) / tr K.
    alpha = 1 is its limit, -sum_i p_i log p_i. It is log(rank) when the T tokens spread evenly
    over rank directions and 0 when they all lie on one line; z-scoring subtracts the mean, so the
    rank is at most min(T - 1, d). Returns a tensor of shape (...)."""
    Z = Z.double()  # eigenvalues span many orders of magnitude
    Z = Z - Z.mean(dim=-2, keepdim=True)
    # A feature that never changes carries no information: leave it at 0 rather than divide by 0.
    Z = Z / Z.std(dim=-2, keepdim=True, correction=0).clamp_min(1e-12)
    # The nonzero eigenvalues of Z Z^T are the squared singular values of Z: no T x T matrix needed.
    lam = torch.linalg.svdvals(Z) ** 2  # (..., min(T, d))
    p = lam / lam.sum(dim=-1, keepdim=True)  # tr K is the sum of its eigenvalues
    if alpha == 1.0:
        return -torch.xlogy(p, p).sum(dim=-1)  # xlogy gives 0 log 0 = 0
    return torch.log((p ** alpha).sum(dim=-1)) / (1.0 - alpha)


def retrieval_by_source(weights):
    """Paper Fig. 2: for each source layer m, the mean weight that the later layers l > m (all their
    kv heads) give it, from routing weights (n_layer, G, n_layer). Shape (n_layer - 1,): the last
    layer has no later layer to read it."""
    return torch.tensor([weights[m + 1:, :, m].mean().item() for m in range(weights.size(0) - 1)])


@torch.no_grad()
def layer_values(model, idx):
    """The values each layer's attention reads on tokens idx (B, T): a list of n_layer tensors
    (B, T, G * hs). A LIMe layer reads its router's mix of the layers so far; layer 0, and every
    layer of a router='none' model, reads its own kv_proj output."""
    B, T = idx.shape
    values = {}

    def keep(layer):
        def hook(module, args, out):  # out: router (B, T, 2, G, hs) or kv_proj (B, T, 2 * G * hs)
            values[layer] = out.reshape(B, T, 2, -1)[:, :, 1]  # (B, T, G * hs); index 0 is the keys
        return hook

    hooks = []
    for l, block in enumerate(model.blocks):
        source = block.attn.router if block.attn.router is not None else block.attn.kv_proj
        hooks.append(source.register_forward_hook(keep(l)))
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return [values[l] for l in range(len(model.blocks))]


def format_table(title, header, rows):
    """title, then the header and rows (lists of strings) in right-aligned columns."""
    rows = [header] + rows
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return '\n'.join([title] + ['  '.join(s.rjust(w) for s, w in zip(row, widths)) for row in rows])


def render_routing(name, weights):
    """Routing weights (n_layer, G, n_layer) as text: a row per layer l and kv head g with the
    percentage it reads from each source layer (blank for later layers, which it cannot read),
    then the same row as shading characters."""
    L, G, _ = weights.shape
    rows = []
    for l in range(L):
        for g in range(G):
            w = weights[l, g].tolist()
            percent = [f'{100 * w[m]:.0f}' if m <= l else '' for m in range(L)]
            shades = ''.join(SHADES[round(8 * w[m])] if m <= l else ' ' for m in range(L))
            rows.append([f'{l}.{g}'] + percent + [f'|{shades}|'])
    title = f"routing of {name}: % of layer l's kv head g (row l.g) read from each source layer (column)"
    return format_table(title, ['l.g'] + [str(m) for m in range(L)] + [''], rows)


def render_curves(title, row_name, curves, fmt):
    """Curves {checkpoint name: list of numbers} as a table: a row per index, a column per name."""
    n = max(len(ys) for ys in curves.values())
    rows = [[str(i)] + [fmt.format(ys[i]) if i < len(ys) else '' for ys in curves.values()]
            for i in range(n)]
    return format_table(title, [row_name] + list(curves), rows)


def plot_routing(path, name, weights):
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
    save(fig, path)


def plot_curves(path, curves, title, xlabel, ylabel):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, ys in curves.items():
        ax.plot(range(len(ys)), ys, marker='o', label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend()
    save(fig, path)


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def validation_batch(data_dir, batch_size, T, seed):
    """batch_size sequences of T tokens (B, T) from random places in the validation shard."""
    files = sorted(glob.glob(os.path.join(data_dir, '*_val_*.bin')))
    if not files:
        fail(f"no *_val_*.bin shard in {data_dir}/ (write one with prepare.py, or set --data_dir)")
    try:
        tokens = read_shard(files[0])
    except ValueError as e:  # read_shard's message names the file and the problem
        fail(str(e))
    if len(tokens) < T:
        fail(f"{files[0]} holds {len(tokens):,} tokens, fewer than one sequence of {T}")
    starts = torch.randint(len(tokens) - T + 1, (batch_size,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([torch.from_numpy(tokens[s:s + T].astype(np.int64)) for s in starts.tolist()])


def main(argv):
    config = dict(DEFAULTS)
    apply_overrides(config, argv)
    check_values(config, {'text': ['out_dirs'], 'path': ['data_dir', 'fig_dir'],
                          'positive': ['batch_size', 'alpha'], 'device': ['device'], 'seed': ['seed']})
    dirs = [d for d in config['out_dirs'].split(',') if d]
    names = [os.path.basename(os.path.normpath(d)) for d in dirs]
    if not dirs or len(set(names)) < len(names):
        fail(f"--out_dirs needs one or more directories with different basenames, got {config['out_dirs']!r}")
    # All loaded at once: analysis models are small, and the sequence length depends on all of them.
    models = {name: load_model(os.path.join(d, 'ckpt.pt'), config['device'])[0]
              for name, d in zip(names, dirs)}
    # Entropy depends on the number of tokens (it is at most log(T - 1)): use one T for all.
    T = min(model.config.block_size for model in models.values())
    idx = validation_batch(config['data_dir'], config['batch_size'], T, config['seed'])
    largest = int(idx.max())
    if largest >= min(model.config.vocab_size for model in models.values()):
        fail(f"the validation shard holds token id {largest}, past a checkpoint's vocabulary")
    idx = idx.to(config['device'])

    entropy, routing = {}, {}
    for name, model in models.items():
        entropy[name] = [matrix_entropy(v, config['alpha']).mean().item() for v in layer_values(model, idx)]
        if model.config.router != 'none':  # a baseline layer reads only itself: nothing to show
            routing[name] = model.routing_weights(idx)  # (n_layer, G, n_layer)
            print('\n' + render_routing(name, routing[name]))
    retrieval = {name: retrieval_by_source(w).tolist() for name, w in routing.items()}
    if retrieval:
        print('\n' + render_curves('mean weight that later layers give each source layer (paper Fig. 2)',
                                   'source', retrieval, '{:.3f}'))
    print('\n' + render_curves(f"matrix entropy of each layer's values, alpha={config['alpha']}, over "
                               f"{len(idx)} sequences of {T} tokens; higher = more spread (paper Fig. 5)",
                               'layer', entropy, '{:.3f}'))

    if plt is None:
        print("\npip install matplotlib to get these as PNG figures")
        return
    try:
        os.makedirs(config['fig_dir'], exist_ok=True)
    except OSError as e:
        fail(f"cannot write figures to {config['fig_dir']}: {e.strerror}")
    for name, weights in routing.items():
        plot_routing(os.path.join(config['fig_dir'], f'routing_{name}.png'), name, weights)
    if retrieval:
        plot_curves(os.path.join(config['fig_dir'], 'retrieval.png'), retrieval,
                    'retrieval by later layers', 'source layer', 'mean routing weight')
    plot_curves(os.path.join(config['fig_dir'], 'entropy.png'), entropy,
                f"values' matrix entropy (alpha={config['alpha']})", 'layer', 'entropy (nats)')


if __name__ == '__main__':
    main(sys.argv[1:])
