"""
lime.py: a LLaMA-style GPT with Layer-Integrated Memory (LIMe, arXiv 2502.09245), in one file.

What differs from a plain GPT (nanoGPT's model.py):
- LLaMA blocks: RMSNorm before attention and MLP, rotary position embeddings (RoPE), a SwiGLU MLP,
  no biases, grouped-query attention (n_kv_head key/value heads shared by n_head query heads),
  input and output embeddings tied, vocabulary padded to a multiple of 64.
- LIMe: every layer puts its raw (pre-RoPE) keys and values into a "layer memory". With
  router='static' or 'dynamic', layer l >= 1 attends over a learned mix of the keys/values of
  layers 0..l (StaticRouter, DynamicRouter) instead of its own alone. router='none' is the
  plain LLaMA model, with no extra parameter and no extra work.
- Hyper-connections (HC, arXiv 2409.19606), the paper's other baseline, as an option
  (hyper_connections=n): the residual stream becomes n streams that every sub-layer reads a mix of
  and writes back into (HyperConnection). It combines with any router.
- generate() keeps a KV cache of the *routed* keys/values: the same size as the baseline's.

The file reads top down: the config; LIMe (the layer memory, the two routers, and the attention
that appends to the memory and reads the routed mix); the LLaMA parts; the GPT that ties them
together; checkpoints, whose format is written and read here only.

Shapes: B batch, T time, D width (n_embd), H query heads, G key/value heads, hs head size,
S source layers a router reads (l + 1 at layer l). Keys and values travel together as one
tensor kv of shape (B, T, 2, G, hs), because a router mixes both with the same weights.

    python -c "import lime; lime.GPT(lime.GPTConfig(router='static'))"
"""
import importlib.util
import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

ROUTERS = ('none', 'static', 'dynamic')
HAVE_TRITON = importlib.util.find_spec('triton') is not None  # for fused.py's kernels; optional


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest sequence the model sees; the RoPE tables and KV cache cover it
    vocab_size: int = 50257  # GPT-2 BPE; the embedding is padded up to a multiple of 64 for speed
    n_layer: int = 12  # depth: LIMe's memory and its cost grow with it
    n_head: int = 12  # query heads
    n_kv_head: int = 0  # key/value heads (grouped-query attention when < n_head); 0 means n_head
    n_embd: int = 768  # width of the residual stream
    mlp_hidden: int = 0  # SwiGLU hidden width; 0 means 4 * n_embd (the paper's 2048 -> 8192)
    rope_base: float = 10000.0  # RoPE wavelength base, as in LLaMA
    router: str = 'none'  # 'none' = LLaMA; 'static' / 'dynamic' = LIMe routers over all earlier layers
    router_top_p: float = 1.0  # keep the smallest set of sources holding this much routing mass; 1 = off
    # How the routers compute their mix, not part of the model (checkpoints load either way):
    # None = fused Triton kernels (fused.py) where they run natively, on CUDA with triton installed;
    # True = always (on a CPU, through Triton's interpreter: slow, for tests); False = plain PyTorch.
    fused: Optional[bool] = None
    # Hyper-connections (the paper's other baseline): 0 = off (a plain residual stream), else the
    # rate n, the number of residual streams (the paper's 4). Dynamic (per-token) by default.
    hyper_connections: int = 0
    hc_dynamic: bool = True  # False = static HC: the mixing weights are the same for every token

    def __post_init__(self):
        self.n_kv_head = self.n_kv_head or self.n_head
        self.mlp_hidden = self.mlp_hidden or 4 * self.n_embd
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(f"n_embd ({self.n_embd}) must split into n_head ({self.n_head}) heads "
                             "of even size (RoPE rotates pairs of channels)")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.hyper_connections < 0:
            raise ValueError("hyper_connections must be 0 (off) or the number of residual streams, "
                             f"got {self.hyper_connections}")
        if self.fused is True and not HAVE_TRITON:
            raise ValueError("fused=True needs triton (pip install triton), or use fused=None / False")
        if not 0.0 < self.router_top_p <= 1.0:
            raise ValueError(f"router_top_p must be in (0, 1], got {self.router_top_p}")
        for name in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd'):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


# -----------------------------------------------------------------------------
# LIMe: the layer memory, the routers that mix it, and the attention that fills and reads it


class LayerMemory(list):
    """LIMe's layer memory for one forward pass (GPT.forward makes it): the raw keys/values
    (B, T, 2, G, hs) of every layer so far, in order. fused.py keeps their gradients' buffer in grad."""

    def __init__(self, n_layer):
        super().__init__()
        self.n_layer = n_layer
        self.grad = None


