"""
Checks for the exercises in exercises/: each compares an answer with lime.py's own code and says
what is wrong when they differ. By default they check the repo's answers (exercises/answers.py);
LIME_EXERCISES points them at another file, a student's:

    python -m pytest -q tests/test_exercises.py
    LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py

The same checks also run on exercises/wrong.py, typical wrong answers, and must reject each with
the message that names its mistake: a check that cannot fail proves nothing. A student's copy
(python -m lab.handout) has neither answers.py nor wrong.py: the tests that need them skip there,
saying why, and the student's command runs the six checks alone. (exercise 6's experiment,
exercises/ablation.py, has its own tests: tests/test_ablation.py.)
"""
import dataclasses
import functools
import inspect
import os
import re
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import lime
from exercises import ROOT, load
from lime import GPT, CausalSelfAttention, DynamicRouter, GPTConfig, StaticRouter

EXERCISES = ['static_mix', 'dynamic_probs', 'router_cost', 'top_p_mask', 'cached_attention',
             'RestrictedRouter']


class Wrong(AssertionError):
    """An answer failed a check; the message says what is wrong."""


def max_diff(a, b):
    return (a.detach().float() - b.detach().float()).abs().max().item()


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
            reached = 'none reaches it' if g is None else f'it is off by up to {max_diff(g, e):.3g}'
            raise Wrong(f"{what}: the gradient with respect to {name} is wrong ({reached})")


# -----------------------------------------------------------------------------
# One check per exercise: it calls the answer, and raises Wrong with what is wrong


def check_static_mix(static_mix):
    # One layer, then one head, then both: R's column order only matters with several of each.
    B, T, hs = 2, 5, 4
    right = []
    for G, S in ((2, 1), (1, 3), (2, 3)):
        case = f"G={G}, S={S}"
        router = StaticRouter(GPTConfig(n_head=G, n_embd=8 * G), layer_idx=S - 1)
        with torch.no_grad():
            router.weight.normal_()  # signed, with no identity block: every entry matters
        R = router.weight
        memory = [torch.randn(B, T, 2, G, hs, requires_grad=True) for _ in range(S)]
        expected = router(None, memory)
        got = static_mix(R, memory)
        what = f"static_mix(R, memory) with G={G} key/value heads and S={S} source layers"
        check_shape(what, got, (B, T, 2, G, hs), "(B, T, 2, G, hs)")
        keys, values = (max_diff(got[:, :, i], expected[:, :, i]) for i in (0, 1))
        if max(keys, values) > 1e-5:
            wrong = 'keys and values' if min(keys, values) > 1e-5 else (
                'keys' if keys > 1e-5 else 'values')
            if right and G > 1 and S > 1:
                hint = (f"It is right with {' and with '.join(right)}, so look at the order: "
                        "R's columns go layer by layer, R[g, m * G + h] weighs head h of layer m")
            else:
                hint = "Compare with the formula in the docstring"
            raise Wrong(f"{what}: your {wrong} differ from StaticRouter.forward's by up to "
                        f"{max(keys, values):.3g}. {hint}")
        check_gradients(what, got, expected, [R, *memory],
                        ['R'] + [f'memory[{m}]' for m in range(S)])
        right.append(case)


