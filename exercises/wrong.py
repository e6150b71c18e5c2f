"""
Typical wrong answers to the exercises, each a near miss of exercises/answers.py, named for its
exercise (with what it gets wrong after the name where an exercise has several), and answers that
hand the work to the lime.py code the exercise rebuilds. They are not for students:
tests/test_exercises.py runs its checks on them to prove that each check can fail, and fails with
a message that says what is wrong.

    python -m pytest -q tests/test_exercises.py -k wrong
"""
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

import lime
from lime import GPT, CausalSelfAttention, GPTConfig, KVCache, StaticRouter


def static_mix(R, memory):
    """Stacks the sources head by head, (head, layer), where R's columns go layer by layer: right
    with one head or one layer, wrong with both."""
    kv = torch.stack(memory, dim=4).flatten(3, 4)  # (B, T, 2, G * S, hs): h * S + m, not m * G + h
    return R @ kv


def static_mix_with_blocks_transposed(R, memory):
    """Reads R[h, m * G + g] as the weight of head h in output head g: each layer's (G, G) block
    of R transposed. Right where G = 1 (a block is one number), wrong with several heads."""
    G, S = R.size(0), len(memory)
    kv = torch.stack(memory, dim=3)
    return torch.einsum('hmg,btcmhd->btcgd', R.view(G, S, G), kv)


def static_mix_from_layer_1(R, memory):
    """Sums over the layers from 1, as the routers exist from layer 1: layer 0's keys and values,
    which every router reads, are left out of the mix."""
    G = R.size(0)
    out = torch.zeros_like(memory[0])
    for m in range(1, len(memory)):
        block = R[:, m * G:(m + 1) * G]  # (G, G): output head g, head h of layer m
        out = out + torch.einsum('gh,btchd->btcgd', block, memory[m])
    return out


def static_mix_through_lime(R, memory):
    """Puts R in a StaticRouter and runs lime.py's own forward: lime.py's numbers, not a mix."""
    G, S = R.size(0), len(memory)
    router = StaticRouter(GPTConfig(n_head=G, n_embd=2 * G), layer_idx=S - 1)
    router.mix_weights = lambda: R  # StaticRouter.forward mixes what mix_weights returns
    return router(None, memory)


def dynamic_probs(proj, h, n_kv_head):
    """The softmax runs over the heads instead of the source layers."""
    B, T, _ = h.shape
    return proj(h).view(B, T, n_kv_head, -1).softmax(dim=2)


def dynamic_probs_over_time(proj, h, n_kv_head):
    """The softmax runs over the tokens (dim 1), not the source layers."""
    B, T, _ = h.shape
    return proj(h).view(B, T, n_kv_head, -1).softmax(dim=1)


def dynamic_probs_over_all_outputs(proj, h, n_kv_head):
    """One softmax over all G * S outputs of proj, then split into heads: each head's
    probabilities sum to 1 / G or so, not 1. Right with one head."""
    B, T, _ = h.shape
    return proj(h).softmax(dim=-1).view(B, T, n_kv_head, -1)


def dynamic_probs_without_bias(proj, h, n_kv_head):
    """Multiplies h by proj's weight alone: proj's bias is left out of the logits."""
    B, T, _ = h.shape
    return F.linear(h, proj.weight).view(B, T, n_kv_head, -1).softmax(dim=-1)


def router_cost(config, layer_idx):
    """Counts the mix's multiply-adds on the keys only, forgetting that the same weights also
    mix the values."""
    G, S = config.n_kv_head, layer_idx + 1
    hs = config.n_embd // config.n_head
    if config.router == 'none' or layer_idx == 0:
        return 0, 0
    if config.router == 'static':
        return G * S * G, 6 * hs * G * S * G
    params = (config.n_embd + 1) * G * S
    return params, 6 * params + 6 * hs * G * S


