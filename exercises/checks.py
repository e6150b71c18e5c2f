"""
The checks of the exercises, which tests/test_exercises.py runs: each calls an answer on seeded
cases of its own and compares it with lime.py's code (this file holds no answer). A wrong answer
gets one line that names its mistake where the check can tell it, else says what differs.
"""
import dataclasses
import functools
import sys
import traceback

import torch

import lime
from lime import GPT, CausalSelfAttention, DynamicRouter, GPTConfig, KVCache, StaticRouter

EXERCISES = ['static_mix', 'dynamic_probs', 'router_cost', 'top_p_mask', 'cached_attention',
             'RestrictedRouter']


class Wrong(AssertionError):
    """An answer failed a check; the message says what is wrong."""


def max_diff(a, b):
    return (a.detach().float() - b.detach().float()).abs().max().item()


def close(a, b, tol=1e-5):
    return a.shape == b.shape and max_diff(a, b) <= tol


def last_line(error):
    """The last line of an error's message: torch's long ones end with the most specific."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def check_shape(what, got, shape, meaning):
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"{what} is a {type(got).__name__}, not a tensor")
    if tuple(got.shape) != tuple(shape):
        raise Wrong(f"{what} has shape {tuple(got.shape)}; expected {tuple(shape)}, {meaning}")


def check_gradients(what, got, expected, inputs, names):
    """got and expected, weighted by the same random numbers, must give the same gradients."""
    if not got.requires_grad:
        raise Wrong(f"{what}: no gradient flows back from your result (was something detached, "
                    "or computed under torch.no_grad?)")
    weights = torch.randn_like(expected)
    got_grads = torch.autograd.grad(got, inputs, weights, allow_unused=True)
    expected_grads = torch.autograd.grad(expected, inputs, weights)
    for name, g, e in zip(names, got_grads, expected_grads):
        if g is None or max_diff(g, e) > 1e-4:
            raise Wrong(f"{what}: the gradient with respect to {name} is wrong")


def weights_read(mix, G, S):
    """(2, G, S, G): the weight mix(memory) gives head h of layer m in output head g, for keys
    (index 0) and values (1), read off its output for memories that hold a single 1."""
    columns = []
    with torch.no_grad():
        for m in range(S):
            for h in range(G):
                memory = [torch.zeros(1, 1, 2, G, 1) for _ in range(S)]
                memory[m][..., h, :] = 1.0
                columns.append(mix(memory)[0, 0, :, :, 0])  # (2, G): output head g
    return torch.stack(columns, dim=-1).view(2, G, S, G)


# Exercise 1: static_mix
def check_static_mix(static_mix):
    # One layer, then one head, then both: R's column order only matters with several of each.
    B, T, hs = 2, 5, 4
    for G, S in ((2, 1), (1, 3), (2, 3)):
        router = StaticRouter(GPTConfig(n_head=G, n_embd=8 * G), layer_idx=S - 1)
        R = router.weight
        with torch.no_grad():
            R.normal_()  # signed, with no identity block: every entry matters
        memory = [torch.randn(B, T, 2, G, hs, requires_grad=True) for _ in range(S)]
        expected = router(None, memory)
        got = static_mix(R, memory)
        what = f"static_mix(R, memory) with G={G} key/value heads and S={S} source layers"
        check_shape(what, got, (B, T, 2, G, hs), "(B, T, 2, G, hs)")
        if max_diff(got, expected) > 1e-5:
            raise Wrong(f"{what}: {static_mix_mistake(static_mix, R, G, S, got, expected)}")
        check_gradients(what, got, expected, [R, *memory],
                        ['R'] + [f'memory[{m}]' for m in range(S)])


def static_mix_mistake(static_mix, R, G, S, got, expected):
    """What a mix that differs from StaticRouter.forward's gets wrong, read off its weights."""
    right = R.detach().view(G, S, G)  # [g, m, h]: output head g, head h of layer m
    mistakes = [
        (right.permute(2, 1, 0), "each layer's (G, G) block of R is transposed: R[g, m * G + h] "
                                 "is the weight of head h in output head g, not of head g in h"),
        (R.detach().view(G, G, S).transpose(1, 2), "R's columns are read head by head (h * S + m), "
                                                   "but they go layer by layer: m * G + h"),
        (right * (torch.arange(S) > 0).view(1, S, 1),
         "layer 0 is left out of the mix: memory[0] holds layer 0's keys and values, and the sum "
         "runs over every layer m = 0..S-1"),
    ]
    try:
        used = weights_read(lambda memory: static_mix(R, memory), G, S)
    except Exception:  # it fails on these memories: no mistake can be read off
        used = None
    for weights, mistake in mistakes if used is not None else []:
        if close(used[0], weights) and close(used[1], weights):
            return mistake
    return (f"it differs from StaticRouter.forward's mix by up to {max_diff(got, expected):.3g}: "
            "compare with the formula in the docstring")