def check_dynamic_probs(dynamic_probs):
    B, T, D = 2, 6, 16
    for G, S in ((1, 4), (2, 3), (4, 2)):
        router = DynamicRouter(GPTConfig(n_head=G, n_embd=D), layer_idx=S - 1)
        with torch.no_grad():  # varied logits, token by token, unlike the init's
            router.proj.weight.normal_(0, 0.5)
            router.proj.bias.normal_()
        h = torch.randn(B, T, D, requires_grad=True)
        expected = router.mix_weights(h)
        got = dynamic_probs(router.proj, h, G)
        what = f"dynamic_probs(proj, h, {G}) with G={G} heads and S={S} source layers"
        check_shape(what, got, (B, T, G, S), "(B, T, G, S)")
        if got.min() < 0:
            raise Wrong(f"{what}: some probabilities are negative ({got.min():.3g})")
        sums = got.sum(-1)
        if max_diff(sums, torch.ones_like(sums)) > 1e-5:
            raise Wrong(f"{what}: for each token and head the probabilities must sum to 1 over the "
                        f"S source layers (the last dim); yours sum to {sums.min():.3g} up to "
                        f"{sums.max():.3g}. Does the softmax run over the right dim?")
        if max_diff(got, expected) > 1e-5:
            raise Wrong(f"{what}: each head's probabilities sum to 1, but differ from "
                        f"DynamicRouter.mix_weights's by up to {max_diff(got, expected):.3g}: "
                        + probs_hint(got, router.proj, h, G))
        check_gradients(what, got, expected, [router.proj.weight, router.proj.bias, h],
                        ['proj.weight', 'proj.bias', 'h'])


def probs_hint(got, proj, h, G):
    """Why probabilities that sum to 1 are still wrong: the likeliest cause these inputs leave."""
    B, T, _ = h.shape
    without_bias = F.linear(h, proj.weight).view(B, T, G, -1).softmax(dim=-1)
    if max_diff(got, without_bias) <= 1e-5:
        return "they are the softmax of proj's weights times h, without proj's bias: call proj(h)"
    if G == 1:  # one head: the order of proj's outputs cannot be what is wrong
        return "compare with the docstring: a softmax over proj(h), one logit per source layer"
    return "proj's output g * S + m is head g's logit for source layer m"


def lime_routing_cost(config):
    """What LIMe's routers add to GPT.num_params and GPT.flops_per_token, summed over layers."""
    lime_model, base = GPT(config), GPT(dataclasses.replace(config, router='none'))
    return (lime_model.num_params() - base.num_params(),
            lime_model.flops_per_token() - base.flops_per_token())


def lime_router_cost(config, layer_idx):
    """lime.py's count for one router: the model up to layer_idx less the model up to the one
    before it, each less its baseline."""
    router = CausalSelfAttention(config, layer_idx).router
    upto = lime_routing_cost(dataclasses.replace(config, n_layer=layer_idx + 1))
    before = (0, 0)
    if layer_idx:
        before = lime_routing_cost(dataclasses.replace(config, n_layer=layer_idx))
    params = sum(p.numel() for p in router.parameters()) if router is not None else 0
    assert params == upto[0] - before[0]  # the checker's own consistency, not the answer's
    return params, upto[1] - before[1]


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
                    matmul = 6 * params if router == 'dynamic' else 0  # the projection's share
                    hint = (". Your mix's part is half of it: does the mix cover the values as "
                            "well as the keys?" if 2 * (got[1] - matmul) == flops - matmul else '')
                    raise Wrong(f"{what}: {got[1]} FLOPs per token, but GPT.flops_per_token adds "
                                f"{flops} for this router{hint}")


