"""
analyze.py: look inside trained checkpoints, as the paper's analysis does (arXiv 2502.09245, Sec. 5):
how each LIMe layer spreads its reading over the earlier layers, how much information each layer's
values hold (their matrix entropy), and how well a linear probe tells similar tokens apart from them.

    python -m lab.analyze --out_dirs=out/none,out/static,out/dynamic --data_dir=data/pydoc
    python -m lab.analyze --out_dirs=out/cpu_demo --alpha=0.5 --fig_dir=figures/cpu_demo

It prints these tables: per LIMe checkpoint, its routing weights (paper Fig. 13), as percentages
with a row of shading characters per layer and kv head; the mean weight that later layers give each
source layer (Fig. 2); the matrix entropy of each layer's values (Fig. 5); and, for checkpoints of
GPT-2's vocabulary, the linear probe (Figs. 7 and 12): per layer, the held-out accuracy (mean ± std
over cross-validation folds) of a linear classifier telling the tokens ' is', ' are', ' was' and
' were' of the validation shard apart, from the values the layer's attention reads at that token,
then from the hidden state (the residual stream) after the layer. Chance is 25%; a layer whose
representations have collapsed scores low. Other checkpoints get a note that the probe skips them.
With matplotlib installed (pip install matplotlib) plot.py also draws them as PNGs in fig_dir:
routing_<name>.png per LIMe checkpoint, retrieval.png, entropy.png and probe.png, a checkpoint
being named by its directory's basename.
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

from lab import plot  # draws the figures (matplotlib is optional: without it the tables are all there is)
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
GPT2_VOCAB = 50257  # GPT-2's BPE vocabulary, <|endoftext|> included: the probe's tokens are in it
PROBE_WORDS = (' is', ' are', ' was', ' were')  # the probe's classes: one GPT-2 token each
PROBE_BATCH = 8  # chunks of the shard per forward pass while collecting the probe's features
PROBE_STEPS = 100  # L-BFGS iterations that fit each probe
PROBE_L2 = 1e-3  # weight of the probe's L2 penalty: keeps it finite on separable features


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
    # log sum p^alpha = alpha log ||p||_alpha, with the norm scaled by max p: p^alpha underflows to
    # 0 for a large alpha (and the entropy to inf), (p / max p)^alpha only where it should.
    top = p.amax(dim=-1)
    norm = top.log() + ((p / top.unsqueeze(-1)) ** alpha).sum(dim=-1).log() / alpha
    return alpha / (1.0 - alpha) * norm


def retrieval_by_source(weights):
    """Paper Fig. 2: for each source layer m, the mean weight that the later layers l > m (all their
    kv heads) give it, from routing weights (n_layer, G, n_layer). Shape (n_layer - 1,): the last
    layer has no later layer to read it."""
    return torch.tensor([weights[m + 1:, :, m].mean().item() for m in range(weights.size(0) - 1)])


class StopForward(Exception):
    """Raised by a hook on the last block: the analysis needs nothing past it, and the logits'
    matmul over a 50K-token vocabulary costs more than all the blocks of a small model."""


@torch.no_grad()
def capture(model, idx, taps):
    """Run model on tokens idx (B, T) and keep what its modules see: taps maps a key to (module,
    keep), and the result maps the key to keep(args, out) of that module's call. The forward pass
    stops after the last block."""
    kept = {}

    def tap(key, keep):
        def hook(module, args, out):
            kept[key] = keep(args, out)
        return hook

    def stop(module, args, out):
        raise StopForward

    hooks = [module.register_forward_hook(tap(key, keep)) for key, (module, keep) in taps.items()]
    hooks.append(model.blocks[-1].register_forward_hook(stop))  # last: the block's own taps run first
    try:
        model(idx)
    except StopForward:
        pass
    finally:
        for hook in hooks:
            hook.remove()
    return kept


def layer_features(model, idx):
    """What each layer holds on tokens idx (B, T): (values, hidden), two lists of n_layer tensors.
    values[l] (B, T, G * hs): the values layer l's attention reads. A LIMe layer reads its router's
    mix of the layers so far; layer 0, and every layer of a router='none' model, reads its own
    kv_proj output. hidden[l] (B, T, D): the hidden state (residual stream) that block l outputs.
    With hyper-connections a block outputs n streams (B, T, n, D): hidden[l] is their mean, which is
    what GPT.forward makes of the last block's streams before its final norm."""
    B, T = idx.shape
    L = len(model.blocks)

    def value(args, out):  # out: router (B, T, 2, G, hs) or kv_proj (B, T, 2 * G * hs)
        return out.reshape(B, T, 2, -1)[:, :, 1]  # (B, T, G * hs); index 0 is the keys

    def hidden(args, out):  # out: (B, T, D), or (B, T, n, D) with hyper-connections
        return out.mean(dim=2) if out.dim() == 4 else out

    taps = {}
    for l, block in enumerate(model.blocks):
        taps['value', l] = (block.attn.router if block.attn.router is not None else block.attn.kv_proj, value)
        taps['hidden', l] = (block, hidden)
    kept = capture(model, idx, taps)
    return [kept['value', l] for l in range(L)], [kept['hidden', l] for l in range(L)]