# Exercise 2: dynamic_probs
def check_dynamic_probs(dynamic_probs):
    B, T, D = 2, 6, 16
    for G, S in ((1, 4), (2, 3), (4, 2)):
        router = DynamicRouter(GPTConfig(n_head=G, n_embd=D), layer_idx=S - 1)
        proj = router.proj
        with torch.no_grad():  # varied logits, token by token, unlike the init's
            proj.weight.normal_(0, 0.5)
            proj.bias.normal_()
        h = torch.randn(B, T, D, requires_grad=True)
        expected = router.mix_weights(h)
        got = dynamic_probs(proj, h, G)
        what = f"dynamic_probs(proj, h, {G}) with G={G} heads and S={S} source layers"
        check_shape(what, got, (B, T, G, S), "(B, T, G, S)")
        if not close(got.sum(-1), torch.ones(B, T, G)):
            raise Wrong(f"{what}: {softmax_mistake(got)}")
        if max_diff(got, expected) > 1e-5:
            no_bias = (h @ proj.weight.t()).view(B, T, G, S).softmax(-1)
            hint = ("they are the softmax of proj's weights times h, without proj's bias: call "
                    "proj(h)" if close(got, no_bias) else "compare with the docstring")
            raise Wrong(f"{what}: each head's probabilities sum to 1, but differ from "
                        f"DynamicRouter.mix_weights's by up to {max_diff(got, expected):.3g}: "
                        f"{hint}")
        check_gradients(what, got, expected, [proj.weight, proj.bias, h],
                        ['proj.weight', 'proj.bias', 'h'])


def softmax_mistake(got):
    mistakes = [
        (1, "your probabilities sum to 1 over the tokens (dim 1): the softmax runs over time, not "
            "over the S source layers (the last dim)"),
        (2, "your probabilities sum to 1 over the heads (dim 2): the softmax runs over the heads, "
            "not over the S source layers (the last dim)"),
        ((2, 3), "your probabilities sum to 1 over all G * S outputs of proj together: one "
                 "softmax for all heads, then split; each head needs its own over its S layers"),
    ]
    for dims, mistake in mistakes:
        sums = got.sum(dims)
        if close(sums, torch.ones_like(sums)):
            return mistake
    sums = got.sum(-1)
    return (f"for each token and head the probabilities must sum to 1 over the S source layers "
            f"(the last dim); yours sum to {sums.min():.3g} up to {sums.max():.3g}")


# Exercise 3: router_cost
def lime_router_cost(config, layer_idx):
    """lime.py's count for layer layer_idx's router: its parameters, and what it adds to
    GPT.flops_per_token (the model up to it less the model before it, each less its baseline)."""
    def flops(n_layer, router):
        return GPT(dataclasses.replace(config, n_layer=n_layer, router=router)).flops_per_token()

    router = CausalSelfAttention(config, layer_idx).router
    params = sum(p.numel() for p in router.parameters()) if router is not None else 0
    upto = flops(layer_idx + 1, config.router) - flops(layer_idx + 1, 'none')
    before = flops(layer_idx, config.router) - flops(layer_idx, 'none') if layer_idx else 0
    return params, upto - before


