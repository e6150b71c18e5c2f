"""
The repo's answers to the exercises of exercises/student.py (whose docstrings state them), kept
apart from the file students fill in; tests/test_exercises.py checks this file by default.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from lime import StaticRouter


def static_mix(R, memory):
    G, S = R.size(0), len(memory)
    kv = torch.stack(memory, dim=3)  # (B, T, 2, S, G, hs): source layer m, then its head h
    return torch.einsum('gmh,btcmhd->btcgd', R.view(G, S, G), kv)  # (B, T, 2, G, hs)


def dynamic_probs(proj, h, n_kv_head):
    B, T, _ = h.shape
    logits = proj(h).view(B, T, n_kv_head, -1)  # (B, T, G, S): proj's outputs go head by head
    return logits.softmax(dim=-1)  # over the source layers, separately for each head


def router_cost(config, layer_idx):
    G, S = config.n_kv_head, layer_idx + 1
    hs = config.n_embd // config.n_head
    if config.router == 'none' or layer_idx == 0:
        return 0, 0
    if config.router == 'static':
        params = G * S * G  # R
        # Each R[g, m * G + h] scales all hs channels of head h's key and of its value: 2 hs.
        return params, 6 * 2 * hs * params
    params = (config.n_embd + 1) * G * S  # Wr and its bias
    # Each probability a[g, m] scales the hs channels of head g's key and value of layer m.
    return params, 6 * params + 6 * 2 * hs * G * S


def top_p_mask(weights, p):
    if p >= 1.0:
        return torch.ones_like(weights)  # a sum of shares can round to just below 1
    # A row of zeros has shares of 0 (not 0 / 0), so nothing ranks above any entry: all kept.
    share = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    # Keep an entry while the entries ranked above it hold less than p: then the kept set is the
    # largest entries, up to and including the one that takes the kept share to p. Entry j ranks
    # above entry i when it is larger, or equal and of lower index.
    index = torch.arange(weights.size(-1), device=weights.device)
    larger = share[..., None, :] > share[..., :, None]  # (..., S, S): [i, j] = j is larger than i
    tied_before = (share[..., None, :] == share[..., :, None]) & (index < index[:, None])
    mass_above = (share[..., None, :] * (larger | tied_before)).sum(-1)  # (..., S)
    return (mass_above < p).to(weights.dtype)


def cached_attention(attn, h, rotary, memory, past):
    B, T, _ = h.shape
    pos = 0 if past is None else past[0].size(2)  # the new token's position
    q = attn.q_proj(h).view(B, T, attn.n_head, attn.head_size)  # (B, 1, H, hs)
    kv = attn.kv_proj(h).view(B, T, 2, attn.n_kv_head, attn.head_size)  # (B, 1, 2, G, hs)
    if memory is not None:
        memory[attn.layer_idx] = kv  # raw, as later layers' routers expect it
    if attn.router is not None:
        # the routed mix of layers 0..l: it never changes for this token again
        kv = attn.router(h, memory[:attn.layer_idx + 1])
    k, v = kv.unbind(dim=2)  # (B, 1, G, hs) each
    q, k = rotary(q, pos), rotary(k, pos)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, 1, hs)
    if past is not None:
        k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)  # (B, G, P+1, hs)
    # One query and every key up to it: no mask (is_causal would hide all but the first key).
    y = F.scaled_dot_product_attention(q, k, v, enable_gqa=attn.n_kv_head != attn.n_head)
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, -1)), (k, v)


class RestrictedRouter(StaticRouter):

    def __init__(self, config, layer_idx, k, which):
        super().__init__(config, layer_idx)
        earlier = list(range(layer_idx))  # the layers before this one
        self.sources = (earlier[:k] if which == 'first' else earlier[-k:]) + [layer_idx]
        G = config.n_kv_head
        self.weight = nn.Parameter(torch.empty(G, len(self.sources) * G))  # R over those only

    def forward(self, h, memory):  # memory: l + 1 tensors (B, T, 2, G, hs), layers 0..l
        read = [memory[m] for m in self.sources]  # S tensors, in R's column order
        return super().forward(h, read)  # StaticRouter's mix of those: (B, T, 2, G, hs)
