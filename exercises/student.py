"""
Exercises on LIMe: five functions to write, from easy to hard, then a router that lime.py does
not have (exercise 6), with an experiment to run on it. Read docs/walkthrough.md first: it walks
through lime.py in the order these exercises follow. Replace each `raise NotImplementedError`
with your answer; the docstring says what it must do. Use torch and the parts of lime.py the
docstring names, but not the function the exercise rebuilds: the check refuses an answer that
calls it. Check your answers from the repo root (each failure says what is wrong), all six or one:

    LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py
    LIME_EXERCISES=exercises/student.py python -m pytest -q tests/test_exercises.py -k static_mix
"""
import torch  # noqa: F401  for your answers
import torch.nn as nn  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from lime import StaticRouter


def static_mix(R, memory):
    """Exercise 1 (easy): LIMe's static mix, what StaticRouter.forward computes (without top-p).

    R: (G, S * G), the router's weights. memory: a list of S tensors (B, T, 2, G, hs), the raw
    keys (index 0 of dim 2) and values (index 1) of layers 0..l, so S = l + 1. Column m * G + h
    of R stands for head h of layer m, and output head g is, for keys and values alike,
        out[..., g, :] = sum over m and h of R[g, m * G + h] * memory[m][..., h, :]
    Returns the mix, (B, T, 2, G, hs). Gradients must flow back to R and to the memory."""
    raise NotImplementedError


def dynamic_probs(proj, h, n_kv_head):
    """Exercise 2 (easy): the dynamic router's distribution over source layers, what
    DynamicRouter.mix_weights computes (without top-p).

    proj: the router's nn.Linear(D -> G * S). h: (B, T, D), the layer's normed input.
    n_kv_head: G. Output g * S + m of proj is head g's logit for source layer m.
    Returns probabilities (B, T, G, S): for each token and head, a softmax over the S source
    layers. Gradients must flow back to proj."""
    raise NotImplementedError


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
    raise NotImplementedError


def top_p_mask(weights, p):
    """Exercise 4 (medium): LIMe's top-p pruning mask (paper v1), as lime.top_p_mask makes it.

    weights: (..., S), non-negative, not necessarily summing to 1; p in (0, 1]. For each row
    (the last dim) the mask is 1.0 on the smallest set of entries whose share of the row's total
    reaches at least p, and 0.0 elsewhere: keep the largest entries, largest first, until the
    kept share reaches p. Among equal entries the one of lower index ranks first (so [1, 1, 1, 1]
    at p = 0.5 keeps [1, 1, 0, 0]); a row of zeros keeps every entry. p = 1 keeps every entry.
    Returns a tensor of weights' shape and dtype and leaves weights unchanged."""
    raise NotImplementedError


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
    raise NotImplementedError


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
        raise NotImplementedError

    def forward(self, h, memory):
        raise NotImplementedError