def check_router_cost(router_cost):
    shape = dict(vocab_size=64, n_layer=6, n_head=4, n_embd=32)
    for router in ('static', 'dynamic', 'none'):
        for n_kv_head in (4, 2):
            config = GPTConfig(router=router, n_kv_head=n_kv_head, **shape)
            for layer_idx in (0, 1, 5):
                what = (f"router_cost(config, {layer_idx}) with router={router!r}, n_embd=32, "
                        f"n_head=4, n_kv_head={n_kv_head}")
                got = router_cost(config, layer_idx)
                if not (isinstance(got, tuple) and len(got) == 2):
                    raise Wrong(f"{what} returned {got!r}, not a pair (parameters, flops)")
                params, flops = lime_router_cost(config, layer_idx)
                if got[0] != params:
                    raise Wrong(f"{what}: {got[0]} parameters, but the router holds {params}")
                if got[1] != flops:
                    raise Wrong(f"{what}: {got[1]} FLOPs per token, but GPT.flops_per_token adds "
                                f"{flops} for this router"
                                + flops_mistake(got[1], flops, config, layer_idx))


def flops_mistake(got, flops, config, layer_idx):
    G, D = config.n_kv_head, config.n_embd
    matmul = 6 * (D + 1) * G * (layer_idx + 1) if config.router == 'dynamic' else 0
    if 2 * (got - matmul) == flops - matmul:
        return ": your mix's part is half of it: does the mix cover the values as well as the keys?"
    wide = dataclasses.replace(config, n_head=G)  # a head n_embd // n_kv_head wide
    if G != config.n_head and got == lime_router_cost(wide, layer_idx)[1]:
        return (f": that is the count for a head size of n_embd // n_kv_head = {D // G}; every "
                f"head, a key/value head too, is n_embd // n_head = {D // config.n_head} wide")
    return ''


# Exercise 4: top_p_mask
def check_top_p_mask(top_p_mask):
    weights = 5 * torch.rand(6, 3, 7) ** 3 + 1e-3  # skewed, distinct; rows do not sum to 1
    # Two in float64: the mask must come back in the weights' dtype, whatever it is.
    cases = [(f"top_p_mask(weights, {p}) on {dtype} weights of shape (6, 3, 7)",
              weights.to(dtype), p, "keep the largest entries first, and stop once they reach p")
             for p, dtype in ((0.3, torch.float32), (0.6, torch.float64), (0.9, torch.float32),
                              (1.0, torch.float64))]
    # Ties, where the rule for equal weights decides what is kept.
    ties = {'[1.0] * 4': [1.0] * 4, '[1.0] * 40': [1.0] * 40,
            '[0.1, 0.3, 0.3, 0.3]': [0.1, 0.3, 0.3, 0.3]}
    for text, row in ties.items():
        cases.append((f"top_p_mask({text}, 0.5)", torch.tensor(row), 0.5,
                      "among equal weights the lower index ranks first, and the kept share "
                      "stops once it reaches p"))
    # Two rows of zeros among rows a case above has passed: only the zeros can be wrong there.
    zeros = weights.to(torch.float64)
    zeros[2, 1] = zeros[4, 0] = 0.0
    cases.append(("top_p_mask(weights, 0.6) where rows [2, 1] and [4, 0] are all zeros", zeros,
                  0.6, "a row of zeros keeps every entry, as lime.top_p_mask does (its shares "
                       "are 0, not 0 / 0: nothing in it outranks anything)"))
    for what, weights, p, hint in cases:
        original = weights.clone()
        got = top_p_mask(weights, p)
        if not torch.equal(weights, original):
            raise Wrong(f"{what} changed its input weights: work on a copy")
        check_shape(what, got, weights.shape, "the shape of weights")
        if got.dtype != weights.dtype:
            raise Wrong(f"{what} returns {got.dtype}, not the weights' dtype ({weights.dtype}): "
                        "the routers multiply the weights by the mask")
        if not torch.all((got == 0) | (got == 1)):
            raise Wrong(f"{what} holds values other than 0.0 and 1.0")
        expected = lime.top_p_mask(weights, p)
        order = weights.sort(dim=-1, descending=True, stable=True).indices
        if not torch.equal(got, expected) and torch.equal(got, expected.gather(-1, order)):
            raise Wrong(f"{what}: your mask is in sorted order, largest first, not in the "
                        "weights' own: put each entry back at its weight's index (scatter by "
                        "the sort's indices)")
        kept = (weights * got).sum(-1) / weights.sum(-1)  # 0 / 0 in a row of zeros: never < p
        if torch.any(kept < p - 1e-6):
            raise Wrong(f"{what}: in some rows the kept entries hold only {kept.min():.3f} of the "
                        f"row's total, less than p. Shares are of the row's total (the weights "
                        "need not sum to 1), and the entry that takes the kept share to p or past "
                        "it is kept too")
        if not torch.equal(got, expected):
            row = tuple((got != expected).any(-1).nonzero()[0].tolist())  # the first that differs
            where = f" in row {list(row)}" if row else ''
            raise Wrong(f"{what} keeps entries {got[row].nonzero().flatten().tolist()}{where}, "
                        f"lime.top_p_mask {expected[row].nonzero().flatten().tolist()}: {hint}")


