"""
lime.py: a LLaMA-style GPT with Layer-Integrated Memory (LIMe, arXiv 2502.09245), in one file.

What differs from nanoGPT's model.py:
- LLaMA blocks: RMSNorm, rotary position embeddings (RoPE), a SwiGLU MLP, no biases, grouped-
  query attention (n_kv_head key/value heads), tied embeddings padded to a multiple of 64.
- LIMe: every layer puts its raw (pre-RoPE) keys and values into a "layer memory", and with
  router='static' or 'dynamic' layer l >= 1 attends over a learned mix of the keys and values
  of layers 0..l (StaticRouter, DynamicRouter: the paper's v2). With memory='hidden' the memory
  holds each layer's input instead, the residual stream normed to unit RMS, and each query
  head's keys and values are projected from its own mix of layers 0..l (HiddenStaticRouter,
  HiddenDynamicRouter: the paper's v1). router='none' is the plain LLaMA model.
- Hyper-connections, the paper's other baseline, as an option (baselines/hyper_connections.py).
- generate() caches the *routed* keys/values: a cache the size of the baseline's.

Top down: the config; LIMe (routers, and the attention that fills and reads the memory); the LLaMA
parts; the GPT; checkpoints. Shapes: B batch, T time, D width, H query heads, G key/value heads, hs
head size, S source layers (l + 1 at layer l). Keys and values travel together as one tensor kv
(B, T, 2, G, hs): a router mixes both with the same weights.
"""
import math
import pickle
import sys
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