class StaticRouter(nn.Module):
    """LIMe's static router (paper v2): layer l's keys (and, with the same weights, values) for
    kv head g are a learned signed mix of every kv head of every layer 0..l:
        kv~[..., g, :] = sum_m sum_h R[g, m, h] * kv_m[..., h, :]
    The same for every token: G * S * G weights per layer, nothing computed per token but the mix."""

    def __init__(self, config, layer_idx):
        super().__init__()
        G, S = config.n_kv_head, layer_idx + 1
        self.top_p, self.fused = config.router_top_p, config.fused
        self.weight = nn.Parameter(torch.empty(G, S * G))  # R, row g: all (source layer, head) pairs

    def reset_parameters(self):  # the paper's: identity on its own heads, kaiming-uniform elsewhere
        # (so it starts as its own keys/values plus noise; an all-random init was reported worse)
        G, fan_in = self.weight.shape
        bound = math.sqrt(3.0 / fan_in)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            self.weight[:, -G:] = torch.eye(G)

    def mix_weights(self):
        """R as used: (G, S * G), entries outside the top-p set zeroed (signed weights: no renormalising)."""
        R = self.weight
        if self.top_p < 1.0:
            R = R * top_p_mask(R.abs(), self.top_p)  # per output head, over all (layer, head) sources
        return R

    def forward(self, h, memory):  # memory: S tensors (B, T, 2, G, hs), layers 0..l
        if kernels := fused_kernels(self.fused, memory[0]):
            return kernels.static_mix(self.mix_weights(), memory)  # the same mix, in Triton kernels
        # All S*G (layer, head) sources side by side, in R's column order, then one matmul: the copy
        # costs memory, but is ~2x faster on a CPU than a small einsum per layer at 32 layers.
        kv = torch.cat(list(memory), dim=3)  # (B, T, 2, S*G, hs); list(): torch.compile wants a plain list
        return self.mix_weights() @ kv  # (B, T, 2, G, hs)


class DynamicRouter(nn.Module):
    """LIMe's dynamic router (paper v1): each token picks, per kv head, a softmax distribution over
    the source layers 0..l from the layer's normed input h, and reads the same head of each:
        a[t, g, :] = softmax((h_t Wr)[g, :]),   kv~[t, g] = sum_m a[t, g, m] * kv_m[t, g]"""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_kv_head, self.n_source = config.n_kv_head, layer_idx + 1
        self.top_p, self.fused = config.router_top_p, config.fused
        self.proj = nn.Linear(config.n_embd, self.n_kv_head * self.n_source, bias=True)

    def reset_parameters(self):
        # Close to the baseline: zero weights (all tokens route alike until the gradients pull them
        # apart) and a bias giving its own layer 90%: e^b / (e^b + l) = 0.9 for b = log(9 l).
        with torch.no_grad():
            self.proj.weight.zero_()
            bias = self.proj.bias.view(self.n_kv_head, self.n_source)
            bias.zero_()
            bias[:, -1] = math.log(9.0 * (self.n_source - 1))

    def mix_weights(self, h):
        """Routing probabilities (B, T, G, S): each token and head sums to 1 over source layers."""
        B, T, _ = h.shape
        probs = self.proj(h).view(B, T, self.n_kv_head, self.n_source).float().softmax(dim=-1)
        if self.top_p < 1.0:
            probs = probs * top_p_mask(probs, self.top_p)
            probs = probs / probs.sum(-1, keepdim=True)  # the kept sources share all the weight
        return probs

    def forward(self, h, memory):  # memory: S tensors (B, T, 2, G, hs), layers 0..l
        if kernels := fused_kernels(self.fused, memory[0]):
            return kernels.dynamic_mix(self.mix_weights(h), memory)  # the same mix, in Triton kernels
        probs = self.mix_weights(h).type_as(memory[0])  # (B, T, G, S)
        # A weighted sum of the S tensors, pointwise, which torch.compile can fuse into one kernel.
        return sum(kv * probs[:, :, None, :, m, None] for m, kv in enumerate(memory))