# Exercise 5: cached_attention
def check_cached_attention(cached_attention):
    # The plain model first, without and then with grouped-query attention: if it fails there,
    # the attention itself is wrong, not the routing.
    right = []  # the (router, n_kv_head) settings passed so far
    for router, n_kv_head in (('none', 4), ('none', 2), ('static', 2), ('dynamic', 4)):
        config = GPTConfig(block_size=16, vocab_size=61, n_layer=3, n_head=4, n_kv_head=n_kv_head,
                           n_embd=32, router=router)
        model = GPT(config).eval()
        with torch.no_grad():
            # Every matrix larger than the init's (std 0.02): attention and routing peaked, so a
            # wrong cache or position moves the logits by more than 0.1, rounding by about 1e-5.
            for p in model.parameters():
                if p.dim() == 2:  # embeddings, projections, static routers
                    p.normal_(0, 0.3)
            idx = torch.randint(0, 61, (2, 8))
            expected = model(idx)[0]  # a full forward pass, with lime.py's attention
            got = Decoder(cached_attention, model, right).logits(idx)
        wrong = [t for t in range(idx.size(1)) if max_diff(got[:, t], expected[:, t]) > 1e-3]
        if wrong:
            raise Wrong(f"with router={router!r} (n_head=4, n_kv_head={n_kv_head}), every cache "
                        f"is right, but token {wrong[0]}'s logits differ from a full forward "
                        f"pass by up to {max_diff(got, expected):.3g}: does the new token attend "
                        "to every cached token (one query needs no causal mask)?")
        right.append((router, n_kv_head))