def router_cost_with_head_size_per_kv_head(config, layer_idx):
    """Takes the head size as n_embd // n_kv_head: right without grouped-query attention, too
    large with it (a key/value head is as wide as a query head)."""
    G, S = config.n_kv_head, layer_idx + 1
    hs = config.n_embd // config.n_kv_head
    if config.router == 'none' or layer_idx == 0:
        return 0, 0
    if config.router == 'static':
        params = G * S * G
        return params, 6 * 2 * hs * params
    params = (config.n_embd + 1) * G * S
    return params, 6 * params + 6 * 2 * hs * G * S


def router_cost_by_difference(config, layer_idx):
    """Counts nothing: the model up to layer_idx less the one before it, each less its baseline,
    by lime.py's own GPT.num_params and GPT.flops_per_token."""
    def routing(n_layer):
        if n_layer == 0:
            return 0, 0
        model = GPT(dataclasses.replace(config, n_layer=n_layer))
        base = GPT(dataclasses.replace(config, n_layer=n_layer, router='none'))
        return (model.num_params() - base.num_params(),
                model.flops_per_token() - base.flops_per_token())

    (params, flops), (params_before, flops_before) = routing(layer_idx + 1), routing(layer_idx)
    return params - params_before, flops - flops_before


def top_p_mask(weights, p):
    """Stops before the entry that takes the kept share to p: keeps those whose running total
    stays within p, so the kept share falls short of p."""
    if p >= 1.0:
        return torch.ones_like(weights)
    share = weights / weights.sum(-1, keepdim=True)
    sorted_share, order = share.sort(dim=-1, descending=True)
    keep = (sorted_share.cumsum(-1) <= p).to(weights.dtype)
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_p_mask_keeps_every_tie(weights, p):
    """Keeps an entry while the entries strictly larger hold less than p: every entry tied with
    the last one kept is kept too ([1, 1, 1, 1] at p = 0.5 keeps all four, not two)."""
    if p >= 1.0:
        return torch.ones_like(weights)
    share = weights / weights.sum(-1, keepdim=True)
    larger = share[..., None, :] > share[..., :, None]
    return ((share[..., None, :] * larger).sum(-1) < p).to(weights.dtype)


def top_p_mask_keeps_no_zero_row(weights, p):
    """Right on ties (a stable sort), but a row of zeros has shares 0 / 0 = nan, and keeps none."""
    if p >= 1.0:
        return torch.ones_like(weights)
    share = weights / weights.sum(-1, keepdim=True)
    sorted_share, order = share.sort(dim=-1, descending=True, stable=True)
    keep = (sorted_share.cumsum(-1) - sorted_share < p).to(weights.dtype)
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_p_mask_in_sorted_order(weights, p):
    """Right in sorted order, largest first, but never put back at the weights' own indices."""
    if p >= 1.0:
        return torch.ones_like(weights)
    share = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    sorted_share, _ = share.sort(dim=-1, descending=True, stable=True)
    return (sorted_share.cumsum(-1) - sorted_share < p).to(weights.dtype)


def top_p_mask_of_bools(weights, p):
    """Right, but a mask of bools, where the routers multiply the weights by it."""
    if p >= 1.0:
        return torch.ones_like(weights, dtype=torch.bool)
    share = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    sorted_share, order = share.sort(dim=-1, descending=True, stable=True)
    keep = sorted_share.cumsum(-1) - sorted_share < p
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_p_mask_in_float32(weights, p):
    """Right, but always float32, whatever the weights' dtype."""
    if p >= 1.0:
        return torch.ones(weights.shape)
    share = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    sorted_share, order = share.sort(dim=-1, descending=True, stable=True)
    keep = (sorted_share.cumsum(-1) - sorted_share < p).float()
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_p_mask_from_lime(weights, p):
    """Hands the work to lime.py's own top_p_mask."""
    return lime.top_p_mask(weights, p)


def top_p_mask_from_lime_renamed(weights, p):
    """Imports lime.py's top_p_mask under another name, and calls that."""
    from lime import top_p_mask as keep_the_largest
    return keep_the_largest(weights, p)


