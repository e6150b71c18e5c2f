"""
The repo's answers to the exercises in exercises/student.py, kept apart from the file students
fill in. tests/test_exercises.py checks this file by default, and a student's file with
LIME_EXERCISES=exercises/student.py. The docstrings are the exercises: the same in both files.

    python -m pytest -q tests/test_exercises.py
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from lime import StaticRouter


def static_mix(R, memory):
    """Exercise 1 (easy): LIMe's static mix, what StaticRouter.forward computes (without top-p).

    R: (G, S * G), the router's weights. memory: a list of S tensors (B, T, 2, G, hs), the raw
    keys (index 0 of dim 2) and values (index 1) of layers 0..l, so S = l + 1. Column m * G + h
    of R stands for head h of layer m, and output head g is, for keys and values alike,
        out[..., g, :] = sum over m and h of R[g, m * G + h] * memory[m][..., h, :]
    Returns the mix, (B, T, 2, G, hs). Gradients must flow back to R and to the memory."""
    G, S = R.size(0), len(memory)
    kv = torch.stack(memory, dim=3)  # (B, T, 2, S, G, hs): source layer m, then its head h
    return torch.einsum('gmh,btcmhd->btcgd', R.view(G, S, G), kv)  # (B, T, 2, G, hs)


def dynamic_probs(proj, h, n_kv_head):
    """Exercise 2 (easy): the dynamic router's distribution over source layers, what
    DynamicRouter.mix_weights computes (without top-p).

    proj: the router's nn.Linear(D -> G * S). h: (B, T, D), the layer's normed input.
    n_kv_head: G. Output g * S + m of proj is head g's logit for source layer m.
    Returns probabilities (B, T, G, S): for each token and head, a softmax over the S source
    layers. Gradients must flow back to proj."""
    B, T, _ = h.shape
    logits = proj(h).view(B, T, n_kv_head, -1)  # (B, T, G, S): proj's outputs go head by head
    return logits.softmax(dim=-1)  # over the source layers, separately for each head


def router_cost(config, layer_idx):
    """Exercise 3 (medium): the parameters and training FLOPs per token of the router of layer
    layer_idx, in a model of config (a GPTConfig: router 'none', 'static' or 'dynamic',
    router_top_p 1, no hyper-connections).

    Count as GPT.num_params and GPT.flops_per_token do. Parameters: every number the router
    holds. FLOPs per token, forward and backward together: 6 per multiply-add the router does
    per token (2 FLOPs for a multiply-add, and the backward pass costs twice the forward). A
    matmul does one multiply-add per parameter per token (count the dynamic router's bias as
    one too); the mix does one for each of its weights and each number that weight scales. The
    softmax is not counted. Layer 0 has no router, nor has any layer with router='none': (0, 0).
    Returns (parameters, flops_per_token), two ints."""
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
    """Exercise 4 (medium): LIMe's top-p pruning mask (paper v1), as lime.top_p_mask makes it.

    weights: (..., S), non-negative, not necessarily summing to 1; p in (0, 1]. For each row
    (the last dim) the mask is 1.0 on the smallest set of entries whose share of the row's total
    reaches at least p, and 0.0 elsewhere: keep the largest entries, largest first, until the
    kept share reaches p. Among equal entries the one of lower index ranks first (so [1, 1, 1, 1]
    at p = 0.5 keeps [1, 1, 0, 0]); a row of zeros keeps every entry. p = 1 keeps every entry.
    Returns a tensor of weights' shape and dtype and leaves weights unchanged."""
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
    """Exercise 5 (hard): one new token through an attention layer during generation, with a
    cache of the past tokens: what CausalSelfAttention.forward does with a KVCache, for T = 1.

    attn: a lime.CausalSelfAttention; use its q_proj, kv_proj, o_proj, router (None in a plain
    model and at layer 0), n_head, n_kv_head and head_size. h: (B, 1, D), the new token's normed
    input at this layer. rotary: the model's lime.Rotary; rotary(x, pos) applies RoPE to
    x (B, T, heads, hs) whose first token is at position pos. memory: None without routers,
    else the layer memory, a list with an entry per layer: the new token's raw keys/values
    (B, 1, 2, G, hs) at the earlier layers' entries; set this layer's own entry (later layers
    read it), and give the router the entries of layers 0..l. past: None at the first
    token, else the cache this function returned for this layer at the previous token.
    Returns (y, (k, v)): y (B, 1, D), the layer's output for the new token, and the cache for
    the next token: k and v, (B, G, P + 1, hs) each, where P tokens were in past. The new token
    attends to every token so far, itself included; for each of them the cache must hold what
    a full forward pass over the whole sequence attends over at this layer."""
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
    """Exercise 6 (past the code): the paper's ablation of which layers LIMe reads. Its 150M model
    had routers that read only the first or only the last 2, 4 or 6 layers; lime.py has no such
    router. This one is StaticRouter's mix over fewer sources: layer l = layer_idx reads its own
    keys/values and those of k >= 1 earlier layers only, the first k (which='first': layers
    0..k-1) or the last k (which='last': layers l-k..l-1); all earlier layers where fewer than k
    come before l (then it is a StaticRouter).

    Subclass lime.StaticRouter and give it a weight R of shape (G, S * G) for the S layers it
    reads, their columns layer by layer in increasing order (its own layer last): then
    StaticRouter's reset_parameters (the identity on the own layer, noise on the others) and
    mix_weights (top-p) serve it as they are, and GPT.configure_optimizers and
    GPT.flops_per_token count R as a static router's. forward(h, memory) gets the whole memory,
    layers 0..l, as StaticRouter.forward does, and returns the mix, (B, T, 2, G, hs). Then
    train it against the full static router (docs/walkthrough.md, section 10, says what to expect):
        LIME_EXERCISES=exercises/student.py python -m exercises.ablation"""

    def __init__(self, config, layer_idx, k, which):
        super().__init__(config, layer_idx)
        earlier = list(range(layer_idx))  # the layers before this one
        self.sources = (earlier[:k] if which == 'first' else earlier[-k:]) + [layer_idx]
        G = config.n_kv_head
        self.weight = nn.Parameter(torch.empty(G, len(self.sources) * G))  # R over those only

    def forward(self, h, memory):  # memory: l + 1 tensors (B, T, 2, G, hs), layers 0..l
        read = [memory[m] for m in self.sources]  # S tensors, in R's column order
        return super().forward(h, read)  # StaticRouter's mix of those: (B, T, 2, G, hs)