class Decoder:
    """Runs model one token at a time through cached_attention, a cache per layer, and checks each
    call (its output, the memory entry it sets, its cache) against lime.py's full forward pass."""

    def __init__(self, cached_attention, model, right):
        self.cached_attention = cached_attention
        self.model = model
        self.right = right
        self.cfg = model.config
        self.caches = [None] * self.cfg.n_layer
        self.running = set()  # the layers whose cached_attention is running

    def logits(self, idx):
        """The model's logits for idx (B, T), fed one token at a time: (B, T, vocab)."""
        # What a full pass attends over at each layer: the routed keys/values after RoPE.
        self.full = KVCache(self.cfg.n_layer, idx.size(1))
        self.model(idx, cache=self.full)
        for layer, block in enumerate(self.model.blocks):  # this model's own instances only
            block.attn.forward = functools.partial(self.attention, layer)
        # No KVCache goes in, so GPT.forward gives every call a fresh memory and checks no
        # positions.
        return torch.cat([self.model(idx[:, t:t + 1])[0] for t in range(idx.size(1))], dim=1)

    def attention(self, layer, h, rotary, memory=None, cache=None):  # CausalSelfAttention's
        if layer in self.running:  # the answer called attn(...), which runs the layer's forward
            raise Wrong(refusal('CausalSelfAttention.forward (which attn(...) runs)'))
        attn = self.model.blocks[layer].attn
        pos = 0 if self.caches[layer] is None else self.caches[layer][0].size(2)
        where = (f"cached_attention with router={self.cfg.router!r}, at layer {layer} and "
                 f"token {pos}")
        self.running.add(layer)
        try:
            out = self.cached_attention(attn, h, rotary, memory, self.caches[layer])
        except RuntimeError as e:  # torch's; where only the key/value heads changed, it names why
            G, H = self.cfg.n_kv_head, self.cfg.n_head
            if G < H and ('none', H) in self.right:
                raise Wrong(f"{where}: it works with n_kv_head = n_head, and fails with "
                            f"n_kv_head={G} < n_head={H} ({type(e).__name__}: {last_line(e)}): "
                            f"grouped-query attention is forgotten; each key/value head serves "
                            f"{H // G} query heads (scaled_dot_product_attention's enable_gqa)")
            raise
        finally:
            self.running.discard(layer)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise Wrong(f"{where}: it returned {type(out).__name__}, not a pair (y, (k, v))")
        y, self.caches[layer] = out
        own = None  # the new token's own keys and values after RoPE, where the layer routes
        if memory is not None:
            self.check_memory(where, attn, h, memory)
            k, v = memory[layer].unbind(dim=2)
            own = {'k': rotary(k, pos).transpose(1, 2), 'v': v.transpose(1, 2)}
        check_shape(f"{where}: its output", y, (h.size(0), 1, self.cfg.n_embd), "(B, 1, D)")
        self.check_cache(where, layer, pos, own)
        return y

    def check_memory(self, where, attn, h, memory):
        """The memory entry the answer set must be the layer's raw keys/values, as lime.py's
        forward sets it: later layers' routers mix them before RoPE."""
        got = memory[attn.layer_idx]
        raw = attn.kv_proj(h).view(*h.shape[:2], 2, attn.n_kv_head, attn.head_size)  # as lime.py's
        check_shape(f"{where}: its memory entry", got, raw.shape, "(B, 1, 2, G, hs), as kv_proj's")
        if close(got, raw):
            return
        if close(got[:, :, 1], raw[:, :, 1]):
            raise Wrong(f"{where}: the values in the layer memory are right, the keys are not "
                        "the raw keys: is RoPE applied before they go in? The memory holds "
                        "kv_proj's output as it is; RoPE comes after the router's mix")
        raise Wrong(f"{where}: the layer memory's entry for layer {attn.layer_idx} is not the "
                    f"layer's raw keys/values (off by up to {max_diff(got, raw):.3g}): kv_proj's "
                    "output, before routing and RoPE")

    def check_cache(self, where, layer, pos, own):
        """The cache the answer returned must hold, for every token so far, what a full forward
        pass attends over at this layer."""
        if not (isinstance(self.caches[layer], tuple) and len(self.caches[layer]) == 2):
            raise Wrong(f"{where}: the cache it returns is not a pair (k, v)")
        for name, got in zip('kv', self.caches[layer]):
            full = getattr(self.full, name)[layer, :, :, :pos + 1]  # (B, G, P + 1, hs)
            transposed = full.transpose(1, 2).shape  # (B, P + 1, G, hs)
            if isinstance(got, torch.Tensor) and got.shape == transposed != full.shape:
                raise Wrong(f"{where}: the cached {name} is (B, P + 1, G, hs), time before heads: "
                            "transpose k and v to (B, G, T, hs), as q, before attention and "
                            "the cache")
            check_shape(f"{where}: the cached {name}", got, full.shape,
                        f"(B, G, P + 1, hs): one entry per token so far for each of the "
                        f"{self.cfg.n_kv_head} key/value heads (cached before grouped-query "
                        "attention repeats them)")
            if close(got, full, 1e-3):
                continue
            if own is not None and close(got[:, :, -1:], own[name], 1e-3):
                what = {'k': 'keys', 'v': 'values'}[name]
                raise Wrong(f"{where}: the cache holds the layer's own {what}, not its router's "
                            "mix: a later token attends over the routed keys/values of the past "
                            "ones, so cache those")
            raise Wrong(f"{where}: the cached {name} differs from what a full forward pass "
                        f"attends over at this layer by up to {max_diff(got, full):.3g}: the "
                        "routed keys/values after RoPE, each at its own token's position")


