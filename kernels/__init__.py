"""How, not what: faster code for lime.py's LIMe mix (and its training loss), picked by
lime.use_fused_kernels through choose() below. memory.py keeps the layer memory head-major and mixes
it with one matrix product per layer, in plain PyTorch, on a CPU and on a GPU alike; loss.py is a
leaner cross-entropy for a CPU. tests/test_kernels.py holds both to lime.py's definition."""
import os

from kernels import memory


def choose(fused, device, shape=None):
    """The module that lime.py's switch should point at, or None for its plain PyTorch.
    fused: None (automatic: memory.py, unless its self-check fails), True (memory.py, or a
    ValueError where its self-check fails), False (None). shape: the run's (kv heads, head size,
    dtype). On a GPU, memory.py first checks itself at that shape against the definition (under
    a second), since no CPU test can show a GPU's arithmetic; on a CPU the tests are that check,
    and None skips it (inference, tests)."""
    if fused is False:
        return None
    why = None
    if shape is not None and str(device).startswith('cuda'):
        why = memory.self_check(*shape, device)
    if why is None:
        return memory
    if fused:
        raise ValueError(f"fused=True: {why}; use fused=None or False for the plain mix")
    if os.environ.get('RANK', '0') in ('', '0'):
        print(f"note: LIMe's mix runs in lime.py's plain PyTorch: {why}", flush=True)
    return None
