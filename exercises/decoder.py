"""
decoder.py: exercise 5's check runs a model one token at a time with the student's
cached_attention in every attention layer; Decoder does that, and checks each call (its output,
the layer memory it sets, the cache it returns) against lime.py's own forward pass.
exercises/checks.py's check_cached_attention drives it.
"""
import copy
import functools

import torch

from exercises.checks import Wrong, check_shape, close, last_line, max_diff, refusal
from lime import CausalSelfAttention, KVCache


class Decoder:
    """Runs model one token at a time, each attention layer replaced by cached_attention with a
    cache of its own, and checks what each call returns against lime.py's own forward pass."""

    def __init__(self, cached_attention, model, router, right):
        self.cached_attention, self.model, self.router, self.right = (cached_attention, model,
                                                                      router, right)
        self.cfg = model.config
        self.caches = [None] * self.cfg.n_layer
        self.running = set()  # the layers whose cached_attention is running

    def logits(self, idx):
        """The model's logits for idx (B, T), fed one token at a time: (B, T, vocab)."""
        # What a full pass caches at each layer: the routed keys/values after RoPE, (B, G, T, hs)
        self.full = KVCache(self.cfg.n_layer, idx.size(1))
        self.model(idx, cache=self.full)
        self.idx = idx
        self.unrouted = [self.without_router(layer) for layer in range(self.cfg.n_layer)
                         if self.router != 'none']
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
        where = f"cached_attention with router={self.router!r}, at layer {layer} and token {pos}"
        self.running.add(layer)
        try:
            y, self.caches[layer] = self.cached_attention(attn, h, rotary, memory,
                                                          self.caches[layer])
        except NotImplementedError:  # a RuntimeError too: not written yet, says verdict
            raise
        except (RuntimeError, TypeError, IndexError) as e:  # torch's, on what it was given
            raise Wrong(f"{where}: {self.failure(layer, memory, e)}") from e
        finally:
            self.running.discard(layer)
        if memory is not None:
            self.check_memory(where, attn, h, rotary, memory)
        check_shape(f"{where}: its output", y, (h.size(0), 1, self.cfg.n_embd), "(B, 1, D)")
        self.check_cache(where, layer, pos)
        return y

    def failure(self, layer, memory, error):
        """Why the answer raised error, in a line."""
        said = f"{type(error).__name__}: {last_line(error)}"
        if memory is not None and memory[layer] is None:
            return (f"the router reads layers 0..{layer}, and the memory has no entry for layer "
                    f"{layer}: set memory[attn.layer_idx] to this layer's raw keys/values before "
                    f"routing ({said})")
        G, H = self.cfg.n_kv_head, self.cfg.n_head
        if G < H and ('none', H) in self.right:
            return (f"it works with n_kv_head = n_head, and fails with n_kv_head={G} < n_head={H} "
                    f"({said}): grouped-query attention is forgotten; each key/value head serves "
                    f"{H // G} query heads (scaled_dot_product_attention's enable_gqa)")
        if memory is not None:
            return (f"it raised {said}; at layer {layer} the router reads the {layer + 1} "
                    f"entries of layers 0..{layer}: memory[:attn.layer_idx + 1]")
        return f"it raised {said}"

    def check_memory(self, where, attn, h, rotary, memory):
        """The memory entry the answer set must be the layer's raw keys/values, as lime.py's
        forward sets it: later layers' routers mix them before RoPE."""
        layer = attn.layer_idx
        if memory[layer] is None:
            raise Wrong(f"{where}: afterwards the memory has no entry for layer {layer}: set "
                        "memory[attn.layer_idx] to this layer's raw keys/values (later layers "
                        "read it)")
        lime_memory = list(memory)
        lime_memory[layer] = None
        CausalSelfAttention.forward(attn, h, rotary, lime_memory)  # sets the raw entry
        got, raw = memory[layer], lime_memory[layer]
        check_shape(f"{where}: its memory entry", got, raw.shape, "(B, 1, 2, G, hs), as kv_proj's")
        if close(got, raw):
            return
        if close(got[:, :, 1], raw[:, :, 1]):
            raise Wrong(f"{where}: the values in the layer memory are right, the keys are not "
                        "the raw keys: is RoPE applied before they go in? The memory holds "
                        "kv_proj's output as it is; RoPE comes after the router's mix")
        raise Wrong(f"{where}: the layer memory's entry for layer {layer} is not the layer's raw "
                    f"keys/values (off by up to {max_diff(got, raw):.3g}): kv_proj's output, "
                    "before routing and RoPE")

    def check_cache(self, where, layer, pos):
        """The cache the answer returned must hold, for every token so far, what a full forward
        pass attends over at this layer."""
        if not (isinstance(self.caches[layer], tuple) and len(self.caches[layer]) == 2):
            raise Wrong(f"{where}: the cache it returns is not a pair (k, v)")
        B, G, hs = self.idx.size(0), self.cfg.n_kv_head, self.cfg.n_embd // self.cfg.n_head
        for name, got in zip('kv', self.caches[layer]):
            shape = (B, G, pos + 1, hs)
            if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, pos + 1, G, hs) != shape:
                raise Wrong(f"{where}: the cached {name} is (B, P + 1, G, hs), time before heads: "
                            "transpose k and v to (B, G, T, hs), as q, before attention and "
                            "the cache")
            check_shape(f"{where}: the cached {name}", got, shape,
                        f"(B, G, P + 1, hs): one entry per token so far for each of the {G} "
                        "key/value heads (cached before grouped-query attention repeats them)")
            full = getattr(self.full, name)[layer, :, :, :pos + 1]
            if close(got, full, 1e-3):
                continue
            if self.router != 'none':
                own = getattr(self.unrouted[layer], name)[layer, :, :, :pos + 1]
                if close(got, own, 1e-3):
                    what = {'k': 'keys', 'v': 'values'}[name]
                    raise Wrong(f"{where}: the cache holds the layer's own {what}, not its "
                                "router's mix: a later token attends over the routed "
                                "keys/values of the past ones, so cache those")
            raise Wrong(f"{where}: the cached {name} differs from what a full forward pass "
                        f"attends over at this layer by up to {max_diff(got, full):.3g}: the "
                        "routed keys/values after RoPE, each at its own token's position")

    def without_router(self, layer):
        """What a full pass caches if layer has no router: its own keys and values after RoPE at
        that layer (the layers before it, and so its input, are the same)."""
        unrouted = copy.deepcopy(self.model)
        unrouted.blocks[layer].attn.router = None
        cache = KVCache(self.cfg.n_layer, self.idx.size(1))
        unrouted(self.idx, cache=cache)
        return cache