ROUTERS = ('none', 'static', 'dynamic')
MEMORIES = ('kv', 'hidden')  # what the layer memory holds: paper v2's keys/values, v1's states
ROUTER_INITS = ('noisy', 'identity')  # the static router's starting weights (StaticRouter)


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest sequence; the RoPE tables and the KV cache cover it
    vocab_size: int = 50257  # GPT-2 BPE; the embedding is padded to a multiple of 64 for speed
    n_layer: int = 12  # depth: LIMe's memory, and its cost, grow with it
    n_head: int = 12  # query heads
    n_kv_head: int = 0  # key/value heads (grouped-query attention when < n_head); 0 = n_head
    n_embd: int = 768  # width of the residual stream
    mlp_hidden: int = 0  # SwiGLU hidden width; 0 means 4 * n_embd (the paper's 2048 -> 8192)
    rope_base: float = 10000.0  # RoPE wavelength base, as in LLaMA
    router: str = 'none'  # 'none' = LLaMA; 'static' / 'dynamic' = LIMe, reading all earlier layers
    router_top_p: float = 1.0  # keep the fewest sources holding this share of routing mass; 1 = off
    router_init: str = 'noisy'  # static R's start: 'noisy' (the authors') or 'identity'
    memory: str = 'kv'  # what routers mix: 'kv' = keys/values (paper v2), 'hidden' = states (v1)
    hyper_connections: int = 0  # HC: 0 = off (one residual stream), else n streams (paper: 4)
    hc_dynamic: bool = True  # dynamic HC (per-token weights), as in the paper; False = static HC

    def __post_init__(self):
        """Every rule on these values is checked here, once, in the words of a --key=value."""
        for key in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd'):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        # RoPE's wavelengths run from 2 pi to 2 pi rope_base; below 1 they would shrink instead
        # (and by ~1e-38 its frequencies overflow float32: nan from the first step)
        if not self.rope_base >= 1:
            raise ValueError(f"rope_base must be >= 1, got {self.rope_base!r}")
        for key in ('n_kv_head', 'mlp_hidden', 'hyper_connections'):
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.router_init not in ROUTER_INITS:
            raise ValueError(f"router_init must be one of {ROUTER_INITS}, got {self.router_init!r}")
        if self.memory not in MEMORIES:
            raise ValueError(f"memory must be one of {MEMORIES}, got {self.memory!r}")
        if self.router_init != 'noisy' and (self.router != 'static' or self.memory != 'kv'):
            raise ValueError(f"router_init={self.router_init!r} is a start for the static router "
                             f"of memory='kv' only; router is {self.router!r}, memory "
                             f"{self.memory!r}")  # else silently ignored
        if self.memory == 'hidden':  # paper v1's routers: each rule says what v1 lacks
            if self.router == 'none':
                raise ValueError("memory='hidden' is what LIMe's v1 routers mix: give "
                                 "router='static' or 'dynamic' with it")
            if self.router == 'dynamic' and self.router_top_p < 1.0:
                raise ValueError("router_top_p < 1 prunes v1's static router only: the paper's "
                                 "v1 dynamic router has no top-p")
            if self.hyper_connections:
                raise ValueError("hyper_connections with memory='hidden' is not built: v1's "
                                 "memory holds one residual stream a layer")
        # With top-p on, a dynamic router starts with 90% of p on the own layer (DynamicRouter):
        # below p = 1/1.9 ~ 0.53 that one source would hold p alone, and no router would learn.
        lowest = 0.53 if self.router == 'dynamic' and self.memory == 'kv' else 0.0
        if not lowest < self.router_top_p <= 1.0:
            raise ValueError(f"router_top_p must be in ({lowest:g}, 1] for {self.router!r}, "
                             f"got {self.router_top_p!r}")
        self.n_kv_head = self.n_kv_head or self.n_head
        self.mlp_hidden = self.mlp_hidden or 4 * self.n_embd
        if self.n_embd % (2 * self.n_head) or self.n_head % self.n_kv_head:
            raise ValueError(f"n_embd ({self.n_embd}) must split into n_head ({self.n_head}) heads "
                             "of even size (RoPE rotates channel pairs), and n_head must be a "
                             f"multiple of n_kv_head ({self.n_kv_head})")

    @property
    def padded_vocab(self):
        """vocab_size rounded up to a multiple of 64, the embedding's rows: shapes GPUs like."""
        return 64 * ((self.vocab_size + 63) // 64)


# -----------------------------------------------------------------------------
# LIMe: two routers that mix the layer memory, and the attention that fills and reads it
class StaticRouter(nn.Module):
    """LIMe's static router (paper v2): layer l's keys (and, with the same weights, values) for
    kv head g are a learned, signed mix of every kv head h of every layer m in 0..l:
        kv~[..., g, :] = sum_m sum_h R[g, m, h] * kv_m[..., h, :]
    The same weights for every token: G * S * G numbers per layer."""

    def __init__(self, config, layer_idx):
        super().__init__()
        G, S = config.n_kv_head, layer_idx + 1
        self.top_p = config.router_top_p
        self.init = config.router_init
        self.weight = nn.Parameter(torch.empty(G, S * G))  # R; row g: all (layer, head) sources

    def reset_parameters(self):
        # 'noisy', the authors': the identity on the own layer's block, U(+-sqrt(3 / fan_in)) on
        # every other source (the paper: all noise did worse). 'identity': the noise zeroed, so
        # the model starts exactly as the baseline and every entry still gets its gradient. The
        # noise is drawn either way, so both starts leave the other weights of a seed the same.
        G, fan_in = self.weight.shape
        bound = math.sqrt(3.0 / fan_in)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.init == 'identity':
                self.weight.zero_()
            self.weight[:, -G:] = torch.eye(G)

    def mix_weights(self):
        """R as used, (G, S * G): outside the top-p set zeroed (signed: no renormalising)."""
        if self.top_p < 1.0:  # per output head, over all its sources
            return self.weight * top_p_mask(self.weight.abs(), self.top_p)
        return self.weight

    def forward(self, h, memory):  # memory: S tensors (B, T, 2, G, hs), layers 0..l
        # Head-major, as in the authors' code: a row per (layer, kv head) source, in R's column
        # order, so that the mix is one product R (G, S*G) @ sources (S*G, B*T*2*hs) and the cat
        # that lays them out is the only copy. (R @ torch.cat(memory, dim=3) gives the same
        # numbers, but torch folds B, T and 2 into the product's rows: a transposed copy of the
        # whole cat at every layer, kept for the backward pass.)
        sources = torch.cat([kv.movedim(3, 0) for kv in memory])  # (S*G, B, T, 2, hs)
        mixed = self.mix_weights() @ sources.flatten(1)  # (G, B*T*2*hs)
        # Back to (B, T, 2, G, hs) as a view: hs stays the last, unit-stride dim that SDPA's
        # fast kernels need.
        return mixed.unflatten(1, sources.shape[1:]).movedim(0, 3)


class DynamicRouter(nn.Module):
    """A dynamic router over paper v2's memory (this repo's design: the paper's v1 dynamic router
    is HiddenDynamicRouter): each token picks, per kv head, a softmax distribution
    over the source layers 0..l, computed from the layer's normed input h, and reads the same
    head of each source layer:
        a[t, g, :] = softmax((h_t Wr)[g, :]),    kv~[t, g] = sum_m a[t, g, m] * kv_m[t, g]"""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_kv_head = config.n_kv_head
        self.n_source = layer_idx + 1
        self.top_p = config.router_top_p
        self.proj = nn.Linear(config.n_embd, self.n_kv_head * self.n_source, bias=True)  # Wr

    def reset_parameters(self):
        # Close to the baseline: zero weights (tokens route alike until gradients pull them apart),
        # and a bias that gives the own layer a share s = 90% of p of the routing weight (not all
        # of it: one source alone gets no gradient). With l = layer_idx other sources at bias 0,
        # e^b / (e^b + l) = s at b = log(s / (1 - s) * l); at p = 1 that is log(9 l), as in v1.
        s = 0.9 * self.top_p
        with torch.no_grad():
            self.proj.weight.zero_()
            bias = self.proj.bias.view(self.n_kv_head, self.n_source)
            bias.zero_()
            bias[:, -1] = math.log(s / (1 - s) * (self.n_source - 1))

    def mix_weights(self, h):
        """Routing probabilities (B, T, G, S): for each token and head they sum to 1."""
        probs = self.proj(h).unflatten(-1, (self.n_kv_head, self.n_source)).float().softmax(dim=-1)
        if self.top_p < 1.0:
            probs = probs * top_p_mask(probs, self.top_p)
            probs = probs / probs.sum(-1, keepdim=True)  # the kept sources share all the weight
        return probs

    def forward(self, h, memory):  # memory: S tensors (B, T, 2, G, hs), layers 0..l
        probs = self.mix_weights(h).type_as(memory[0])  # (B, T, G, S)
        # A weighted sum of S tensors, pointwise: torch.compile fuses it into one kernel.
        return sum(kv * probs[:, :, None, :, m, None] for m, kv in enumerate(memory))


class CausalSelfAttention(nn.Module):
    """Grouped-query attention. In a LIMe model it appends its raw keys/values to the layer
    memory (paper v2), then attends over its router's mix of the memory instead of its own."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_size = config.n_embd // config.n_head
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_size, bias=False)
        self.kv_proj = nn.Linear(config.n_embd, 2 * self.n_kv_head * self.head_size, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_size, config.n_embd, bias=False)
        self.keeps_kv = config.memory == 'kv'  # v2: its keys/values go into the layer memory
        # Layer 0 has nothing earlier to read, so it has no router (paper Sec. 3).
        self.router = None
        if config.router != 'none' and layer_idx > 0:
            self.router = ROUTER_CLASSES[config.router, config.memory](config, layer_idx)
            if not self.keeps_kv:  # v1's router projects its own mix: no k/v projection here
                self.kv_proj = None

    def forward(self, h, rotary, memory=None, cache=None):
        B, T, _ = h.shape
        q = self.q_proj(h).view(B, T, self.n_head, self.head_size)  # (B, T, H, hs)
        if self.kv_proj is not None:
            kv = self.kv_proj(h).view(B, T, 2, self.n_kv_head, self.head_size)  # (B, T, 2, G, hs)
        if memory is not None and self.keeps_kv:
            # This layer's raw keys/values, for this and every later layer: its own entry, so
            # that a block run again (activation checkpointing) writes the same one.
            memory[self.layer_idx] = kv
        if self.router is not None:
            # (B, T, 2, G, hs): the routed mix of layers 0..l
            kv = self.router(h, memory[:self.layer_idx + 1])
        k, v = kv.unbind(dim=2)  # (B, T, G, hs) each
        # RoPE after routing: routing mixes within one position, so before or after is the same.
        pos = cache.pos if cache is not None else 0
        q, k = rotary(q, pos), rotary(k, pos)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hs)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, G, pos + T, hs): every token so far
        # A prompt (T > 1) fills an empty cache, so the causal mask lines up; one new token
        # attends to everything cached. (Without a cache is_causal stays a plain bool for compile.)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None or T > 1,
                                           enable_gqa=self.n_kv_head != self.n_head)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, D)


def top_p_mask(weights, p):
    """1.0 for the smallest set of entries along the last dim that holds at least a share p of
    the total (non-negative) weight, 0.0 elsewhere (paper v1's pruning of routing weights).
    Among equal weights the lower index ranks first; a row of zeros keeps every entry."""
    if p >= 1.0:
        return torch.ones_like(weights)  # keep all (the cumsum below could round just past 1)
    weights = weights.detach()  # the mask only selects: gradients flow through the kept weights
    share = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    sorted_share, order = share.sort(dim=-1, descending=True, stable=True)  # ties: lower index
    mass_before = sorted_share.cumsum(-1) - sorted_share  # the mass ranked above each entry
    keep = (mass_before < p).to(weights.dtype)  # keep entries until the kept mass reaches p
    return torch.zeros_like(keep).scatter(-1, order, keep)


# Paper v1: the memory holds hidden states, the input of every layer so far (the token embeddings,
# then each layer's output: the residual stream), each scaled to unit RMS once, as it enters.
# Layer l norms them with an RMSNorm of its own, and kv head g mixes them into a D-vector m_g of
# its own; its keys and values are projections of that mix, m_g W_g, with W_g (D, 2 hs) in place
# of the layer's k/v projection. The norm's gain is the same for every source: it follows the mix.
# (The authors' v1 code mixes per query head; with n_kv_head = n_head, as v1 ran, that is this.)
class HiddenStaticRouter(nn.Module):
    """LIMe's static router of paper v1: for kv head g, a softmax over the S sources of learned
    logits w[g], the same for every token:
        m_g = sum_m softmax(w[g])_m RMSNorm(x_m),    kv~_g = m_g W_g
    where sum_m a_m RMSNorm(x_m) = gain * sum_m a_m x_m / rms(x_m), as computed (gain: norm.weight).
    G * S logits per layer, beside the norm and the projections that replace the layer's own."""

    def __init__(self, config, layer_idx):
        super().__init__()
        G, S, D = config.n_kv_head, layer_idx + 1, config.n_embd
        self.top_p = config.router_top_p
        self.norm = nn.RMSNorm(D, eps=1e-5)
        self.weight = nn.Parameter(torch.empty(G, S))  # the logits w
        self.kv_weight = nn.Parameter(torch.empty(G, D, 2 * (D // config.n_head)))  # W_g: k, v

    def reset_parameters(self):
        # The authors' draws: logits N(0, 0.1^2), so that the first steps read a near-uniform
        # mean of every layer; W as kaiming_uniform_(a=sqrt(5)) draws a (1, G, D, hs) tensor,
        # U(+-1 / sqrt(G * D * hs)) (for their G = H, std 1 / (sqrt(3) D): far below a k_proj's).
        G, D, two_hs = self.kv_weight.shape
        bound = 1 / math.sqrt(G * D * two_hs // 2)
        with torch.no_grad():
            self.weight.normal_(std=0.1)
            self.kv_weight.uniform_(-bound, bound)

    def mix_weights(self):
        """The softmax weights as used, (G, S); top-p keeps the largest, renormalised."""
        probs = self.weight.softmax(dim=-1)
        if self.top_p < 1.0:
            probs = probs * top_p_mask(probs, self.top_p)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def forward(self, h, memory):  # memory: S unit-RMS hidden states (B, T, D), layers 0..l
        sources = torch.stack(memory)  # (S, B, T, D)
        S, B, T, D = sources.shape
        mixed = self.mix_weights().type_as(sources) @ sources.view(S, B * T * D)  # (G, B*T*D)
        return project_heads(mixed.view(-1, B * T, D), self.kv_weight, B, T, self.norm.weight)


class HiddenDynamicRouter(nn.Module):
    """LIMe's dynamic router of paper v1: each token computes, per kv head g, a softmax over the
    S sources from its own state (this layer's input, as this router's norm gives it):
        a[t, g, :] = softmax((RMSNorm(x_l)[t] Wr)[g, :])
        m[t, g] = sum_m a[t, g, m] RMSNorm(x_m)[t],    kv~[t, g] = m[t, g] W_g
    with RMSNorm(x_m) = gain * x_m / rms(x_m): the gain (norm.weight) is applied after the mix.
    D * G * S routing weights per layer, beside the norm and the projections."""

    def __init__(self, config, layer_idx):
        super().__init__()
        G, S, D = config.n_kv_head, layer_idx + 1, config.n_embd
        self.n_kv_head, self.n_source = G, S
        self.norm = nn.RMSNorm(D, eps=1e-5)
        self.proj = nn.Linear(D, G * S, bias=False)  # Wr, read head-major: (G, S)
        self.kv_weight = nn.Parameter(torch.empty(G, D, 2 * (D // config.n_head)))  # W_g: k, v

    def reset_parameters(self):
        # The authors' draws: Wr N(0, 0.02^2) (near-uniform routing at first); W as in
        # HiddenStaticRouter.
        G, D, two_hs = self.kv_weight.shape
        bound = 1 / math.sqrt(G * D * two_hs // 2)
        with torch.no_grad():
            self.proj.weight.normal_(std=0.02)
            self.kv_weight.uniform_(-bound, bound)

    def mix_weights(self, x):
        """Routing probabilities (B, T, G, S) from the normed current state x (B, T, D)."""
        return self.proj(x).unflatten(-1, (self.n_kv_head, self.n_source)).float().softmax(-1)

    def forward(self, h, memory):  # memory: S unit-RMS hidden states (B, T, D), layers 0..l
        sources = torch.stack(memory, dim=2)  # (B, T, S, D)
        B, T, S, D = sources.shape
        probs = self.mix_weights(self.norm.weight * memory[-1]).type_as(sources)  # (B, T, G, S)
        mixed = (probs @ sources).flatten(0, 1).transpose(0, 1)  # (G, B*T, D): a product per token
        return project_heads(mixed, self.kv_weight, B, T, self.norm.weight)


def project_heads(mixed, kv_weight, B, T, gain):
    """Each kv head's keys and values from its own mix times the gain: (mixed (G, B*T, D) * gain)
    @ kv_weight (G, D, 2 hs) = mixed @ (gain on kv_weight's rows): the smaller tensor is scaled.
    -> (B, T, 2, G, hs), the layout of a layer's own kv."""
    kv = torch.bmm(mixed, gain[:, None] * kv_weight)  # (G, B*T, 2 hs)
    return kv.view(kv.size(0), B, T, 2, -1).movedim(0, 3)


# (router, memory) -> the router class: v2 mixes keys and values, v1 hidden states
ROUTER_CLASSES = {('static', 'kv'): StaticRouter, ('dynamic', 'kv'): DynamicRouter,
                  ('static', 'hidden'): HiddenStaticRouter,
                  ('dynamic', 'hidden'): HiddenDynamicRouter}


# -----------------------------------------------------------------------------
# The LLaMA parts: rotary embedding, MLP, the block, the KV cache.
# LLaMA's norm is torch's nn.RMSNorm: each vector scaled to unit root-mean-square, then by a gain.
class Rotary(nn.Module):
    """Rotary position embedding: rotate channel pairs of q and k by angles that grow with the
    position, so that q . k depends only on the distance between the two tokens. Channel i of the
    first half and channel i of the second half make a pair, rotated by angle pos * inv_freq[i]."""

    def __init__(self, head_size, max_len, base):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (T, hs/2)
        # (T, 1, hs/2): the 1 broadcasts over the heads of x (B, T, heads, hs)
        self.register_buffer('cos', angles.cos()[:, None, :], persistent=False)
        self.register_buffer('sin', angles.sin()[:, None, :], persistent=False)

    def forward(self, x, pos=0):  # x: (B, T, heads, hs), its first token at position pos
        cos = self.cos[pos:pos + x.size(1)]
        sin = self.sin[pos:pos + x.size(1)]
        x1, x2 = x.float().chunk(2, dim=-1)  # the two halves, (B, T, heads, hs/2) each
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return rotated.type_as(x)


class MLP(nn.Module):
    """SwiGLU (LLaMA): silu(x W_gate) * (x W_up), projected back; W_gate and W_up in one matmul."""

    def __init__(self, config):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.n_embd, 2 * config.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (B, T, mlp_hidden) each
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp_norm = nn.RMSNorm(config.n_embd, eps=1e-5)
        self.mlp = MLP(config)
        self.hc_attn = None
        self.hc_mlp = None
        if config.hyper_connections:  # then x is n streams (B, T, n, D), mixed instead of added
            from baselines.hyper_connections import HyperConnection  # only this baseline uses it
            self.hc_attn = HyperConnection(config, 2 * layer_idx)
            self.hc_mlp = HyperConnection(config, 2 * layer_idx + 1)

    def forward(self, x, rotary, memory=None, cache=None):
        if self.hc_attn is None:
            x = x + self.attn(self.attn_norm(x), rotary, memory, cache)
            return x + self.mlp(self.mlp_norm(x))
        x = self.hc_attn(x, lambda h: self.attn(self.attn_norm(h), rotary, memory, cache))
        return self.hc_mlp(x, lambda h: self.mlp(self.mlp_norm(h)))


class KVCache:
    """Keys and values of past tokens for generation, after routing and RoPE, per layer. Routing
    mixes layers at one position only, so a past token's routed keys/values never change: a LIMe
    model caches exactly what a plain transformer does, at the same size."""

    def __init__(self, n_layer, max_len):
        self.n_layer = n_layer
        self.max_len = max_len
        # (n_layer, B, G, max_len, hs) each, allocated at the first update (B, G, hs known then)
        self.k = None
        self.v = None
        self.pos = 0  # number of tokens cached

    def update(self, layer, k, v):  # k, v: (B, G, T, hs) for the tokens at pos .. pos + T - 1
        if self.k is None:
            B, G, _, hs = k.shape
            self.k = k.new_zeros(self.n_layer, B, G, self.max_len, hs)
            self.v = torch.zeros_like(self.k)
        end = self.pos + k.size(2)
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class GPT(nn.Module):
    """The whole model: token embedding, n_layer blocks, final norm, and the output head tied to
    the embedding. Its forward pass makes the layer memory that the attention layers share."""

    # Activation checkpointing (train.py's checkpoint_blocks): keep each block's input only, and
    # recompute the rest in the backward pass: less memory for more compute (docs/performance.md).
    checkpoint_blocks = False

    def __init__(self, config):
        super().__init__()
        self.config = config
        padded_vocab = config.padded_vocab  # the ids past vocab_size are never predicted
        self.embed = nn.Embedding(padded_vocab, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, l) for l in range(config.n_layer))
        self.final_norm = nn.RMSNorm(config.n_embd, eps=1e-5)
        self.lm_head = nn.Linear(config.n_embd, padded_vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied input/output embeddings
        self.rotary = Rotary(config.n_embd // config.n_head, config.block_size, config.rope_base)
        # -inf for the padded ids: added to the logits, it gives them probability 0 exactly, and
        # the loss needs no slice of the logits (a slice's copy and backward cost ~15% on a CPU).
        pad = torch.zeros(padded_vocab)
        pad[config.vocab_size:] = float('-inf')
        self.register_buffer('pad_bias', pad, persistent=False)
        self.init_weights()

    def routers(self):
        return [b.attn.router for b in self.blocks if b.attn.router is not None]

    def hyper_connections(self):
        return [c for b in self.blocks for c in (b.hc_attn, b.hc_mlp) if c is not None]

    def init_weights(self):
        """All initialisation in one place: GPT-2's normal(0, 0.02), with the projections that
        add into the residual stream scaled by 1/sqrt(2 n_layer) so its variance does not grow
        with depth; norms start at 1; routers and HC as in their papers (reset_parameters)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.blocks:
            for proj in (block.attn.o_proj, block.mlp.down_proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.config.n_layer))
        for module in self.routers() + self.hyper_connections():
            module.reset_parameters()

    def layer_memory(self):
        """LIMe's layer memory for one forward pass: entry l is layer l's raw keys/values, set by
        its attention (v1: layer l's input, set below), read by every later layer's router. A
        list holds references, not copies."""
        return [None] * self.config.n_layer

    def forward(self, idx, targets=None, cache=None):
        """idx: (B, T) token ids. Returns logits (B, T, vocab_size) and, given targets (B, T),
        the mean cross-entropy (targets of -1 are ignored). With a cache, idx continues it."""
        cfg = self.config
        T = idx.size(1)
        pos = cache.pos if cache is not None else 0  # tokens already cached
        if pos + T > cfg.block_size:
            raise ValueError(f"a sequence of more than block_size {cfg.block_size} tokens")
        if pos and T > 1:  # the causal mask below would not line up with the cached tokens
            raise ValueError("a cache that holds tokens takes one new token at a time")
        x = self.embed(idx)  # (B, T, D)
        if cfg.hyper_connections:
            x = x.unsqueeze(2).expand(-1, -1, cfg.hyper_connections, -1)  # (B, T, n, D): copies
        memory = self.layer_memory() if cfg.router != 'none' else None
        for l, block in enumerate(self.blocks):
            if memory is not None and cfg.memory == 'hidden':
                # paper v1: layer l's input (h_0: embeddings) at unit RMS, with the routers' eps
                memory[l] = F.rms_norm(x, (cfg.n_embd,), eps=1e-5)
            if self.checkpoint_blocks and torch.is_grad_enabled():
                # Only the block's input is kept; the backward pass runs the block again for the
                # rest (its attention sets the same memory entry again).
                x = torch.utils.checkpoint.checkpoint(block, x, self.rotary, memory, cache,
                                                      use_reentrant=False)
            else:
                x = block(x, self.rotary, memory, cache)
        if cache is not None:
            cache.pos += T
        if cfg.hyper_connections:
            x = x.mean(dim=2)  # (B, T, D): n streams back to one (baselines/hyper_connections.py)
        logits = F.linear(self.final_norm(x), self.lm_head.weight, self.pad_bias)  # (B, T, V_pad)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                   ignore_index=-1)
        return logits[..., :cfg.vocab_size], loss  # a view: the padded ids are never predicted

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Continue idx (B, T) by max_new_tokens tokens, one at a time, with a KV cache.
        temperature 0 (or top_k 1) is greedy. When the cache is full (block_size tokens), it is
        rebuilt from the latest block_size // 2 tokens, so generation can go on for ever."""
        block_size = self.config.block_size
        cache = KVCache(self.config.n_layer, block_size)
        pending = idx[:, -block_size:]  # tokens not in the cache yet
        for _ in range(max_new_tokens):
            if cache.pos + pending.size(1) > block_size:
                cache.pos = 0
                pending = idx[:, -max(1, block_size // 2):]
            logits, _ = self(pending, cache=cache)
            logits = logits[:, -1, :].float()  # (B, vocab_size)
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float('-inf'))
                next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, next_id), dim=1)
            pending = next_id
        return idx

    # For training: optimizer groups, FLOPs and MFU -----------------------------------------------
    def configure_optimizers(self, weight_decay, learning_rate, router_lr, betas=(0.9, 0.95),
                             eps=1e-8, fused=False):
        """AdamW with the paper's groups: matrices decay, vectors (norm gains, biases) do not;
        router parameters train at router_lr (paper: 10x), and the static router's R is not
        decayed (decay would pull it from its identity init toward reading nothing); nor are
        HC's static A and B (its authors' choice, for the same reason)."""
        routers = self.routers()
        # v1's routers also hold the layer's K/V projections and a norm: those train as the
        # model's own weights do (the authors' groups)
        own = {p for r in routers if hasattr(r, 'kv_weight') for p in (r.kv_weight, r.norm.weight)}
        router_params = {p for r in routers for p in r.parameters()} - own
        no_decay = {r.weight for r in routers if isinstance(r, (StaticRouter, HiddenStaticRouter))}
        no_decay |= {p for c in self.hyper_connections() for p in (c.static_alpha, c.static_beta)}
        # Groups by role, not by value, so a checkpoint's optimizer state fits any learning rate.
        groups = {(role, decay): [] for role in ('main', 'router') for decay in (True, False)}
        for p in self.parameters():
            decay = p.dim() >= 2 and p not in no_decay
            groups['router' if p in router_params else 'main', decay].append(p)
        param_groups = [{'params': params, 'lr': router_lr if role == 'router' else learning_rate,
                         'weight_decay': weight_decay if decay else 0.0}
                        for (role, decay), params in groups.items() if params]
        return torch.optim.AdamW(param_groups, lr=learning_rate, betas=betas, eps=eps, fused=fused)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # the tied embedding counts once

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token, PaLM-style: forward + backward = 3x forward; 2 per mul-add."""
        cfg = self.config
        hs = cfg.n_embd // cfg.n_head
        static = sum(r.weight.numel() for r in self.routers() if isinstance(r, StaticRouter))
        v1_logits = sum(r.weight.numel() for r in self.routers()
                        if isinstance(r, HiddenStaticRouter))
        hc_weights = sum(p.numel() for hc in self.hyper_connections() for p in hc.parameters())
        matmuls = 6 * (self.num_params() - static - v1_logits - hc_weights)  # lm_head: tied
        attention = 6 * 2 * cfg.n_layer * cfg.n_head * hs * (seq_len or cfg.block_size)  # qk, av
        # Static: one multiply-add per weight R[g, m, h] and channel of k and v (2 hs). Dynamic:
        # one per (head, source layer, channel of k and v).
        dynamic = sum(r.n_kv_head * r.n_source for r in self.routers()
                      if isinstance(r, DynamicRouter))
        # v1: one multiply-add per (kv head, source layer, channel of the D-wide state).
        v1 = sum(r.kv_weight.size(0) * (r.weight.size(1) if isinstance(r, HiddenStaticRouter)
                                        else r.n_source)
                 for r in self.routers() if hasattr(r, 'kv_weight'))
        hc = sum(c.flops_per_token() for c in self.hyper_connections())
        return matmuls + attention + 6 * 2 * hs * (static + dynamic) + 6 * cfg.n_embd * v1 + hc

    def estimate_mfu(self, tokens_per_second, peak_flops=989e12, seq_len=None):
        """Training FLOP/s over the device's peak (default: H100 SXM bf16 dense)."""
        return self.flops_per_token(seq_len) * tokens_per_second / peak_flops


# -----------------------------------------------------------------------------
# Checkpoints, written and read here only: a dict of the weights ('model') and the GPTConfig
# ('model_args'), beside what train.py keeps to resume ('optimizer', 'step', ...).
def save_checkpoint(f, model, **state):
    """Save model's weights and config, and state, to f: a path, or a file open for writing."""
    torch.save(dict(state, model=model.state_dict(), model_args=asdict(model.config)), f)


def load_checkpoint(path, device):
    """(the model, in eval mode on device; the checkpoint dict) from path, or a ValueError in one
    line saying why not: no file, not a checkpoint, or a model this lime.py does not build."""
    try:
        # Tensors and plain values only: a pickle may hold code that loading would run.
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"no checkpoint at {path} (train.py writes one to its out_dir)") from None
    except pickle.UnpicklingError:
        raise ValueError(f"{path} holds more than tensors and plain values, as train.py's "
                         "checkpoints do: refused unread (loading it could run code)") from None
    except Exception as e:  # unreadable, cut short, not a torch file
        raise ValueError(f"could not read checkpoint {path}: {last_line(e)}") from None
    try:
        model = GPT(GPTConfig(**checkpoint['model_args']))
        model.load_state_dict(checkpoint['model'])
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path}: its model does not load into this lime.py: "
                         f"{last_line(e)}") from None
    return model.to(device).eval(), checkpoint


def load_model(path, device):
    """load_checkpoint, saying what it loaded: for the tools that use a trained model."""
    model, checkpoint = load_checkpoint(path, device)
    print(f"loaded {path}: step {checkpoint.get('step')}, router={model.config.router}",
          file=sys.stderr)
    return model, checkpoint


def last_line(error):
    """The last line of torch's long messages: the most specific (it names a missing weight)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