class CausalSelfAttention(nn.Module):
    """Grouped-query attention that, in a LIMe model, appends its keys/values to the memory and
    attends over its router's mix of the memory instead."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_size = config.n_embd // config.n_head
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_size, bias=False)
        self.kv_proj = nn.Linear(config.n_embd, 2 * self.n_kv_head * self.head_size, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_size, config.n_embd, bias=False)
        # LIMe: layer 0 has nothing earlier to read, so it has no router (paper Sec. 3).
        router_class = {'static': StaticRouter, 'dynamic': DynamicRouter}.get(config.router)
        self.router = router_class(config, layer_idx) if router_class and layer_idx > 0 else None

    def forward(self, h, rotary, memory=None, cache=None):
        B, T, _ = h.shape
        q = self.q_proj(h).view(B, T, self.n_head, self.head_size)  # (B, T, H, hs)
        kv = self.kv_proj(h).view(B, T, 2, self.n_kv_head, self.head_size)  # (B, T, 2, G, hs)
        if memory is not None:
            memory.append(kv)  # the raw keys/values of this layer, for this and all later layers
        if self.router is not None:
            kv = self.router(h, memory)  # (B, T, 2, G, hs): the routed mix of layers 0..l
        k, v = kv.unbind(dim=2)  # (B, T, G, hs) each
        # RoPE after routing: routing mixes within one position, so before or after is the same.
        pos = cache.pos if cache is not None else 0
        q, k = rotary(q, pos), rotary(k, pos)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hs)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, G, pos + T, hs): all tokens so far
        # A prompt (T > 1) fills an empty cache, so causal masking lines up; a single new token attends
        # to everything cached. (Without a cache, is_causal stays a plain bool under torch.compile.)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None or T > 1,
                                           enable_gqa=self.n_kv_head != self.n_head)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, D)


# The routers' two options: pruning (top-p) and the fused kernels (fused.py)


def top_p_mask(weights, p):
    """1.0 for the smallest set of entries along the last dim holding at least a share p of the
    total (non-negative) weight, 0.0 elsewhere (paper v1's pruning of routing weights)."""
    if p >= 1.0:
        return torch.ones_like(weights)  # keep all (the cumsum below could round just past 1)
    weights = weights.detach()  # the mask is a selection: gradients flow through the kept weights
    share = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    sorted_share, order = share.sort(dim=-1, descending=True)
    mass_before = sorted_share.cumsum(-1) - sorted_share  # mass of the entries ranked above each one
    keep = (mass_before < p).to(weights.dtype)  # keep entries until the kept mass reaches p
    return torch.zeros_like(keep).scatter(-1, order, keep)


def fused_kernels(fused, x):
    """fused.py, when GPTConfig.fused (here fused) asks for its Triton kernels for a mix of tensors
    like x; None for lime.py's plain PyTorch mix, which is the definition (the kernels compute the
    same numbers, faster)."""
    if fused is True or (fused is None and x.is_cuda and HAVE_TRITON):
        import fused as kernels  # loaded by GPT.__init__ already: this only names it
        return kernels
    return None


# -----------------------------------------------------------------------------
# The LLaMA parts: norm, rotary embedding, MLP, (optional) hyper-connections, the block; the KV cache


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned gain (LLaMA's norm)."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


class Rotary(nn.Module):
    """Rotary position embedding: rotate channel pairs of q and k by position-dependent angles,
    so that q . k depends only on the distance between the two tokens."""

    def __init__(self, head_size, max_len, base):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (max_len, hs/2)
        # Not saved in checkpoints: they are a function of the config.
        self.register_buffer('cos', angles.cos()[:, None, :], persistent=False)  # (max_len, 1, hs/2)
        self.register_buffer('sin', angles.sin()[:, None, :], persistent=False)

    def forward(self, x, pos=0):  # x: (B, T, heads, hs), its first token at position pos
        T = x.size(1)
        cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]  # (T, 1, hs/2)
        x1, x2 = x.float().chunk(2, dim=-1)  # (B, T, heads, hs/2) each
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class MLP(nn.Module):
    """SwiGLU (LLaMA): silu(x W_gate) * (x W_up), projected back; W_gate and W_up in one matmul."""

    def __init__(self, config):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.n_embd, 2 * config.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (B, T, mlp_hidden) each
        return self.down_proj(F.silu(gate) * up)


class HyperConnection(nn.Module):
    """Hyper-connections (Zhu et al. 2024, arXiv 2409.19606, Sec. 2) around one sub-layer T
    (attention or MLP). The residual stream is n streams H (B, T, n, D); the sub-layer reads one
    mix of them, and its output is spread over the streams while they also mix among themselves:
        h = A_m^T H,    H' = B^T T(h) + A_r^T H
    with A_m (n,), A_r (n, n), B (n,) learned: static HC. Dynamic HC (the default, as in the LIMe
    authors' code) adds a per-token correction read from each stream's normed vector:
        A_m(H) = A_m + s_a tanh(norm(H) W_m),  A_r(H) = A_r + s_a tanh(norm(H) W_r),
        B(H) = B + s_b tanh(norm(H) W_b)^T,    W = [W_m | W_r | W_b]: (D, n + 2)
    Init: A_m = e_(k mod n) for sub-layer k, A_r = I, B = 1, W = 0, s_a = s_b = 0.01. Then every
    stream holds the baseline's residual x + T(x) exactly, and the model is the baseline."""

    def __init__(self, config, index):  # index k: the sub-layer's place, 2 per block (attn, mlp)
        super().__init__()
        n = self.rate = config.hyper_connections
        self.index = index
        self.static_alpha = nn.Parameter(torch.empty(n, n + 1))  # [A_m | A_r], row i: stream i
        self.static_beta = nn.Parameter(torch.empty(n))  # B
        self.proj = nn.Linear(config.n_embd, n + 2, bias=False) if config.hc_dynamic else None  # W
        if config.hc_dynamic:
            self.alpha_scale = nn.Parameter(torch.empty(()))  # s_a
            self.beta_scale = nn.Parameter(torch.empty(()))  # s_b

    def reset_parameters(self):
        n = self.rate
        with torch.no_grad():
            self.static_alpha.zero_()
            self.static_alpha[self.index % n, 0] = 1.0  # sub-layer k reads stream k mod n
            self.static_alpha[:, 1:] = torch.eye(n)  # carry every stream on unchanged
            self.static_beta.fill_(1.0)  # add the output to every stream
            if self.proj is not None:
                self.proj.weight.zero_()
                self.alpha_scale.fill_(0.01)
                self.beta_scale.fill_(0.01)

    def forward(self, H, branch):  # H: (B, T, n, D); branch: the sub-layer, (B, T, D) -> (B, T, D)
        alpha, beta = self.static_alpha, self.static_beta  # (n, n + 1), (n,)
        if self.proj is not None:
            dyn = torch.tanh(self.proj(F.rms_norm(H, (H.size(-1),), eps=1e-5)))  # (B, T, n, n + 2)
            alpha = alpha + self.alpha_scale * dyn[..., :-1]  # (B, T, n, n + 1)
            beta = beta + self.beta_scale * dyn[..., -1]  # (B, T, n)
        mixed = alpha.transpose(-1, -2) @ H  # (..., n + 1, D): A_m^T H, then A_r^T H, in one matmul
        return mixed[..., 1:, :] + beta[..., None] * branch(mixed[..., 0, :])[..., None, :]


class Block(nn.Module):

    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.n_embd)
        self.mlp = MLP(config)
        # With hyper-connections, x is n streams (B, T, n, D) and these replace the two residual adds.
        hc = config.hyper_connections
        self.hc_attn = HyperConnection(config, 2 * layer_idx) if hc else None
        self.hc_mlp = HyperConnection(config, 2 * layer_idx + 1) if hc else None

    def forward(self, x, rotary, memory=None, cache=None):
        if self.hc_attn is None:
            x = x + self.attn(self.attn_norm(x), rotary, memory, cache)
            return x + self.mlp(self.mlp_norm(x))
        x = self.hc_attn(x, lambda h: self.attn(self.attn_norm(h), rotary, memory, cache))
        return self.hc_mlp(x, lambda h: self.mlp(self.mlp_norm(h)))