def routing_weights(model, idx):
    """weights[l, g, m]: the share of layer l's kv head g drawn from source layer m, shape
    (n_layer, n_kv_head, n_layer); each row sums to 1 and is 0 for m > l (paper Fig. 13).
    Static: |R| summed per source layer and normalised. Dynamic: the router's probabilities
    averaged over the tokens idx (B, T). v1 (memory='hidden'): its softmax weights, the static
    router's as they are, the dynamic one's averaged over the tokens. Layers without a router
    read only themselves."""
    L, G = model.config.n_layer, model.config.n_kv_head
    weights = torch.eye(L)[:, None, :].repeat(1, G, 1)  # (L, G, L): layer l reads layer l
    routers = list(model.routers())  # layers 1 .. L-1
    v1 = model.config.memory == 'hidden'
    if v1 and model.config.router == 'static':
        with torch.no_grad():
            shares = [router.mix_weights() for router in routers]  # (G, l + 1) each
    elif v1:  # the current state, as the router's norm gives it: the last memory entry (args[1])
        def mean_v1_probs(router):
            return lambda args, out: router.mix_weights(router.norm(args[1][-1])).mean(dim=(0, 1))
        kept = capture(model, idx, {l: (r, mean_v1_probs(r)) for l, r in enumerate(routers, 1)})
        shares = [kept[l] for l in range(1, L)]
    elif model.config.router == 'static':
        with torch.no_grad():
            shares = [router.mix_weights().abs().view(G, l + 1, G).sum(-1) for l, router in enumerate(routers, 1)]
    elif model.config.router == 'dynamic':  # the router's input h is args[0] of its call
        def mean_probs(router):  # (G, S): the router's probabilities, averaged over the tokens
            return lambda args, out: router.mix_weights(args[0]).mean(dim=(0, 1))
        kept = capture(model, idx, {l: (router, mean_probs(router)) for l, router in enumerate(routers, 1)})
        shares = [kept[l] for l in range(1, L)]  # (G, l + 1) each
    else:
        return weights
    for l, share in enumerate(shares, 1):
        weights[l, :, :l + 1] = share.cpu() / share.sum(-1, keepdim=True).cpu()
    return weights


def layer_values(model, idx):
    """The values each layer's attention reads on tokens idx (B, T): a list of n_layer tensors
    (B, T, G * hs), as layer_features gives them."""
    return layer_features(model, idx)[0]


# -----------------------------------------------------------------------------
# the linear probe (paper Figs. 7 and 12): can a linear classifier tell similar tokens apart from
# what a layer holds at them? If a layer's representations have collapsed, it cannot.


class TooFewExamples(Exception):
    """The validation text holds too few of a probe token: the probe is skipped, the rest goes on."""