def cached_attention(attn, h, rotary, memory, past):
    """Caches the layer's own keys and values, as a plain transformer does, and routes only the
    new token's: right for the first token, wrong for every later one in a LIMe model."""
    B, T, _ = h.shape
    pos = 0 if past is None else past[0].size(2)
    q = attn.q_proj(h).view(B, T, attn.n_head, attn.head_size)
    kv = attn.kv_proj(h).view(B, T, 2, attn.n_kv_head, attn.head_size)
    if memory is not None:
        memory[attn.layer_idx] = kv
    routed = attn.router(h, memory[:attn.layer_idx + 1]) if attn.router is not None else kv
    own_k, own_v = kv.unbind(dim=2)
    k, v = routed.unbind(dim=2)
    q, k, own_k = rotary(q, pos), rotary(k, pos), rotary(own_k, pos)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    own_k, own_v = own_k.transpose(1, 2), own_v.transpose(1, 2)
    if past is not None:
        k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        own_k, own_v = torch.cat((past[0], own_k), dim=2), torch.cat((past[1], own_v), dim=2)
    y = F.scaled_dot_product_attention(q, k, v, enable_gqa=attn.n_kv_head != attn.n_head)
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, -1)), (own_k, own_v)


def cached_attention_through_lime(attn, h, rotary, memory, past):
    """Hands the step to lime.py's CausalSelfAttention.forward, with a KVCache holding past."""
    layer = attn.layer_idx
    pos = 0 if past is None else past[0].size(2)
    cache = KVCache(layer + 1, pos + 1)
    if past is not None:
        cache.update(layer, *past)
        cache.pos = pos
    y = CausalSelfAttention.forward(attn, h, rotary, memory, cache)
    return y, (cache.k[layer], cache.v[layer])


def cached_attention_calls_the_layer(attn, h, rotary, memory, past):
    """Runs the layer itself, attn(...), which is CausalSelfAttention.forward: the new token alone,
    with no cache."""
    y = attn(h, rotary, memory)
    return y, past


def cached_attention_without_gqa(attn, h, rotary, memory, past):
    """Right, but attends as if every query head had a key/value head of its own: with fewer
    key/value heads (grouped-query attention) the attention fails on the heads' count."""
    B, T, _ = h.shape
    pos = 0 if past is None else past[0].size(2)
    q = attn.q_proj(h).view(B, T, attn.n_head, attn.head_size)
    kv = attn.kv_proj(h).view(B, T, 2, attn.n_kv_head, attn.head_size)
    if memory is not None:
        memory[attn.layer_idx] = kv
    if attn.router is not None:
        kv = attn.router(h, memory[:attn.layer_idx + 1])
    k, v = kv.unbind(dim=2)
    q, k = rotary(q, pos), rotary(k, pos)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if past is not None:
        k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
    y = F.scaled_dot_product_attention(q, k, v)
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, -1)), (k, v)


def cached_attention_with_q_alone_transposed(attn, h, rotary, memory, past):
    """Moves the heads before time in q, but not in k and v: they stay (B, T, G, hs), so the
    attention reads the heads as tokens, and the cache is laid out the wrong way."""
    B, T, _ = h.shape
    pos = 0 if past is None else past[0].size(1)
    q = attn.q_proj(h).view(B, T, attn.n_head, attn.head_size)
    kv = attn.kv_proj(h).view(B, T, 2, attn.n_kv_head, attn.head_size)
    if memory is not None:
        memory[attn.layer_idx] = kv
    if attn.router is not None:
        kv = attn.router(h, memory[:attn.layer_idx + 1])
    k, v = kv.unbind(dim=2)
    q, k = rotary(q, pos), rotary(k, pos)
    q = q.transpose(1, 2)
    if past is not None:
        k, v = torch.cat((past[0], k), dim=1), torch.cat((past[1], v), dim=1)
    y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, -1)), (k, v)