def check_top_p_mask(top_p_mask):
    torch.manual_seed(0)
    weights = 5 * torch.rand(6, 3, 7) ** 3 + 1e-3  # skewed, distinct; rows do not sum to 1
    share = weights / weights.sum(-1, keepdim=True)
    # Two of them in float64: the mask must come back in the weights' dtype, whatever it is.
    for p, dtype in ((0.3, torch.float32), (0.6, torch.float64), (0.9, torch.float32),
                     (1.0, torch.float64)):
        what = f"top_p_mask(weights, {p}) on {dtype} weights of shape (6, 3, 7)"
        got = top_p_result(top_p_mask, weights.to(dtype), p, what)
        check_zeros_and_ones(what, got)
        expected = lime.top_p_mask(weights.to(dtype), p)
        check_not_in_sorted_order(what, got, expected, weights)
        kept = (share * got).sum(-1)
        if torch.any(kept < p - 1e-6):
            raise Wrong(f"{what}: in some rows the kept entries hold only {kept.min():.3f} of the "
                        f"row's total, less than p. Shares are of the row's total (the weights "
                        "need not sum to 1), and the entry that takes the kept share to p or past "
                        "it is kept too")
        n_got, n_expected = got.sum(-1), expected.sum(-1)
        if not torch.equal(n_got, n_expected):
            row = (n_got != n_expected).nonzero()[0].tolist()
            raise Wrong(f"{what}: row {row} keeps {n_got[tuple(row)]:.0f} entries, but the "
                        f"fewest that hold p are {n_expected[tuple(row)]:.0f}: keep the largest "
                        "entries first, and stop once they reach p")
        if not torch.equal(got, expected):
            raise Wrong(f"{what}: it keeps as many entries as it should, but not the largest ones")
    for what, row, p in tied_rows():
        got = top_p_result(top_p_mask, row, p, what)
        check_zeros_and_ones(what, got)
        expected = lime.top_p_mask(row, p)
        if not torch.equal(got, expected):
            raise Wrong(f"{what} keeps entries {kept_indices(got)}, but lime.top_p_mask keeps "
                        f"{kept_indices(expected)}: among equal weights the lower index ranks "
                        "first, and the kept share stops once it reaches p")
    weights[2, 1] = weights[4, 0] = 0.0  # two rows of zeros among the others
    what = "top_p_mask(weights, 0.5) where rows [2, 1] and [4, 0] are all zeros"
    got = top_p_result(top_p_mask, weights, 0.5, what)
    for row in ((2, 1), (4, 0)):
        if not torch.equal(got[row], torch.ones(7)):
            raise Wrong(f"{what}: row {list(row)} gives {got[row].tolist()}; a row of zeros keeps "
                        "every entry, as lime.top_p_mask does (its shares are 0, not 0 / 0: "
                        "nothing in it outranks anything)")
    check_zeros_and_ones(what, got)
    if not torch.equal(got, lime.top_p_mask(weights, 0.5)):
        raise Wrong(f"{what}: the rows of zeros keep every entry, but the other rows are wrong")


def top_p_result(top_p_mask, weights, p, what):
    """top_p_mask(weights, p), checked for its shape and for leaving weights as they were."""
    original = weights.clone()
    got = top_p_mask(weights, p)
    if not torch.equal(weights, original):
        raise Wrong(f"{what} changed its input weights: work on a copy")
    check_shape(what, got, weights.shape, "the shape of weights")
    if got.dtype != weights.dtype:
        raise Wrong(f"{what} returns {got.dtype}, not the weights' dtype ({weights.dtype}): the "
                    "routers multiply the weights by the mask")
    return got


def check_not_in_sorted_order(what, got, expected, weights):
    """A mask right but left in the order of the sort, largest first, says so."""
    order = weights.sort(dim=-1, descending=True, stable=True).indices
    if not torch.equal(got, expected) and torch.equal(got, expected.gather(-1, order)):
        raise Wrong(f"{what}: your mask is in sorted order, largest first, not in the weights' "
                    "own: put each entry back at its weight's index (scatter by the sort's "
                    "indices)")


def check_zeros_and_ones(what, got):
    if not torch.all((got == 0) | (got == 1)):
        raise Wrong(f"{what} holds values other than 0.0 and 1.0")


def tied_rows():
    """(what, weights, p) with equal weights, where the tie rule decides what is kept."""
    router = DynamicRouter(GPTConfig(n_head=1, n_embd=8, router='dynamic', router_top_p=0.95), 3)
    router.reset_parameters()
    at_init = router.proj.bias.detach().softmax(-1)  # the own layer's 0.855, the others tied
    return [("top_p_mask([1.0] * 4, 0.5)", torch.ones(4), 0.5),
            ("top_p_mask([1.0] * 40, 0.5)", torch.ones(40), 0.5),
            ("top_p_mask([0.1, 0.3, 0.3, 0.3], 0.5)", torch.tensor([0.1, 0.3, 0.3, 0.3]), 0.5),
            ("top_p_mask on a dynamic router's weights at init, router_top_p=0.95, layer 3",
             at_init, 0.95)]


def kept_indices(mask):
    return mask.nonzero().flatten().tolist()