class KVCache:
    """Keys and values of past tokens for generation, after routing and RoPE, per layer. Routing
    mixes layers at the same position only, so a past token's routed keys/values never change:
    a LIMe model caches exactly what a plain transformer does, at the same size."""

    def __init__(self, n_layer, max_len):
        self.n_layer, self.max_len = n_layer, max_len
        self.k = self.v = None  # (n_layer, B, G, max_len, hs), allocated at the first update
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
    """The whole model: token embedding, n_layer blocks, final norm, and the output head tied to the
    embedding. Its forward pass makes the layer memory that the blocks' attention fills and reads."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        padded_vocab = 64 * math.ceil(config.vocab_size / 64)  # matmul shapes GPUs like
        self.embed = nn.Embedding(padded_vocab, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, l) for l in range(config.n_layer))
        self.final_norm = RMSNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, padded_vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied input/output embeddings
        self.rotary = Rotary(config.n_embd // config.n_head, config.block_size, config.rope_base)
        self.init_weights()
        if config.router != 'none' and (config.fused or config.fused is None and HAVE_TRITON
                                        and torch.cuda.is_available()):
            import fused  # noqa: F401  loads triton now, not inside a forward that torch.compile traces

    def routers(self):
        return [block.attn.router for block in self.blocks if block.attn.router is not None]

    def hyper_connections(self):
        return [hc for block in self.blocks for hc in (block.hc_attn, block.hc_mlp) if hc is not None]

    def init_weights(self):
        """All initialisation in one place: GPT-2's normal(0, 0.02), with the projections that add
        into the residual stream scaled by 1/sqrt(2 n_layer) so its variance does not grow with
        depth; norms start at 1; routers and hyper-connections start as in their papers (see their
        reset_parameters)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.blocks:
            for proj in (block.attn.o_proj, block.mlp.down_proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
        for module in self.routers() + self.hyper_connections():
            module.reset_parameters()

    def forward(self, idx, targets=None, cache=None):
        """idx: (B, T) token ids. Returns logits (B, T, vocab_size) and, given targets (B, T),
        the mean cross-entropy (targets of -1 are ignored). With a cache, idx continues it."""
        T = idx.size(1)
        start = cache.pos if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens > block_size {self.config.block_size}")
        x = self.embed(idx)  # (B, T, D)
        n = self.config.hyper_connections
        if n:
            x = x.unsqueeze(2).expand(-1, -1, n, -1)  # (B, T, n, D): n copies of the embedding
        memory = LayerMemory(self.config.n_layer) if self.config.router != 'none' else None
        for block in self.blocks:
            x = block(x, self.rotary, memory, cache)
        if cache is not None:
            cache.pos += T
        if n:
            # The HC authors sum the streams; the mean is the same through the norm below, but for
            # its eps, and keeps the model exactly the baseline at init (the sum is n times it).
            x = x.mean(dim=2)  # (B, T, D)
        x = self.final_norm(x)
        logits = self.lm_head(x)[..., :self.config.vocab_size]  # the padded ids are never predicted
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                                   ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Continue idx (B, T) by max_new_tokens tokens, one at a time, with a KV cache.
        temperature 0 (or top_k 1) is greedy. When the cache is full (block_size tokens), it is
        rebuilt from the most recent block_size // 2 tokens, so generation can go on forever."""
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

    # ------------------------------------------------------------------------------------------
    # Training helpers: optimizer groups, FLOPs and MFU

    def configure_optimizers(self, weight_decay, learning_rate, router_lr, betas=(0.9, 0.95),
                             eps=1e-8, fused=False):
        """AdamW with the paper's groups: matrices decay, vectors (norm gains, biases) do not;
        router parameters train at router_lr (paper: 10x), and the static router's R is not
        decayed (decay would pull it away from its identity init, toward reading nothing).
        Hyper-connections, as their authors do: the static A and B are not decayed (for the same
        reason), the dynamic W is; all at learning_rate."""
        router_params = {p for r in self.routers() for p in r.parameters()}
        static_params = {r.weight for r in self.routers() if isinstance(r, StaticRouter)}
        static_params |= {p for hc in self.hyper_connections() for p in (hc.static_alpha, hc.static_beta)}
        # Groups by role, not by value, so a checkpoint's optimizer state fits any learning rates.
        groups = {('main', True): [], ('main', False): [], ('router', True): [], ('router', False): []}
        for p in self.parameters():
            decay = p.dim() >= 2 and p not in static_params
            groups['router' if p in router_params else 'main', decay].append(p)
        param_groups = [{'params': params, 'lr': router_lr if role == 'router' else learning_rate,
                         'weight_decay': weight_decay if decay else 0.0}
                        for (role, decay), params in groups.items() if params]
        return torch.optim.AdamW(param_groups, lr=learning_rate, betas=betas, eps=eps, fused=fused)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # the tied embedding counts once

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward = 3x forward), PaLM-style: 6 per weight
        used in a matmul, plus attention scores, plus LIMe's mixing of keys/values, plus the
        hyper-connections' mixing of the streams."""
        cfg = self.config
        T = seq_len or cfg.block_size
        hs = cfg.n_embd // cfg.n_head
        static_weights = sum(r.weight.numel() for r in self.routers() if isinstance(r, StaticRouter))
        hc_weights = sum(p.numel() for hc in self.hyper_connections() for p in hc.parameters())
        matmuls = 6 * (self.num_params() - static_weights - hc_weights)  # includes lm_head via the tied embedding
        attention = 6 * 2 * cfg.n_layer * cfg.n_head * hs * T  # q.k and attn @ v, one multiply-add each
        # Each static weight R[g, m, h] is one multiply-add per channel of k and of v (2 * hs);
        # dynamic: one multiply-add per (head, source layer, channel of k and v).
        dynamic_weights = sum(cfg.n_kv_head * r.n_source for r in self.routers()
                              if isinstance(r, DynamicRouter))
        routing = 6 * 2 * hs * (static_weights + dynamic_weights)
        # HC, per sub-layer and token, one multiply-add per channel for each of: A_m and A_r
        # (n (n + 1)), B (n), and if dynamic W on each of the n streams (n (n + 2) again).
        n = cfg.hyper_connections
        hc = 6 * cfg.n_embd * n * (n + 2) * (1 + cfg.hc_dynamic) * len(self.hyper_connections())
        return matmuls + attention + routing + hc

    def estimate_mfu(self, tokens_per_second, peak_flops=989e12, seq_len=None):
        """Model FLOPs utilisation: achieved training FLOP/s over the device's peak (default: H100
        SXM bf16 dense, 989 TFLOP/s)."""
        return self.flops_per_token(seq_len) * tokens_per_second / peak_flops