# Exercise 6: RestrictedRouter

# (G, layer_idx, k, which): the layers RestrictedRouter(config, layer_idx, k, which) reads.
SOURCES = {(2, 5, 2, 'first'): [0, 1, 5], (2, 5, 2, 'last'): [3, 4, 5],
           (1, 4, 3, 'last'): [1, 2, 3, 4], (2, 6, 1, 'first'): [0, 6],
           (2, 2, 3, 'first'): [0, 1, 2], (1, 2, 4, 'last'): [0, 1, 2]}


def sources_mistake(read, sources, layer_idx, k, which):
    if layer_idx not in read:
        return (f"it leaves out its own layer, {layer_idx}: a restricted router reads its own "
                f"keys/values and those of k = {k} earlier layers")
    if which == 'first' and read == [m + 1 for m in sources[:-1]] + [layer_idx]:
        return (f"which='first' reads layers 1..{k}: layers count from 0, and layer 0 is the "
                "first")
    if which == 'last' and read == sources[1:]:
        return (f"it counts its own layer among the last k: it reads k - 1 = {k - 1} earlier "
                f"layers, not k = {k}")
    rule = (f"the first k = {k} layers" if which == 'first' else
            f"the k = {k} layers just before layer {layer_idx}")
    return f"it should read {sources}: {rule}, and layer {layer_idx} itself"


def check_RestrictedRouter(RestrictedRouter):
    for (G, layer_idx, k, which), sources in SOURCES.items():
        config = GPTConfig(n_layer=layer_idx + 1, n_head=G, n_embd=8 * G)
        what = f"RestrictedRouter(config, {layer_idx}, k={k}, which={which!r}) with G={G}"
        router = RestrictedRouter(config, layer_idx, k, which)
        router.reset_parameters()
        W = weights_read(lambda memory: router(None, memory), G, layer_idx + 1)[0]  # (G, S, G)
        read = [m for m in range(layer_idx + 1) if W[:, m].abs().sum() > 0]
        if read != sources:
            raise Wrong(f"{what} reads layers {read}: "
                        + sources_mistake(read, sources, layer_idx, k, which))
        params, own = sum(p.numel() for p in router.parameters()), W[:, layer_idx]
        if params > G * len(sources) * G and not torch.equal(own, torch.eye(G)):
            raise Wrong(f"{what} holds {params} numbers, G * G for each of {params // (G * G)} "
                        f"layers, but reads {len(sources)} different ones, and its own layer's "
                        "weight at init is not the identity: it reads a layer twice (its own, "
                        "once among the first k and again last?). R needs one block per layer read")
        if params != G * len(sources) * G:
            raise Wrong(f"{what} holds {params} numbers; R for the {len(sources)} layers it reads "
                        f"holds G * S * G = {G * len(sources) * G}: give it only those columns")
        if not torch.equal(own, torch.eye(G)):
            raise Wrong(f"{what}: at init its own layer's block of R is not the identity "
                        "(StaticRouter.reset_parameters puts it in the last G columns: put the "
                        "own layer's columns last)")
        # The mix with top-p: a router built apart, as the pruning would hide what it reads.
        config = dataclasses.replace(config, router_top_p=0.5)
        router = RestrictedRouter(config, layer_idx, k, which)
        router.reset_parameters()
        check_restricted_mix(f"{what} and router_top_p=0.5", router, config, sources)


