"""How, not what: faster versions of lime.py's LIMe mix (and loss), picked by
lime.use_fused_kernels through choose() below. cpu.py: for a CPU (the default there); fused.py:
Triton kernels for CUDA GPUs, opt-in (fused=True) until a GPU run of `python -m lab.gpu_check` is
recorded (docs/performance.md)."""
import importlib
import importlib.util
import os

import torch

from lime import last_line  # lime imports this package only inside a function

# The Triton kernels have been compiled for GPUs and run under Triton's interpreter on a CPU, not
# yet on a GPU. Until lab/gpu_check.py's report from one is recorded in docs/performance.md,
# fused=None keeps the plain (compiled) mix on CUDA; then this turns True, and fused=None picks
# the kernels wherever they pass the checks in why_not_fused.
FUSED_BY_DEFAULT_ON_CUDA = False
MIN_CAPABILITY = (8, 0)  # Ampere: sm_60-75 have no bf16 tensor cores, and the static backward spills


def choose(fused, device, shape=None):
    """The module of kernels that lime.py's switch should point at, or None for its plain
    PyTorch. fused: None (automatic), True (the Triton kernels, or a ValueError saying why they
    cannot run here), False (plain). shape: the run's (kv heads, head size, dtype), for the
    Triton kernels' self-check on the GPU; None skips it (inference, tests)."""
    on_cuda = str(device).startswith('cuda')
    if fused is False:
        return None
    if fused is None and not on_cuda:
        return importlib.import_module('kernels.cpu')
    if fused is None and not FUSED_BY_DEFAULT_ON_CUDA:
        return None
    why = why_not_fused(device, shape)
    if why is None:
        return importlib.import_module('kernels.fused')
    if fused:
        raise ValueError(f"fused=True: {why}; use fused=None or False for the plain mix")
    if os.environ.get('RANK', '0') in ('', '0'):
        print(f"note: LIMe's mix runs in plain PyTorch: {why}", flush=True)
    return None


def why_not_fused(device, shape):
    """None where the Triton kernels can run on device, else why not, in one line."""
    if importlib.util.find_spec('triton') is None:
        return "the Triton kernels need triton (pip install triton)"
    try:
        fused = importlib.import_module('kernels.fused')
    except Exception as e:  # an old triton (ImportError from fused.py), or a broken install
        return f"kernels/fused.py did not load ({type(e).__name__}: {last_line(e)[:200]})"
    if str(device).startswith('cuda'):
        capability = torch.cuda.get_device_capability(device)
        if capability < MIN_CAPABILITY:
            return (f"the GPU's compute capability is {capability[0]}.{capability[1]}; the "
                    f"kernels need {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer")
    if shape is not None:
        return fused.self_check(*shape, device)
    return None