def probe_tokens(tokens, T, classes, limit, folds, path):
    """Where the probe's examples lie in tokens, the validation shard at path: (positions, labels),
    in shard order. classes maps each class's word to its token id; label c is the c-th of them.
    Only whole chunks of T tokens count, as the model reads the shard in consecutive chunks. Every
    class keeps its first n occurrences, n = min(count over classes, limit), so chance is
    1 / len(classes). Raises TooFewExamples if a class has fewer than folds."""
    usable = tokens[:len(tokens) // T * T]
    found = [np.flatnonzero(usable == token)[:limit] for token in classes.values()]
    n = min(len(where) for where in found)
    if n < folds:
        word = list(classes)[int(np.argmin([len(where) for where in found]))]
        raise TooFewExamples(f"{path} holds only {n} {word!r} tokens in its {len(usable):,} tokens read "
                             f"by the probe (whole chunks of {T}); it needs probe_folds={folds} of each of "
                             f"{', '.join(map(repr, classes))}")
    positions = np.concatenate([where[:n] for where in found])
    labels = np.repeat(np.arange(len(classes)), n)
    order = np.argsort(positions)  # shard order: the chunks are then read once each, in turn
    return positions[order], torch.from_numpy(labels[order])


@torch.no_grad()
def probe_features(model, tokens, positions, T, device):
    """The features of the tokens at positions (sorted) of tokens, from model reading the chunks of T
    tokens that hold them: (values, hidden), two lists of n_layer tensors (N, d) on the CPU, row i
    for positions[i] (see layer_features)."""
    chunk_of = positions // T  # the chunk each example lies in
    chunks = np.unique(chunk_of)  # sorted; only these need a forward pass
    values, hidden = [[] for _ in model.blocks], [[] for _ in model.blocks]
    for i in range(0, len(chunks), PROBE_BATCH):
        batch = chunks[i:i + PROBE_BATCH]
        idx = torch.from_numpy(np.stack([tokens[c * T:(c + 1) * T] for c in batch]).astype(np.int64))
        # This batch's examples, in order: row b of idx, position t in it.
        mine = (chunk_of >= batch[0]) & (chunk_of <= batch[-1])
        b = torch.from_numpy(np.searchsorted(batch, chunk_of[mine]))
        t = torch.from_numpy(positions[mine] % T)
        layer_v, layer_h = layer_features(model, idx.to(device))
        for l in range(len(model.blocks)):
            values[l].append(layer_v[l][b, t].float().cpu())
            hidden[l].append(layer_h[l][b, t].float().cpu())
    return [torch.cat(v) for v in values], [torch.cat(h) for h in hidden]


def stratified_folds(labels, folds, seed):
    """The fold (0 .. folds - 1) of each example: each class's examples, shuffled, dealt out to the
    folds in turn, so every fold holds about the same share of each class."""
    generator = torch.Generator().manual_seed(seed)
    fold = torch.empty_like(labels)
    for c in labels.unique().tolist():
        where = (labels == c).nonzero().squeeze(1)
        where = where[torch.randperm(len(where), generator=generator)]
        fold[where] = torch.arange(len(where)) % folds
    return fold


def fit_probe(X, y, n_classes):
    """Multinomial logistic regression: a Linear layer from features X (N, d) to n_classes logits,
    fitted to labels y (N,) by minimising the cross-entropy plus PROBE_L2 * (sum of squared weights)
    with full-batch L-BFGS. It starts from zero weights and sees every example at every step: the
    same inputs always give the same classifier."""
    probe = torch.nn.Linear(X.size(1), n_classes)
    torch.nn.init.zeros_(probe.weight)
    torch.nn.init.zeros_(probe.bias)
    optimizer = torch.optim.LBFGS(probe.parameters(), max_iter=PROBE_STEPS, line_search_fn='strong_wolfe')

    def closure():  # L-BFGS calls this for the loss and its gradient as often as it needs them
        optimizer.zero_grad()
        loss = F.cross_entropy(probe(X), y) + PROBE_L2 * probe.weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():  # whatever the caller's mode
        optimizer.step(closure)  # one call runs up to PROBE_STEPS iterations
    return probe


def probe_accuracy(X, labels, folds, seed):
    """How well a linear classifier tells the classes apart from features X (N, d): its accuracy on
    held-out examples, by stratified cross-validation over `folds` folds (seed shuffles them). Each
    fold in turn is the test set of a fit_probe on the others. Returns (mean, std) of the folds'
    accuracies (the std with Bessel's correction)."""
    fold = stratified_folds(labels, folds, seed)
    n_classes = int(labels.max()) + 1
    accuracies = []
    for k in range(folds):
        test, train = fold == k, fold != k
        # Standardised with the training folds' statistics only: the test fold stays unseen.
        mean, std = X[train].mean(dim=0), X[train].std(dim=0)
        std = torch.where(std > 0, std, torch.ones_like(std))  # a constant feature: leave it unscaled
        probe = fit_probe((X[train] - mean) / std, labels[train], n_classes)
        with torch.no_grad():
            predicted = probe((X[test] - mean) / std).argmax(dim=1)
        accuracies.append((predicted == labels[test]).float().mean().item())
    accuracies = torch.tensor(accuracies)
    return accuracies.mean().item(), accuracies.std().item()


def probe_layers(models, tokens, path, T, limit, folds, seed, device):
    """The linear probe of each model in models (name: model, all of GPT-2's vocabulary) on the
    validation shard's tokens (at path), read in chunks of T: {'values': curves, 'hidden states':
    curves}, curves mapping each name to its layers' (mean, std) held-out accuracies; and the
    number of examples of each class."""
    enc = or_fail(gpt2_encoding)
    classes = {}
    for word in PROBE_WORDS:
        ids = enc.encode_ordinary(word)
        assert len(ids) == 1, (word, ids)  # each is one token of GPT-2's BPE
        classes[word] = ids[0]
    largest = int(tokens.max())
    if largest >= min(model.config.vocab_size for model in models.values()):
        fail(f"{path} holds token id {largest}, past a checkpoint's vocabulary")
    positions, labels = probe_tokens(tokens, T, classes, limit, folds, path)
    accuracy = {'values': {}, 'hidden states': {}}
    for name, model in models.items():
        values, hidden = probe_features(model, tokens, positions, T, device)
        accuracy['values'][name] = [probe_accuracy(X, labels, folds, seed) for X in values]
        accuracy['hidden states'][name] = [probe_accuracy(X, labels, folds, seed) for X in hidden]
    return accuracy, len(labels) // len(classes)


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


def validation_shard(data_dir):
    """(path, tokens) of the validation shard in data_dir, or one line saying why there is none."""
    path = or_fail(shard_paths, data_dir, 'val')[0]
    return path, or_fail(read_shard, path)


def validation_batch(data_dir, batch_size, T, seed):
    """batch_size sequences of T tokens (B, T) from random places in the validation shard."""
    path, tokens = validation_shard(data_dir)
    if len(tokens) < T:
        fail(f"{path} holds {len(tokens):,} tokens, fewer than one sequence of {T}")
    places = len(tokens) - T + 1  # where a sequence can start: more draws only repeat them
    if batch_size > places:
        fail(f"--batch_size={batch_size}: more sequences than the {places:,} places in {path} "
             f"that one of {T} tokens can start at")
    starts = torch.randint(places, (batch_size,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([torch.from_numpy(tokens[s:s + T].astype(np.int64)) for s in starts.tolist()])


def main(argv=None):
    config, _, _ = configure(globals(), {'text': ['out_dirs'], 'path': ['data_dir', 'fig_dir'],
                                         'positive': ['batch_size', 'alpha', 'probe_examples', 'probe_folds'],
                                         'device': ['device'], 'seed': ['seed']}, argv)
    if config['probe'] and config['probe_folds'] < 2:
        fail(f"probe_folds must be at least 2 (one fold to test on, the others to fit), got {config['probe_folds']}")
    if config['probe'] and config['probe_examples'] < config['probe_folds']:
        fail(f"probe_examples ({config['probe_examples']}) must be at least probe_folds "
             f"({config['probe_folds']}): every fold needs an example of each token")
    dirs = [d for d in config['out_dirs'].split(',') if d]
    names = [os.path.basename(os.path.normpath(d)) for d in dirs]
    if not dirs or len(set(names)) < len(names):
        fail(f"--out_dirs needs one or more directories with different basenames, got {config['out_dirs']!r}")
    # All loaded at once: analysis models are small, and the sequence length depends on all of them.
    models = {name: or_fail(load_model, os.path.join(d, 'ckpt.pt'), config['device'])[0]
              for name, d in zip(names, dirs)}
    # Entropy depends on the number of tokens (it is at most log(T - 1)): use one T for all.
    T = min(model.config.block_size for model in models.values())
    if T < 2:  # one token has no spread: every entropy would be nan
        short = [name for name, model in models.items() if model.config.block_size < 2]
        fail(f"{', '.join(short)}: block_size 1, but the values' entropy needs sequences of at "
             "least 2 tokens, and all checkpoints are measured on one length: leave it out")
    idx = validation_batch(config['data_dir'], config['batch_size'], T, config['seed'])
    largest = int(idx.max())
    if largest >= min(model.config.vocab_size for model in models.values()):
        fail(f"the validation shard holds token id {largest}, past a checkpoint's vocabulary")
    idx = idx.to(config['device'])

    entropy, routing = {}, {}
    for name, model in models.items():
        entropy[name] = [matrix_entropy(v, config['alpha']).mean().item() for v in layer_values(model, idx)]
        if model.config.router != 'none':  # a baseline layer reads only itself: nothing to show
            routing[name] = routing_weights(model, idx)  # (n_layer, G, n_layer)
            print('\n' + render_routing(name, routing[name]))
    retrieval = {name: retrieval_by_source(w).tolist() for name, w in routing.items()}
    if retrieval:
        print('\n' + render_curves('mean weight that later layers give each source layer (paper Fig. 2)',
                                   'source', retrieval, '{:.3f}'))
    print('\n' + render_curves(f"matrix entropy of each layer's values, alpha={config['alpha']}, over "
                               f"{len(idx)} sequences of {T} tokens; higher = more spread (paper Fig. 5)",
                               'layer', entropy, '{:.3f}'))

    # The linear probe needs GPT-2's tokens ' is', ' are', ...: other vocabularies (arith.py's) lack them.
    probed = {name: model for name, model in models.items() if model.config.vocab_size >= GPT2_VOCAB}
    skipped = [f'{name} (vocab_size {model.config.vocab_size})' for name, model in models.items()
               if name not in probed]
    accuracy = {}
    if config['probe'] and skipped:
        print(f"\nnote: the linear probe skips {', '.join(skipped)}: it needs GPT-2's vocabulary, for the "
              f"tokens {', '.join(map(repr, PROBE_WORDS))}")
    if config['probe'] and probed:
        path, tokens = validation_shard(config['data_dir'])
        try:
            accuracy, n = probe_layers(probed, tokens, path, T, config['probe_examples'], config['probe_folds'],
                                       config['seed'], config['device'])
        except TooFewExamples as e:  # a short validation text (Python's docs, say): the rest still stands
            print(f"\nnote: the linear probe is skipped: {e}")
        else:
            for kind, where in (('values', "the values each layer's attention reads"),
                                ('hidden states', "the hidden state (residual stream) after each layer")):
                # A cell is '{mean:.3f} ± {std:.3f}': format's {0[0]} and {0[1]} index the (mean, std) pair.
                print('\n' + render_curves(f"linear probe on {where}: held-out accuracy telling "
                                           f"{', '.join(map(repr, PROBE_WORDS))} apart ({n} tokens each, "
                                           f"chance {1 / len(PROBE_WORDS):.2f}), mean ± std over "
                                           f"{config['probe_folds']} folds (paper Figs. 7, 12)",
                                           'layer', accuracy[kind], '{0[0]:.3f} ± {0[1]:.3f}'))

    if plot.plt is None:
        print("\npip install matplotlib to get these as PNG figures")
        return
    print()  # a blank line between the last table and the figures' names
    fig_dir = config['fig_dir']
    for name, weights in routing.items():
        plot.save(plot.routing_figure(name, weights), os.path.join(fig_dir, f'routing_{name}.png'))
    if retrieval:
        plot.save(plot.layer_figure(retrieval, 'retrieval by later layers', 'source layer', 'mean routing weight'),
                  os.path.join(fig_dir, 'retrieval.png'))
    plot.save(plot.layer_figure(entropy, f"values' matrix entropy (alpha={config['alpha']})", 'layer',
                                'entropy (nats)'), os.path.join(fig_dir, 'entropy.png'))
    if accuracy:
        plot.save(plot.probe_figure(accuracy, 1 / len(PROBE_WORDS)), os.path.join(fig_dir, 'probe.png'))

if __name__ == '__main__':
    main()