# -----------------------------------------------------------------------------
# Checkpoints: their format is written and read here only. A checkpoint is a dict: the model's weights
# ('model') and GPTConfig ('model_args'), beside whatever train.py keeps to resume ('optimizer', 'step'...).

# Layers renamed since earlier checkpoints were written: (old, new) pieces of a weight's name.
RENAMED = [('.wte.', '.embed.'), ('.ln_f.', '.final_norm.'), ('.ln_1.', '.attn_norm.'), ('.ln_2.', '.mlp_norm.'),
           ('.mlp.c_fc.', '.mlp.gate_up_proj.'), ('.mlp.c_proj.', '.mlp.down_proj.')]


def save_checkpoint(path, model, **state):
    """Write model's weights and config, and state, to path atomically: into a temporary file that is
    then renamed over path, so a process killed mid-write leaves the previous checkpoint whole."""
    checkpoint = {'model': model.state_dict(), 'model_args': asdict(model.config), **state}
    tmp = f"{path}.{os.getpid()}.tmp"  # this process's own name: no other can write to it
    try:
        with open(tmp, 'wb') as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, say, or Ctrl-C: no half-written file is left behind
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_checkpoint(path, device, keys=('model', 'model_args')):
    """The checkpoint at path, on device, holding at least keys; its weights under today's names.
    Raises ValueError, with one line saying why, if it is missing, unreadable or something else."""
    if not os.path.isfile(path):
        raise ValueError(f"no checkpoint at {path} (train.py writes one to its out_dir)")
    try:
        checkpoint = torch.load(path, map_location=device)
    except Exception as e:  # torch's messages run to many lines: keep the last, most specific one
        lines = [line for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        raise ValueError(f"could not read checkpoint {path} (damaged, or not saved by train.py): "
                         f"{lines[-1].strip()}") from None
    missing = [key for key in keys if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise ValueError(f"{path} is not a checkpoint saved by train.py: it lacks {', '.join(missing)}")
    if 'model' in checkpoint:
        weights = {}
        for name, tensor in checkpoint['model'].items():
            name = '.' + name
            for old, new in RENAMED:
                name = name.replace(old, new)
            weights[name[1:]] = tensor
        checkpoint['model'] = weights
    return checkpoint


def load_model(path, device, fused=None):
    """The model in the checkpoint at path, in eval mode on device, and the checkpoint itself. fused
    (see GPTConfig) is how to compute LIMe's mix here, whatever the training run used. Raises
    ValueError, with one line saying why, if it does not load."""
    checkpoint = load_checkpoint(path, device, keys=('model', 'model_args', 'step', 'best_val_loss'))
    try:
        model = GPT(GPTConfig(**{**checkpoint['model_args'], 'fused': fused}))
        model.load_state_dict(checkpoint['model'])
    except (TypeError, ValueError, RuntimeError) as e:  # saved by another version of lime.py?
        raise ValueError(f"{path}: its model does not load into this lime.py: {str(e).splitlines()[0]}") from None
    print(f"loaded {path}: step {checkpoint['step']}, router={model.config.router}, "
          f"val loss {checkpoint['best_val_loss']:.4f}", file=sys.stderr)
    return model.eval().to(device), checkpoint
