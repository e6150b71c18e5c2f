"""
kernels/: faster code for the numbers lime.py defines, opt-in. memory.py keeps the layer memory
head-major and mixes it with one matrix product per layer, in plain PyTorch; on a CPU, at depth, a
training step runs faster with it (docs/performance.md), while on a GPU lime.py's definition,
compiled, is the faster. A script asks for it by name (`--fused=True`), and install() below puts
it into one built model; lime.py knows nothing of it. tests/test_kernels.py holds it to lime.py.
"""
import functools

import torch

import lime
from kernels import memory


class FusedStaticRouter(lime.StaticRouter):
    """lime.StaticRouter, its mix computed by memory.py: the same weights, the same numbers."""

    def forward(self, h, layers):
        return memory.static_mix(self.mix_weights(), layers)


class FusedDynamicRouter(lime.DynamicRouter):
    """lime.DynamicRouter, its mix computed by memory.py: the same weights, the same numbers."""

    def forward(self, h, layers):
        return memory.dynamic_mix(self.mix_weights(h), layers)


FUSED = {lime.StaticRouter: FusedStaticRouter, lime.DynamicRouter: FusedDynamicRouter}
MIXES_KV_ONLY = ("fused=True: kernels/memory.py mixes keys and values (memory='kv'), not the "
                 "hidden states of memory='hidden' (paper v1): run it with --fused=False")


def install(model, device, dtype=None):
    """Make model (a lime.GPT) mix its layer memory with memory.py, in place; or a one-line
    ValueError, before anything changes, where memory.py does not cover it. The baseline
    (router='none') has no mix: it is left as it is, so that a preset with fused=True also runs
    --router=none. On a GPU, given the run's dtype, memory.py first checks itself against the
    definition there (under a second): no CPU test can show a GPU's arithmetic."""
    cfg = model.config
    if cfg.router == 'none':
        return model
    if cfg.memory != 'kv':
        raise ValueError(MIXES_KV_ONLY)
    for router in model.routers():
        if type(router) not in FUSED:
            raise ValueError(f"fused=True covers lime.py's own routers, not "
                             f"{type(router).__name__}")
    if str(device).startswith('cuda') and dtype is not None:
        why = memory.self_check(cfg.n_kv_head, cfg.n_embd // cfg.n_head, dtype, device)
        if why is not None:
            raise ValueError(f"fused=True: {why}; run with fused=False, lime.py's mix")
    for router in model.routers():
        router.__class__ = FUSED[type(router)]  # a subclass: its weights stay where they are
    # One head-major buffer for every layer, in place of lime.py's list (GPT.layer_memory).
    model.layer_memory = functools.partial(memory.LayerMemory, cfg.n_layer)
    # The mix is a graph break in each routed layer, so dynamo compiles each layer's attention
    # on its own (their layer indices differ): past its limit of 8 recompiles, later layers would
    # run uncompiled. It is let keep one per layer.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, cfg.n_layer)
    return model