# Weights larger than the init's (std 0.02) make attention and routing peaked: a wrong cache or
# position then moves the logits by more than 0.1, while rounding stays near 1e-5.
WEIGHT_STD = 0.3


def check_cached_attention(cached_attention):
    # The plain model first: if it fails there, the attention itself is wrong, not the routing.
    right = []
    for router, n_kv_head in (('none', 2), ('static', 2), ('dynamic', 4)):
        torch.manual_seed(0)
        config = GPTConfig(block_size=16, vocab_size=61, n_layer=3, n_head=4, n_kv_head=n_kv_head,
                           n_embd=32, router=router)
        model = GPT(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:  # every matrix: embeddings, projections, static routers
                    p.normal_(0, WEIGHT_STD)
            idx = torch.randint(0, 61, (2, 8))
            expected = model(idx)[0]  # a full forward pass, with lime.py's attention
            got = decode_with(cached_attention, model, idx, router)
        what = f"with router={router!r} (n_head=4, n_kv_head={n_kv_head})"
        for t in range(idx.size(1)):
            diff = max_diff(got[:, t], expected[:, t])
            if diff <= 1e-3:
                continue
            if t == 0:
                where = ("the attention itself is wrong" if router == 'none' else
                         f"router={right[0]!r} is right, so look at the routing")
                raise Wrong(f"{what}, the first token's logits differ from a full forward pass "
                            f"by {diff:.3g}: {where}")
            raise Wrong(f"{what}, the first token's logits match a full forward pass, but token "
                        f"{t}'s differ by {diff:.3g}. The new token's own keys and values are "
                        "right, so look at what the cache keeps for past tokens, their positions, "
                        "and whether the new token sees every one of them")
        right.append(router)


def decode_with(cached_attention, model, idx, router):
    """The model's logits for idx (B, T), fed one token at a time, each attention layer replaced
    by cached_attention with a cache of its own; checks what it returns on the way."""
    B, T = idx.shape
    cfg = model.config
    hs = cfg.n_embd // cfg.n_head
    caches = [None] * cfg.n_layer
    running = set()  # the layers whose cached_attention is running

    def attention(layer, h, rotary, memory=None, cache=None):  # CausalSelfAttention.forward's
        if layer in running:  # the answer called attn(...), which runs the layer's forward
            raise Wrong(refusal('CausalSelfAttention.forward (which attn(...) runs)'))
        pos = 0 if caches[layer] is None else caches[layer][0].size(2)
        where = f"cached_attention with router={router!r}, at layer {layer} and token {pos}"
        running.add(layer)
        try:
            y, caches[layer] = cached_attention(model.blocks[layer].attn, h, rotary, memory,
                                                caches[layer])
        except (RuntimeError, TypeError) as e:  # a router given other layers fails inside
            if memory is not None and memory[layer] is None:
                raise Wrong(f"{where}: the router reads layers 0..{layer}, and the memory has no "
                            f"entry for layer {layer}: set memory[attn.layer_idx] to this layer's "
                            "raw keys/values before routing") from e
            if memory is not None:
                raise Wrong(f"{where}: the router failed on what it was given ({e}); at layer "
                            f"{layer} it reads the {layer + 1} entries of layers 0..{layer}: "
                            f"memory[:attn.layer_idx + 1]") from e
            raise
        finally:
            running.discard(layer)
        if memory is not None and memory[layer] is None:
            raise Wrong(f"{where}: afterwards the memory has no entry for layer {layer}: set "
                        "memory[attn.layer_idx] to this layer's raw keys/values (later layers "
                        "read it)")
        check_shape(f"{where}: its output", y, (B, 1, cfg.n_embd), "(B, 1, D)")
        if not (isinstance(caches[layer], tuple) and len(caches[layer]) == 2):
            raise Wrong(f"{where}: the cache it returns is not a pair (k, v)")
        for name, x in zip('kv', caches[layer]):
            check_shape(f"{where}: the cached {name}", x, (B, cfg.n_kv_head, pos + 1, hs),
                        f"(B, G, P + 1, hs): one entry per token so far for each of the "
                        f"{cfg.n_kv_head} key/value heads (cached before grouped-query attention "
                        "repeats them)")
        return y

    for layer, block in enumerate(model.blocks):  # this model's own instances only
        block.attn.forward = functools.partial(attention, layer)
    # No KVCache goes in, so GPT.forward gives every call a fresh memory and checks no positions.
    return torch.cat([model(idx[:, t:t + 1])[0] for t in range(T)], dim=1)  # (B, T, vocab)


def restricted_sources(layer_idx, k, which):
    """The layers RestrictedRouter(config, layer_idx, k, which) reads, and the rule in words."""
    earlier = list(range(layer_idx))
    if which == 'first':
        return earlier[:k] + [layer_idx], f"the first k = {k} layers, and layer {layer_idx} itself"
    return earlier[-k:] + [layer_idx], (f"the k = {k} layers just before layer {layer_idx}, and "
                                        f"layer {layer_idx} itself")


def mix_matrix(router, G, S):
    """(G, S, G): the weight the router gives head h of layer m in output head g, read off its
    output for memories that hold a 1 at one (layer, head) and 0 elsewhere."""
    columns = []
    with torch.no_grad():
        for m in range(S):
            for h in range(G):
                memory = [torch.zeros(1, 1, 2, G, 1) for _ in range(S)]
                memory[m][..., h, :] = 1.0
                columns.append(router(None, memory)[0, 0, 0, :, 0])  # (G,): output head g
    return torch.stack(columns, dim=1).view(G, S, G)


def check_RestrictedRouter(RestrictedRouter):
    B, T, hs = 2, 3, 4
    for G, layer_idx, k, which in ((2, 5, 2, 'first'), (2, 5, 2, 'last'), (1, 4, 3, 'last'),
                                   (2, 6, 1, 'first'), (2, 2, 3, 'first'), (1, 2, 4, 'last')):
        config = GPTConfig(n_layer=layer_idx + 1, n_head=G, n_embd=2 * hs * G)
        what = f"RestrictedRouter(config, {layer_idx}, k={k}, which={which!r}) with G={G}"
        router = RestrictedRouter(config, layer_idx, k, which)
        if not isinstance(router, StaticRouter):
            raise Wrong(f"{what} is not a lime.StaticRouter: subclass it, and its reset_parameters "
                        "and mix_weights serve yours as they are")
        router.reset_parameters()
        S = layer_idx + 1
        W = mix_matrix(router, G, S)  # (G, S, G)
        read = [m for m in range(S) if W[:, m].abs().sum() > 0]
        sources, rule = restricted_sources(layer_idx, k, which)
        if read != sources:
            raise Wrong(f"{what} reads layers {read}; it should read {sources}: {rule}")
        params = sum(p.numel() for p in router.parameters())
        if params > G * len(sources) * G and not torch.equal(W[:, layer_idx], torch.eye(G)):
            raise Wrong(f"{what} holds {params} numbers, G * G for each of {params // (G * G)} "
                        f"layers, but reads {len(sources)} different ones, and its own layer's "
                        "weight at init is not the identity: it reads a layer twice (its own, "
                        "once among the first k and again last?). R needs one block per layer read")
        if params != G * len(sources) * G:
            raise Wrong(f"{what} holds {params} numbers; R for the {len(sources)} layers it reads "
                        f"holds G * S * G = {G * len(sources) * G}: give it only those columns")
        if not torch.equal(W[:, layer_idx], torch.eye(G)):
            raise Wrong(f"{what}: at init its own layer's block of R is not the identity "
                        "(StaticRouter.reset_parameters puts it in the last G columns: put the "
                        "own layer's columns last)")
        memory = [torch.randn(B, T, 2, G, hs) for _ in range(S)]
        got = router(None, memory)
        check_shape(what, got, (B, T, 2, G, hs), "(B, T, 2, G, hs), like one layer's kv")
        expected = torch.einsum('gmh,btcmhd->btcgd', W, torch.stack(memory, dim=3))
        if max_diff(got, expected) > 1e-5:
            raise Wrong(f"{what}: its output is not one fixed mix of the memory's heads, the same "
                        "for every token, channel, key and value (off by "
                        f"{max_diff(got, expected):.3g})")
        grads = torch.autograd.grad(got.sum(), list(router.parameters()), allow_unused=True) \
            if got.requires_grad else [None]
        if any(g is None or not g.abs().sum() > 0 for g in grads):
            raise Wrong(f"{what}: no gradient reaches its weight R from its output")


CHECKS = {name: globals()[f'check_{name}'] for name in EXERCISES}
# What each exercise rebuilds of lime.py. An answer that calls it, imported under any name or
# reached through a router or model the answer builds, would pass with lime.py's own numbers and
# teach nothing: the check refuses it. (Exercise 6 builds on StaticRouter, as it is meant to.)
REBUILT = {'static_mix': [StaticRouter.forward],
           'dynamic_probs': [DynamicRouter.mix_weights, DynamicRouter.forward],
           'router_cost': [GPT.num_params, GPT.flops_per_token],
           'top_p_mask': [lime.top_p_mask],
           'cached_attention': [CausalSelfAttention.forward],
           'RestrictedRouter': []}


def refusal(function):
    return (f"it calls lime.py's {function}, the code this exercise asks you to write, so the "
            "numbers checked would be lime.py's: write it from torch and the parts the docstring "
            "names")


def without_lime(answer, name):
    """answer, refused (Wrong) if it calls what exercise name rebuilds: a profiler watches the
    Python functions that run while it does, however the answer reached them."""
    rebuilt = {function.__code__: function.__qualname__ for function in REBUILT[name]}
    if not rebuilt:
        return answer

    @functools.wraps(answer)
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


def check(module, name, path):
    """Run exercise name's check on module's answer; a failure names the exercise and says what
    is wrong, without a traceback through the checks."""
    answer = getattr(module, name, None)
    if answer is None:
        pytest.fail(f"{name}: {path} has no function {name}", pytrace=False)
    try:
        with torch.random.fork_rng(devices=[]):  # the checks seed torch: undo it after
            CHECKS[name](without_lime(answer, name))
        return
    except NotImplementedError:
        message = f"not written yet ({path} still raises NotImplementedError)"
    except Wrong as e:
        message = str(e)
    pytest.fail(f"{name}: {message}", pytrace=False)  # outside except: no chained traceback


@pytest.fixture(autouse=True)
def one_thread():
    """One thread: on tensors this small a second thread costs more to wake than it saves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -----------------------------------------------------------------------------
# The tests


def exercises_file(name, needed_by):
    """exercises/name, loaded; where this copy lacks it (a student's, from python -m lab.handout,
    or a clone with it deleted), the test skips, saying why."""
    path = ROOT / 'exercises' / name
    if not path.is_file():
        pytest.skip(f"exercises/{name} is not in this copy (a student's handout leaves it out): "
                    f"{needed_by}")
    return load(path)


def student_answers(path):
    """The file LIME_EXERCISES names, loaded; one line where it cannot be."""
    try:
        return load(path)
    except FileNotFoundError as e:
        pytest.fail(str(e), pytrace=False)
    except SyntaxError as e:
        pytest.fail(f"{path}, line {e.lineno}: {e.msg}", pytrace=False)


@pytest.mark.parametrize('name', EXERCISES)
def test_answer_passes_the_check(name):
    path = os.environ.get('LIME_EXERCISES')
    if path is None:
        path = 'exercises/answers.py'
        answers = exercises_file('answers.py', "check your own answers: LIME_EXERCISES="
                                 "exercises/student.py python -m pytest -q tests/test_exercises.py")
    else:
        answers = student_answers(path)
    check(answers, name, path)


# Each answer in exercises/wrong.py: (its exercise, part of the message the check must give it).
WRONG_ANSWERS = {
    'static_mix': ('static_mix', "so look at the order: R's columns go layer by layer"),
    'static_mix_through_lime': ('static_mix', "calls lime.py's StaticRouter.forward"),
    'dynamic_probs': ('dynamic_probs', "must sum to 1 over the S source layers"),
    'dynamic_probs_without_bias': ('dynamic_probs', "without proj's bias: call proj(h)"),
    'router_cost': ('router_cost', "Your mix's part is half of it"),
    'router_cost_by_difference': ('router_cost', "calls lime.py's GPT.num_params"),
    'top_p_mask': ('top_p_mask', "less than p"),
    'top_p_mask_keeps_every_tie': ('top_p_mask', "among equal weights the lower index ranks first"),
    'top_p_mask_keeps_no_zero_row': ('top_p_mask', "a row of zeros keeps every entry"),
    'top_p_mask_in_sorted_order': ('top_p_mask', "your mask is in sorted order, largest first"),
    'top_p_mask_of_bools': ('top_p_mask', "returns torch.bool, not the weights' dtype"),
    'top_p_mask_from_lime': ('top_p_mask', "calls lime.py's top_p_mask"),
    'cached_attention': ('cached_attention', "look at what the cache keeps for past tokens"),
    'cached_attention_through_lime': ('cached_attention',
                                      "calls lime.py's CausalSelfAttention.forward"),
    'cached_attention_calls_the_layer': ('cached_attention', "forward (which attn(...) runs)"),
    'RestrictedRouter': ('RestrictedRouter', "reads layers [4, 5]; it should read [3, 4, 5]"),
    'RestrictedRouterWithoutItsOwnLayer': ('RestrictedRouter',
                                           "reads layers [0, 1]; it should read [0, 1, 5]"),
    'RestrictedRouterReadingItsOwnLayerTwice': ('RestrictedRouter', "it reads a layer twice"),
}
WRONG_NEEDED = "it holds the wrong answers that prove the checks can fail"


@pytest.mark.parametrize('wrong', WRONG_ANSWERS)
def test_check_rejects_the_typical_wrong_answer(wrong):
    exercise, message = WRONG_ANSWERS[wrong]
    answer = getattr(exercises_file('wrong.py', WRONG_NEEDED), wrong)
    with pytest.raises(pytest.fail.Exception, match=re.escape(message)):
        check(types.SimpleNamespace(**{exercise: answer}), exercise, 'exercises/wrong.py')


def test_every_wrong_answer_is_checked_and_every_exercise_has_one():
    wrong = exercises_file('wrong.py', WRONG_NEEDED)
    defined = {name for name, value in vars(wrong).items()
               if callable(value) and getattr(value, '__module__', None) == wrong.__name__}
    assert defined == set(WRONG_ANSWERS)
    assert {exercise for exercise, _ in WRONG_ANSWERS.values()} == set(EXERCISES)


def test_an_answer_that_is_lime_pys_own_function_is_refused():
    # `from lime import top_p_mask` in place of an answer: it passes every other check.
    with pytest.raises(pytest.fail.Exception, match="top_p_mask: it calls lime.py's top_p_mask"):
        check(types.SimpleNamespace(top_p_mask=lime.top_p_mask), 'top_p_mask', 'a student file')


def test_an_unwritten_exercise_says_not_written_yet():
    def static_mix(R, memory):  # as exercises/student.py hands it out
        raise NotImplementedError

    unwritten = types.SimpleNamespace(static_mix=static_mix)
    with pytest.raises(pytest.fail.Exception, match='static_mix: not written yet'):
        check(unwritten, 'static_mix', 'exercises/student.py')


def test_student_file_has_each_exercise_with_the_answers_signature_and_docstring():
    answers = exercises_file('answers.py', "this test compares exercises/student.py with it")
    student = load('exercises/student.py')
    for name in EXERCISES:
        mine, theirs = getattr(student, name, None), getattr(answers, name)
        assert mine is not None, f"exercises/student.py has no {name}"
        assert inspect.signature(mine) == inspect.signature(theirs), f"{name}: signatures differ"
        assert mine.__doc__ == theirs.__doc__, f"{name}: student.py's docstring is not answers.py's"