def cached_attention_with_rope_in_memory(attn, h, rotary, memory, past):
    """Applies RoPE to the keys before they go into the layer memory, then routes the rotated
    keys. One token at one position: the numbers are the same, but later layers' routers are
    handed rotated keys where lime.py hands them raw ones."""
    B, T, _ = h.shape
    pos = 0 if past is None else past[0].size(2)
    q = rotary(attn.q_proj(h).view(B, T, attn.n_head, attn.head_size), pos)
    k, v = attn.kv_proj(h).view(B, T, 2, attn.n_kv_head, attn.head_size).unbind(dim=2)
    kv = torch.stack((rotary(k, pos), v), dim=2)
    if memory is not None:
        memory[attn.layer_idx] = kv
    if attn.router is not None:
        kv = attn.router(h, memory[:attn.layer_idx + 1])
    k, v = kv.unbind(dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if past is not None:
        k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
    y = F.scaled_dot_product_attention(q, k, v, enable_gqa=attn.n_kv_head != attn.n_head)
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, -1)), (k, v)


class RestrictedRouter(StaticRouter):
    """Counts its own layer among the last k: which='last' reads k - 1 earlier layers, not k."""

    def __init__(self, config, layer_idx, k, which):
        super().__init__(config, layer_idx)
        layers = list(range(layer_idx + 1))
        self.sources = layers[:k] + [layer_idx] if which == 'first' else layers[-k:]
        self.sources = sorted(set(self.sources))
        G = config.n_kv_head
        self.weight = nn.Parameter(torch.empty(G, len(self.sources) * G))

    def forward(self, h, memory):
        return super().forward(h, [memory[m] for m in self.sources])


class RestrictedRouterWithoutItsOwnLayer(RestrictedRouter):
    """which='first' reads the first k layers and not its own: the identity of the init lands on
    layer k - 1, and the layer's own keys and values are lost."""

    def __init__(self, config, layer_idx, k, which):
        super().__init__(config, layer_idx, k, which)
        if which == 'first':
            self.sources = list(range(min(k, layer_idx + 1)))
            G = config.n_kv_head
            self.weight = nn.Parameter(torch.empty(G, len(self.sources) * G))


class RestrictedRouterReadingItsOwnLayerTwice(StaticRouter):
    """which='first' takes the first k of layers 0..l, its own among them, then its own layer
    again: where l < k it reads its own layer twice, with two blocks of R."""

    def __init__(self, config, layer_idx, k, which):
        super().__init__(config, layer_idx)
        layers = list(range(layer_idx + 1))
        earlier = layers[:k] if which == 'first' else layers[:-1][-k:]
        self.sources = earlier + [layer_idx]
        G = config.n_kv_head
        self.weight = nn.Parameter(torch.empty(G, len(self.sources) * G))

    def forward(self, h, memory):
        return super().forward(h, [memory[m] for m in self.sources])


class RestrictedRouterFirstFromLayer1(RestrictedRouter):
    """which='first' reads layers 1..k, as if layers counted from 1: layer 0 is the first."""

    def __init__(self, config, layer_idx, k, which):
        super().__init__(config, layer_idx, k, which)
        if which == 'first':
            earlier = list(range(1, layer_idx))
            self.sources = earlier[:k] + [layer_idx]
            G = config.n_kv_head
            self.weight = nn.Parameter(torch.empty(G, len(self.sources) * G))


class RestrictedRouterWithoutTopP(StaticRouter):
    """Reads the right layers, but mixes by self.weight, not self.mix_weights(): with
    router_top_p < 1 nothing is pruned."""

    def __init__(self, config, layer_idx, k, which):
        super().__init__(config, layer_idx)
        earlier = list(range(layer_idx))
        earlier = earlier[:k] if which == 'first' else earlier[-k:]
        self.sources = earlier + [layer_idx]
        G = config.n_kv_head
        self.weight = nn.Parameter(torch.empty(G, len(self.sources) * G))

    def forward(self, h, memory):
        G = self.weight.size(0)
        kv = torch.stack([memory[m] for m in self.sources], dim=3)
        return torch.einsum('gmh,btcmhd->btcgd', self.weight.view(G, -1, G), kv)
