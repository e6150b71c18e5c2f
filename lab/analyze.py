"""
analyze.py: look inside trained checkpoints, as the paper's analysis does (arXiv 2502.09245, Sec. 5).

    python -m lab.analyze --out_dirs=out/none,out/static,out/dynamic --data_dir=data/pydoc

Tables of each LIMe checkpoint's routing weights (paper Fig. 13), the mean weight later layers give
each source layer (Fig. 2), each layer's values' matrix entropy (Fig. 5) and, with GPT-2's vocabulary,
a linear probe's accuracy telling ' is', ' are', ' was', ' were' apart from each layer (Figs. 7, 12);
with matplotlib, lab/plot.py draws them in fig_dir.
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

from lab import plot  # the figures (matplotlib is optional: without it the tables are all there is)
from configurator import configure, fail, or_fail
from lime import load_model
from prepare import gpt2_encoding, read_shard, shard_paths

# -----------------------------------------------------------------------------
out_dirs = 'out/cpu_demo'  # comma-separated directories, each holding a ckpt.pt written by train.py
data_dir = 'data/pydoc'  # where the validation shard (*_val_*.bin) is
fig_dir = 'figures'  # where the PNGs go
batch_size = 8  # validation sequences (of the smallest block_size) that all averages run over
alpha = 1.0  # order of the matrix (Renyi) entropy; 1 = Shannon, the limit of the paper's 0.99
device = 'cuda' if torch.cuda.is_available() else 'cpu'
seed = 1337  # picks the validation sequences and the probe's folds; every checkpoint sees the same ones
probe = True  # run the linear probe (checkpoints of GPT-2's vocabulary only); False skips it
probe_examples = 300  # the probe's examples of each token, at most (fewer if the shard holds fewer)
probe_folds = 5  # cross-validation folds of the probe: each holds out 1/probe_folds of the examples
# -----------------------------------------------------------------------------
SHADES = '.:-=+*#%@'  # a routing weight w in [0, 1] is drawn as SHADES[round(8 w)]; darker = more
PROBE_WORDS = (' is', ' are', ' was', ' were')  # the probe's classes: one GPT-2 token each


def matrix_entropy(Z, alpha=1.0):
    """Matrix entropy of token representations Z (..., T, d) (paper Sec. 5): with Z z-scored per
    feature and K = Z Z^T, S = 1/(1-alpha) log sum_i p_i^alpha, where p_i = lambda_i(K) / tr K.
    alpha = 1 is its limit, -sum_i p_i log p_i. It is log(rank) when the T tokens spread evenly
    over rank directions and 0 when they all lie on one line. Returns a tensor of shape (...)."""
    Z = Z.double()  # eigenvalues span many orders of magnitude
    Z = Z - Z.mean(dim=-2, keepdim=True)
    # A feature that never changes carries no information: leave it at 0 rather than divide by 0.
    Z = Z / Z.std(dim=-2, keepdim=True, correction=0).clamp_min(1e-12)
    # The nonzero eigenvalues of Z Z^T are the squared singular values of Z: no T x T matrix needed.
    lam = torch.linalg.svdvals(Z) ** 2  # (..., min(T, d))
    p = lam / lam.sum(dim=-1, keepdim=True)  # tr K is the sum of its eigenvalues
    if alpha == 1.0:
        return -torch.xlogy(p, p).sum(dim=-1)  # xlogy gives 0 log 0 = 0
    return (p ** alpha).sum(dim=-1).log() / (1.0 - alpha)


def retrieval_by_source(weights):
    """Paper Fig. 2: for each source layer m, the mean weight that the later layers l > m (all their
    kv heads) give it, from routing weights (n_layer, G, n_layer). Shape (n_layer - 1,)."""
    return torch.tensor([weights[m + 1:, :, m].mean().item() for m in range(weights.size(0) - 1)])


class StopForward(Exception):
    """Raised after the last block: the logits (50K wide with GPT-2's vocabulary) are not needed."""


@torch.no_grad()
def capture(model, idx, modules, keep):
    """keep(module, args, out) of each module's call in model's forward pass on tokens idx (B, T),
    a list in the order of modules; the pass stops after the last block."""
    kept = {}

    def tap(module, args, out):
        kept[module] = keep(module, args, out)

    def stop(module, args, out):
        raise StopForward

    hooks = [module.register_forward_hook(tap) for module in modules]
    hooks.append(model.blocks[-1].register_forward_hook(stop))  # last: the block's own tap runs first
    try:
        model(idx)
    except StopForward:
        pass
    finally:
        for hook in hooks:
            hook.remove()
    return [kept[module] for module in modules]


def layer_features(model, idx):
    """What each layer holds on tokens idx (B, T): (values, hidden), two lists of n_layer tensors:
    values[l] (B, T, G * hs), what layer l's attention reads (a LIMe layer: its router's mix);
    hidden[l] (B, T, D), block l's output (with hyper-connections the mean of its n streams)."""
    B, T = idx.shape
    reads = [b.attn.router if b.attn.router is not None else b.attn.kv_proj for b in model.blocks]

    def keep(module, args, out):
        if module in model.blocks:
            return out.mean(dim=2) if out.dim() == 4 else out
        return out.reshape(B, T, 2, -1)[:, :, 1]  # a router's (B, T, 2, G, hs) or kv_proj's: the values

    kept = capture(model, idx, reads + list(model.blocks), keep)
    return kept[:len(reads)], kept[len(reads):]


@torch.no_grad()
def routing_weights(model, idx):
    """weights[l, g, m] (n_layer, n_kv_head, n_layer): the share of layer l's kv head g read from
    layer m (paper Fig. 13): static, its softmax (v2: |R| summed per source layer, normalised);
    dynamic, its probabilities averaged over the tokens idx (B, T); layer 0 reads itself."""
    cfg = model.config
    L, G = cfg.n_layer, cfg.n_kv_head
    weights = torch.eye(L)[:, None, :].repeat(1, G, 1)  # (L, G, L): layer l reads layer l
    if cfg.router == 'static':
        shares = [r.mix_weights() for r in model.routers()]  # layer l's, v1: (G, l + 1); v2: (G, (l + 1) * G)
        if cfg.memory == 'kv':
            shares = [w.abs().view(G, l + 1, G).sum(-1) for l, w in enumerate(shares, 1)]
    elif cfg.router == 'dynamic':
        def keep(router, args, out):
            # args: (h, memory). v2 routes from the layer's normed input h; v1 from the current
            # state, the last memory entry (at unit RMS), times its norm's gain
            x = args[0] if cfg.memory == 'kv' else router.norm.weight * args[1][-1]
            return router.mix_weights(x).mean(dim=(0, 1))  # (G, l + 1)
        shares = capture(model, idx, model.routers(), keep)  # layers 1 .. L-1
    else:
        return weights
    for l, share in enumerate(shares, 1):
        weights[l, :, :l + 1] = (share / share.sum(-1, keepdim=True)).cpu()
    return weights


@torch.no_grad()
def probe_features(model, tokens, positions, T, device):
    """The linear probe's features (paper Figs. 7, 12): (values, hidden) as layer_features gives
    them at the sorted positions of tokens, read in chunks of T: two lists of n_layer tensors (N, d)
    on the CPU, row i for positions[i]."""
    chunk_of = positions // T
    chunks = np.unique(chunk_of)  # only these need a forward pass
    features = [[[] for _ in model.blocks] for _ in range(2)]
    for i in range(0, len(chunks), 8):  # 8 chunks a forward pass
        batch = chunks[i:i + 8]
        idx = torch.from_numpy(np.stack([tokens[c * T:(c + 1) * T] for c in batch]).astype(np.int64))
        mine = (chunk_of >= batch[0]) & (chunk_of <= batch[-1])  # this batch's examples:
        b = torch.from_numpy(np.searchsorted(batch, chunk_of[mine]))  # row b of idx,
        t = torch.from_numpy(positions[mine] % T)  # position t in it
        for kept, layers in zip(features, layer_features(model, idx.to(device))):
            for l, x in enumerate(layers):
                kept[l].append(x[b, t].float().cpu())
    return [[torch.cat(x) for x in kept] for kept in features]


@torch.enable_grad()  # whatever the caller's mode
def probe_accuracy(X, labels, folds, seed):
    """Held-out accuracy of a linear probe on features X (N, d) by stratified cross-validation: each
    fold in turn is the test set of a fit on the others. Returns the folds' (mean, std). A fit:
    multinomial logistic regression with an L2 penalty by full-batch L-BFGS from zero weights."""
    # Stratified folds: the examples, shuffled, grouped by class, then dealt out to the folds in turn.
    shuffled = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    fold = torch.empty_like(labels).scatter_(0, shuffled[labels[shuffled].argsort(stable=True)],
                                             torch.arange(len(labels)) % folds)
    accuracies = []
    for k in range(folds):
        test, train = fold == k, fold != k
        # Standardised with the training folds' statistics only: the test fold stays unseen.
        mean, std = X[train].mean(dim=0), X[train].std(dim=0)
        std = torch.where(std > 0, std, torch.ones_like(std))  # a constant feature: left unscaled
        x, y = (X[train] - mean) / std, labels[train]
        W = torch.zeros(X.size(1), int(labels.max()) + 1, requires_grad=True)
        b = torch.zeros(W.size(1), requires_grad=True)
        optimizer = torch.optim.LBFGS([W, b], max_iter=100, line_search_fn='strong_wolfe')

        def closure():  # L-BFGS calls this for the loss and its gradient as often as it needs them
            optimizer.zero_grad()
            # the L2 penalty keeps W finite on separable features
            loss = F.cross_entropy(x @ W + b, y) + 1e-3 * W.square().sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        predicted = ((X[test] - mean) / std @ W + b).argmax(dim=1)
        accuracies.append((predicted == labels[test]).float().mean().item())
    accuracies = torch.tensor(accuracies)
    return accuracies.mean().item(), accuracies.std().item()


def format_table(title, header, rows):
    """title, then the header and rows (lists of strings) in right-aligned columns."""
    rows = [header] + rows
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return '\n'.join([title] + ['  '.join(s.rjust(w) for s, w in zip(row, widths)) for row in rows])


def render_routing(name, weights):
    """Routing weights (n_layer, G, n_layer) as text: a row per layer l and kv head g, the percentage
    it reads from each source layer (blank for later ones), then the same row as shading characters."""
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
    rows = [[str(i)] + [fmt.format(ys[i]) if i < len(ys) else '' for ys in curves.values()] for i in range(n)]
    return format_table(title, [row_name] + list(curves), rows)


def main(argv=None):
    config, _, _ = configure(globals(), {'text': ['out_dirs'], 'path': ['data_dir', 'fig_dir'],
                                         'positive': ['batch_size', 'alpha', 'probe_examples', 'probe_folds'],
                                         'device': ['device'], 'seed': ['seed']}, argv)
    folds = config['probe_folds']
    if config['probe'] and folds < 2:
        fail(f"probe_folds must be at least 2 (one fold to test on, the others to fit), got {folds}")
    dirs = [d for d in config['out_dirs'].split(',') if d]
    names = [os.path.basename(os.path.normpath(d)) for d in dirs]
    if not dirs or len(set(names)) < len(names):
        fail(f"--out_dirs needs one or more directories with different basenames, got {config['out_dirs']!r}")
    models = {name: or_fail(load_model, os.path.join(d, 'ckpt.pt'), config['device'])[0]
              for name, d in zip(names, dirs)}
    path = or_fail(shard_paths, config['data_dir'], 'val')[0]
    tokens = or_fail(read_shard, path)
    if tokens.max() >= min(model.config.vocab_size for model in models.values()):
        fail(f"{path} holds token id {tokens.max()}, past a checkpoint's vocabulary")
    # Entropy depends on the number of tokens (it is at most log(T - 1)): one T for all.
    T = min(model.config.block_size for model in models.values())
    places = len(tokens) - T + 1  # where a sequence can start
    if config['batch_size'] > places:
        fail(f"--batch_size={config['batch_size']}: more sequences than the {max(places, 0):,} places "
             f"in {path} that one of {T} tokens can start at")
    starts = torch.randint(places, (config['batch_size'],), generator=torch.Generator().manual_seed(config['seed']))
    idx = torch.stack([torch.from_numpy(tokens[s:s + T].astype(np.int64)) for s in starts.tolist()])
    idx = idx.to(config['device'])

    entropy, routing = {}, {}
    for name, model in models.items():
        entropy[name] = [matrix_entropy(v, config['alpha']).mean().item() for v in layer_features(model, idx)[0]]
        if model.config.router != 'none':  # a baseline layer reads only itself: nothing to show
            routing[name] = routing_weights(model, idx)
            print('\n' + render_routing(name, routing[name]))
    retrieval = {name: retrieval_by_source(w).tolist() for name, w in routing.items()}
    if retrieval:
        print('\n' + render_curves('mean weight that later layers give each source layer (paper Fig. 2)',
                                   'source', retrieval, '{:.3f}'))
    print('\n' + render_curves(f"matrix entropy of each layer's values (alpha={config['alpha']}, {len(idx)} sequences "
                               f"of {T} tokens; higher = more spread; paper Fig. 5)", 'layer', entropy, '{:.3f}'))

    # The probe needs GPT-2's tokens ' is', ' are', ... (its 50,257 ids): bytes and arith.py's lack them.
    probed = {name: m for name, m in models.items() if m.config.vocab_size >= 50257 and config['probe']}
    if config['probe'] and len(probed) < len(models):
        print(f"\nnote: the linear probe skips {', '.join(n for n in models if n not in probed)}: it needs "
              "GPT-2's vocabulary")
    accuracy = {}
    if probed:
        enc = or_fail(gpt2_encoding)
        read = tokens[:len(tokens) // T * T]  # whole chunks of T, as the model reads them
        found = [np.flatnonzero(read == enc.encode_single_token(w))[:config['probe_examples']] for w in PROBE_WORDS]
        n = min(len(where) for where in found)  # each word's first n: chance is 1 / len(PROBE_WORDS)
        positions = np.concatenate([where[:n] for where in found])
        order = np.argsort(positions)  # in shard order, each chunk is read once
        positions, labels = positions[order], torch.arange(len(PROBE_WORDS)).repeat_interleave(n)[order]
        if n < folds:  # a short validation text: the rest still stands
            print(f"\nnote: the linear probe is skipped: {path} holds only {n} of one of "
                  f"{', '.join(map(repr, PROBE_WORDS))} in whole chunks of {T}; it needs probe_folds={folds} of each")
            probed = {}
        for name, model in probed.items():
            features = probe_features(model, tokens, positions, T, config['device'])
            for kind, layers in zip(('values', 'hidden states'), features):
                accuracy.setdefault(kind, {})[name] = [probe_accuracy(X, labels, folds, config['seed'])
                                                       for X in layers]
        for kind, curves in accuracy.items():
            print('\n' + render_curves(f"linear probe on each layer's {kind}: held-out accuracy telling "
                                       f"{', '.join(map(repr, PROBE_WORDS))} apart ({n} tokens each, chance 0.25), "
                                       f"mean ± std over {folds} folds (paper Figs. 7, 12)", 'layer', curves,
                                       '{0[0]:.3f} ± {0[1]:.3f}'))

    if plot.plt is None:
        print("\npip install matplotlib to get these as PNG figures")
        return
    print()  # a blank line between the last table and the figures' names
    figures = {f'routing_{name}.png': plot.routing_figure(name, w) for name, w in routing.items()}
    if retrieval:
        figures['retrieval.png'] = plot.layer_figure(retrieval, 'retrieval by later layers', 'source layer',
                                                     'mean routing weight')
    figures['entropy.png'] = plot.layer_figure(entropy, f"values' matrix entropy (alpha={config['alpha']})",
                                               'layer', 'entropy (nats)')
    if accuracy:
        figures['probe.png'] = plot.probe_figure(accuracy, 1 / len(PROBE_WORDS))
    for filename, fig in figures.items():
        plot.save(fig, os.path.join(config['fig_dir'], filename))


if __name__ == '__main__':
    main()
