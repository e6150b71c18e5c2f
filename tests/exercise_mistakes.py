"""
Typical wrong answers to the exercises, and answers that hand the work to the lime.py code their
exercise rebuilds: tests/test_exercises.py's checks must reject each in one line that names its
mistake (a check that cannot fail proves nothing). A student's copy leaves this file out.
"""
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

import lime
from lime import GPT, CausalSelfAttention, StaticRouter


def mix(R, memory, heads='gmh'):
    """The static mix; heads='hmg' reads each layer's (G, G) block of R transposed."""
    G, S = R.size(0), len(memory)
    return torch.einsum(f'{heads},btcmhd->btcgd', R.view(G, S, G), torch.stack(memory, dim=3))


def cost(config, layer_idx, sides=2, head_size=None):
    """router_cost, right but where the mix covers sides of (keys, values) or heads are wider."""
    G, S = config.n_kv_head, layer_idx + 1
    hs = head_size or config.n_embd // config.n_head
    if config.router == 'none' or layer_idx == 0:
        return 0, 0
    if config.router == 'static':
        return G * S * G, 6 * sides * hs * G * S * G
    params = (config.n_embd + 1) * G * S
    return params, 6 * params + 6 * sides * hs * G * S


def top_p(weights, p, dtype=None, past_p=True, zero_rows=True, put_back=True):
    """top_p_mask by a stable sort, right but for what the arguments change: the mask's dtype,
    keeping the entry that takes the kept share past p, rows of zeros, the weights' own order."""
    total = weights.sum(-1, keepdim=True)
    share = weights / (total.clamp_min(1e-30) if zero_rows else total)
    ranked, order = share.sort(dim=-1, descending=True, stable=True)
    before = ranked.cumsum(-1) - ranked  # what the entries ranked above each hold
    keep = (before < p if past_p else before + ranked <= p).to(dtype or weights.dtype)
    return torch.zeros_like(keep).scatter(-1, order, keep) if put_back else keep


def keep_every_tie(weights, p):
    """Keeps an entry while the strictly larger ones hold less than p: ties all kept."""
    share = weights / weights.sum(-1, keepdim=True)
    larger = share[..., None, :] > share[..., :, None]
    return ((share[..., None, :] * larger).sum(-1) < p).to(weights.dtype)


def attend(attn, h, rotary, memory, past, gqa=True, route=True, transpose_kv=True,
           rope_first=False):
    """cached_attention, right but for what the arguments change: grouped-query attention, the
    router, k and v moved to (B, G, T, hs) as q is, RoPE on the keys before the memory."""
    B, T, _ = h.shape
    pos = 0 if past is None else past[0].size(2 if transpose_kv else 1)
    q = rotary(attn.q_proj(h).view(B, T, attn.n_head, attn.head_size), pos).transpose(1, 2)
    kv = attn.kv_proj(h).view(B, T, 2, attn.n_kv_head, attn.head_size)
    if rope_first:
        kv = torch.stack((rotary(kv[:, :, 0], pos), kv[:, :, 1]), dim=2)
    if memory is not None:
        memory[attn.layer_idx] = kv
    if attn.router is not None and route:
        kv = attn.router(h, memory[:attn.layer_idx + 1])
    k, v = kv.unbind(dim=2)
    if not rope_first:
        k = rotary(k, pos)
    if transpose_kv:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    if past is not None:
        time = 2 if transpose_kv else 1
        k, v = torch.cat((past[0], k), dim=time), torch.cat((past[1], v), dim=time)
    y = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, -1)), (k, v)


def restricted(sources, pruned=True):
    """A RestrictedRouter that reads the layers sources(layer_idx, k, which) gives, mixed by
    StaticRouter.forward (pruned by top-p) or by its weight R as it is."""
    class Router(StaticRouter):
        def __init__(self, config, layer_idx, k, which):
            super().__init__(config, layer_idx)
            self.sources = sources(layer_idx, k, which)
            G = config.n_kv_head
            self.weight = nn.Parameter(torch.empty(G, len(self.sources) * G))

        def forward(self, h, memory):
            read = [memory[m] for m in self.sources]
            return super().forward(h, read) if pruned else mix(self.weight, read)
    return Router


def right(l, k, which):
    return (list(range(l))[:k] if which == 'first' else list(range(l))[-k:]) + [l]


