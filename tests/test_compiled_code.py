"""
What torch.compile makes of lime.py's static mix, read off the code inductor generates on the
CPU: each routed layer writes its sources, the whole cat of layers 0..l, once, and the product
reads them as they lie. A definition such as R @ torch.cat(memory, dim=3), which torch's matmul
turns into a transposed copy of that cat at every layer, kept for the backward pass, fails here,
without a GPU.

It counts, in the compiled forward pass of a training step, the buffers the size of a layer's
cat (what inductor allocates: its empty_strided calls). What it cannot see of the CUDA lowering:
Triton's kernels, their fusions and buffer reuse, matmul templates picked by autotuning, strides
padded for alignment, and the copies CUDA's attention kernels make of keys and values whose
strides they do not accept. Those show only in a run on a GPU.

    python -m pytest -q tests/test_compiled_code.py
"""
import math
import re

import pytest
import torch

import lime
from lime import GPT, GPTConfig


def no_cpp_compiler():
    """None where inductor finds a C++ compiler for CPU code; else why it cannot compile here."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        get_cpp_compiler()
    except Exception as error:  # its search raises when no compiler it knows is installed
        return f"torch.compile's inductor finds no C++ compiler here ({error!r})"
    return None


NO_CPP_COMPILER = no_cpp_compiler()


def allocated_sizes(code):
    """The number of elements of each buffer the generated code allocates."""
    sizes = re.findall(r'empty_strided(?:_cpu)?\(\(([\d, ]*)\)', code)
    return [math.prod(int(n) for n in size.split(',') if n.strip()) for size in sizes]


@pytest.mark.skipif(NO_CPP_COMPILER is not None, reason=str(NO_CPP_COMPILER))
def test_each_routed_layer_of_a_compiled_step_writes_its_sources_once():
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    torch.manual_seed(0)
    # hs 10 and S * G 4 or 6: no other tensor of the forward pass has a cat's size
    cfg = GPTConfig(n_layer=3, n_head=4, n_kv_head=2, n_embd=40, block_size=16, vocab_size=64,
                    router='static')
    model = GPT(cfg)
    B, T = 2, 16
    x = torch.randint(0, cfg.vocab_size, (B, T))
    compiled = torch.compile(model)

    def step():
        _, loss = compiled(x, x)
        loss.backward()

    _, codes = run_and_get_code(step)
    assert len(codes) == 2, f"one graph, forward and backward, expected: {len(codes)} codes"
    sizes = allocated_sizes(codes[0])  # the forward, compiled first
    hs = cfg.n_embd // cfg.n_head
    for layer in range(1, cfg.n_layer):
        cat = B * T * 2 * (layer + 1) * cfg.n_kv_head * hs  # (B, T, 2, S*G, hs), in any order
        # 0 would mean the pattern above no longer finds inductor's allocations
        assert sizes.count(cat) == 1, (f"layer {layer}: {sizes.count(cat)} buffers of its cat's "
                                       f"size ({cat} elements) among {sorted(sizes)}")
