"""How, not what: faster code for lime.py's LIMe mix (and its training loss), picked by
lime.use_fused_kernels through choose() below. memory.py keeps the layer memory head-major and mixes
it with one matrix product per layer, in plain PyTorch, on a CPU and on a GPU alike; loss.py is a
leaner cross-entropy for a CPU. tests/test_kernels.py holds both to lime.py's definition."""
from kernels import memory


def choose(fused, device, shape=None):
    """The module that lime.py's switch should point at, or None for its plain PyTorch.
    fused: None (automatic: memory.py on a CPU, lime.py's definition on a GPU), True (memory.py,
    or a ValueError where its self-check fails), False (None). shape: the run's (kv heads, head
    size, dtype). Asked for on a GPU, memory.py first checks itself at that shape against the
    definition (under a second), since no CPU test can show a GPU's arithmetic; on a CPU the
    tests are that check, and None skips it (inference, tests)."""
    on_a_gpu = str(device).startswith('cuda')
    if fused is False:
        return None
    if fused is None and on_a_gpu:
        # On a GPU the definition, compiled by the run, is the faster: one H200, config/gpt2.py's
        # training step (12 layers, bf16, lab.gpu_check, 2026-11-28), static 354,063 tokens/s
        # (31.69 GiB) against memory.py's 236,595 (31.09 GiB), dynamic 383,760 (25.52 GiB)
        # against 267,726 (31.78 GiB); one H100 (2026-11-27) ranked them the same. One shape over
        # 8 steps: at 64 layers the definition has not been timed against memory.py, and
        # fused=True runs memory.py there. On a CPU memory.py stays the choice
        # (docs/performance.md measures it there).
        return None
    if shape is not None and on_a_gpu:
        why = memory.self_check(*shape, device)
        if why is not None:
            raise ValueError(f"fused=True: {why}; use fused=None or False for the plain mix")
    return memory