def check_restricted_mix(what, router, config, sources):
    """The router's output must be lime.py's static mix of the layers it reads, by its own R as
    StaticRouter.mix_weights prunes it, with the same gradients."""
    G = config.n_kv_head
    memory = [torch.randn(2, 3, 2, G, 4) for _ in range(config.n_layer)]
    got = router(None, memory)
    check_shape(what, got, (2, 3, 2, G, 4), "(B, T, 2, G, hs), like one layer's kv")
    lime_router = StaticRouter(config, len(sources) - 1)  # a static router over those layers
    lime_router.weight = router.weight  # the same R, for the gradients too
    expected = lime_router(None, [memory[m] for m in sources])
    if max_diff(got, expected) > 1e-5:
        lime_router.top_p = 1.0
        if close(got, lime_router(None, [memory[m] for m in sources])):
            raise Wrong(f"{what}: it mixes by every entry of R, as if router_top_p were 1: mix by "
                        "self.mix_weights(), which prunes R by top-p, not by self.weight")
        raise Wrong(f"{what}: its output is not the static mix of the layers it reads by its R, "
                    "the same for every token, channel, key and value (off by "
                    f"{max_diff(got, expected):.3g})")
    check_gradients(what, got, expected, [router.weight], ['R'])


# Running a check
# What each exercise rebuilds of lime.py: an answer that calls it, however reached, would pass
# with lime.py's numbers and teach nothing. (Exercise 6 builds on StaticRouter, as meant to.)
REBUILT = {'static_mix': [StaticRouter.forward],
           'dynamic_probs': [DynamicRouter.mix_weights, DynamicRouter.forward],
           'router_cost': [GPT.num_params, GPT.flops_per_token],
           'top_p_mask': [lime.top_p_mask],
           'cached_attention': [CausalSelfAttention.forward]}


def refusal(function):
    return (f"it calls lime.py's {function}, the code this exercise asks you to write, so the "
            "numbers checked would be lime.py's: write it from torch and the parts the docstring "
            "names")


def without_lime(answer, name):
    """answer, refused (Wrong) if it calls what exercise name rebuilds: a profiler watches the
    Python functions that run while it does, however the answer reached them."""
    rebuilt = {function.__code__: function.__qualname__ for function in REBUILT.get(name, [])}

    def call(*args, **kwargs):
        called = []

        def watch(frame, event, arg):
            if event == 'call' and frame.f_code in rebuilt:
                called.append(rebuilt[frame.f_code])

        previous = sys.getprofile()
        sys.setprofile(watch)
        try:
            return answer(*args, **kwargs)
        finally:  # refused whether it returned or raised: the call itself is what is wrong
            sys.setprofile(previous)
            if called:
                raise Wrong(refusal(called[0]))
    return call


def verdict(module, name, path):
    """None where module's answer to exercise name passes its check; else what is wrong, in a
    line. The check starts from the same seed at every run."""
    answer = getattr(module, name, None)
    if answer is None:
        return f"{path} has no {name}"
    try:
        with torch.random.fork_rng(devices=[]):  # the checks seed torch: undo it after
            torch.manual_seed(0)
            globals()[f'check_{name}'](without_lime(answer, name))
        return None
    except NotImplementedError:
        return f"not written yet ({path} still raises NotImplementedError)"
    except Wrong as e:
        return str(e)
    except Exception as e:  # the answer raised: what, and where in the answer's file
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
                 if f.filename == getattr(module, '__file__', None)]
        at = f" at line {lines[-1]} of {path}" if lines else ''
        return f"it raised {type(e).__name__}{at}: {last_line(e)}"