# name: (its exercise, the answer, words of the line that must name its mistake)
MISTAKES = {
    'static mix head by head': ('static_mix', lambda R, memory: R @ torch.stack(
        memory, dim=4).flatten(3, 4), "R's columns are read head by head"),
    'static mix blocks transposed': ('static_mix', lambda R, memory: mix(R, memory, 'hmg'),
                                     "(G, G) block of R is transposed"),
    'static mix without layer 0': ('static_mix', lambda R, memory: mix(
        R * (torch.arange(R.size(1)) >= R.size(0)), memory), "layer 0 is left out of the mix"),
    'static mix by lime': ('static_mix', lambda R, memory: StaticRouter.forward(
        types.SimpleNamespace(mix_weights=lambda: R), None, memory),
        "calls lime.py's StaticRouter.forward"),
    'softmax over heads': ('dynamic_probs', lambda proj, h, G: proj(h).view(
        *h.shape[:2], G, -1).softmax(dim=2), "the softmax runs over the heads"),
    'softmax over time': ('dynamic_probs', lambda proj, h, G: proj(h).view(
        *h.shape[:2], G, -1).softmax(dim=1), "the softmax runs over time"),
    'one softmax for all heads': ('dynamic_probs', lambda proj, h, G: proj(h).softmax(
        dim=-1).view(*h.shape[:2], G, -1), "one softmax for all heads, then split"),
    'softmax without bias': ('dynamic_probs', lambda proj, h, G: F.linear(h, proj.weight).view(
        *h.shape[:2], G, -1).softmax(dim=-1), "without proj's bias: call proj(h)"),
    'cost of the keys alone': ('router_cost', lambda config, l: cost(config, l, sides=1),
                               "does the mix cover the values as well as the keys?"),
    'cost with wide heads': ('router_cost', lambda config, l: cost(
        config, l, head_size=config.n_embd // config.n_kv_head),
        "the count for a head size of n_embd // n_kv_head"),
    'cost by lime': ('router_cost', lambda config, l: (GPT(config).num_params(), 0),
                     "calls lime.py's GPT.num_params"),
    'top-p short of p': ('top_p_mask', lambda w, p: top_p(w, p, past_p=False),
                         "the entry that takes the kept share to p or past it is kept"),
    'top-p keeps every tie': ('top_p_mask', keep_every_tie,
                              "among equal weights the lower index ranks first"),
    'top-p nan in zero rows': ('top_p_mask', lambda w, p: top_p(w, p, zero_rows=False),
                               "a row of zeros keeps every entry"),
    'top-p in sorted order': ('top_p_mask', lambda w, p: top_p(w, p, put_back=False),
                              "your mask is in sorted order, largest first"),
    'top-p of bools': ('top_p_mask', lambda w, p: top_p(w, p, dtype=torch.bool),
                       "returns torch.bool, not the weights' dtype"),
    'top-p in float32': ('top_p_mask', lambda w, p: top_p(w, p, dtype=torch.float32),
                         "returns torch.float32, not the weights' dtype"),
    'top-p by lime': ('top_p_mask', lime.top_p_mask, "calls lime.py's top_p_mask"),
    'router left out': ('cached_attention', lambda *args: attend(*args, route=False),
                        "the cache holds the layer's own keys, not its router's"),
    'attention without gqa': ('cached_attention', lambda *args: attend(*args, gqa=False),
                              "grouped-query attention is forgotten"),
    'k and v not transposed': ('cached_attention', lambda *args: attend(*args, transpose_kv=False),
                               "is (B, P + 1, G, hs), time before heads"),
    'rope in the memory': ('cached_attention', lambda *args: attend(*args, rope_first=True),
                           "is RoPE applied before they go in?"),
    'attention by lime': ('cached_attention', lambda attn, h, rotary, memory, past: (
        CausalSelfAttention.forward(attn, h, rotary, memory), past),
        "calls lime.py's CausalSelfAttention.forward"),
    'attention by the layer': ('cached_attention', lambda attn, h, rotary, memory, past: (
        attn(h, rotary, memory), past), "forward (which attn(...) runs)"),
    'own layer among the last k': ('RestrictedRouter', restricted(
        lambda l, k, w: right(l, k, w) if w == 'first' else list(range(l + 1))[-k:]),
        "it counts its own layer among the last k"),
    'first from layer 1': ('RestrictedRouter', restricted(
        lambda l, k, w: list(range(1, l))[:k] + [l] if w == 'first' else right(l, k, w)),
        "which='first' reads layers 1..2"),
    'first without its own layer': ('RestrictedRouter', restricted(
        lambda l, k, w: list(range(l + 1))[:k] if w == 'first' else right(l, k, w)),
        "it leaves out its own layer, 5"),
    'own layer twice': ('RestrictedRouter', restricted(
        lambda l, k, w: list(range(l + 1))[:k] + [l] if w == 'first' else right(l, k, w)),
        "it reads a layer twice"),
    'restricted without top-p': ('RestrictedRouter', restricted(right, pruned=False),
                                 "as if router_top_p were 1"),
}
