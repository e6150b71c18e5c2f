"""
kernels/fused.py: LIMe's mix of the layer memory as fused Triton kernels, forward and backward.

lime.py's routers define the mix in plain PyTorch; this file computes the same numbers faster on a
GPU (tests/test_fused.py holds the two paths together). lime.use_fused_kernels() switches to it
(the scripts' `fused` key). Layer l's mix reads S = l + 1 source tensors of
the memory. In plain PyTorch that is a copy of the memory (torch.cat) or one kernel per source,
with copies saved for backward, and torch.compile's graph grows as n_layer^2. Here each layer's mix
is one custom op (one node in the compiled graph, so compiling stays fast at any depth) that reads
every source once, accumulates in fp32, and writes once. Its backward reads the output's gradient
once and adds each source's share into one gradient buffer for the whole memory (see
gradient_buffer). Nothing is saved but the router's weights and the sources, which the memory
keeps alive anyway.

    static_mix(R, memory)       R (G, S*G), memory S tensors (B, T, 2, G, hs) -> (B, T, 2, G, hs)
    dynamic_mix(probs, memory)  probs (B, T, G, S)

On a machine without CUDA the kernels run under Triton's interpreter (slowly: that is for tests).
The interpreter must be chosen before triton is imported, so importing this file first sets
TRITON_INTERPRET=1 there (and refuses to load if triton came first); its tl.dot is wrong on bfloat16, so the kernels upcast when interpreting.

On a GPU (tests/test_kernels_compile.py compiles every kernel for sm_80 and sm_90 ahead of time,
at every shape the repo ships; docs/performance.md has what it found):
- Tiles are picked per shape (static_tiles, dynamic_tiles): the default first, then the few
  neighbours triton.autotune times the first time it sees a shape, and never a tile that cannot
  compile or would not fit (the static backward's tl.dot needs 16 columns in 16-bit types; a
  static tile's registers grow with the heads G, so the tile narrows as G grows).
- In float32, tl.dot follows torch's float32 matmul setting: TF32 where torch allows it for its
  own matmuls (torch.backends.cuda.matmul.fp32_precision / allow_tf32), exact float32 otherwise.
- Autotuning allocates nothing and times the kernel alone: while a backward kernel is being
  timed, a flag on the device (trial_flag) makes it write every gradient back unchanged, so the
  trial runs need no copy of the gradient buffer to undo them.
- Every launch runs on its tensors' GPU, whatever the current device is (on_device).
"""
import contextlib
import os
import re
import sys
from typing import Optional

import torch

from lime import last_line  # lime imports kernels only inside a function

if not torch.cuda.is_available() and 'TRITON_INTERPRET' not in os.environ:
    if 'triton' in sys.modules:  # triton.language's own helpers were built for a GPU then
        raise ImportError("without CUDA the kernels run under Triton's interpreter, which must be "
                          "chosen before triton is imported: start with TRITON_INTERPRET=1")
    os.environ['TRITON_INTERPRET'] = '1'
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'
# triton.autotune takes a do_bench hook from 3.3 on (3.1 refuses the argument; 3.2 takes it and
# never calls it, and then every timing run would add the gradients again: autotuned() checks).
MIN_TRITON = (3, 3)
TRITON_VERSION = tuple(int(x) for x in re.findall(r'\d+', triton.__version__)[:2])
if TRITON_VERSION < MIN_TRITON:
    raise ImportError(f"the fused kernels need triton >= {'.'.join(map(str, MIN_TRITON))}, "
                      f"found {triton.__version__}")
TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}

# ---------------------------------------------------------------------------------------------
# Tiles. Every kernel takes ROWS rows at a time; the candidates are ROWS = 1, 2, 4, ... at 4 and
# 8 warps, and a prune (triton.autotune's early_config_prune, run before anything is compiled)
# keeps, per shape, the default and its neighbours: half the rows; the same rows on 8 warps;
# twice the rows on 8 warps. Under the interpreter, where timing means nothing, only the default.

CANDIDATES = [triton.Config({'ROWS': 2 ** i}, num_warps=w) for w in (4, 8) for i in range(11)]
single_config = INTERPRET  # the default tile only (tests switch it off to exercise autotuning)


def pick(configs, rows, smallest=1, warps=4):
    """The default (rows, warps) first, then its neighbours, from configs."""
    wanted = [(rows, warps), (rows // 2, warps), (rows, 8), (2 * rows, 8)]
    wanted = [w for i, w in enumerate(wanted) if w[0] >= smallest and w not in wanted[:i]]
    if single_config:
        wanted = wanted[:1]
    by_key = {(c.kwargs['ROWS'], c.num_warps): c for c in configs}
    return [by_key[w] for w in wanted if w in by_key]


def static_tiles(elements):
    """The static kernels' prune. Their tile is (G padded, ROWS * head size padded), and their
    registers grow with G twice over: the tile's height, and R's (G x G) blocks and R's gradient
    beside it. Compiled for sm_80 and sm_90 (docs/performance.md), 2048 elements (16 per thread
    on 4 warps) keep the backward at <= 128 registers per thread, 16 warps per SM: 128 columns
    at G <= 16, 64 at G = 32 (4096 elements, 32 per thread, took 130 to 136 at G <= 16 and 240
    at G = 32). The forward holds less: 4096 elements. Float32 tiles take a quarter of the
    elements (with half, ptxas spilled a few bytes on sm_80 at most shapes). The backward's
    tl.dot over the tile's columns needs at least 16 of them in 16-bit types (8 in float32):
    narrower tiles are never tried. (With the sources' loads made 16-byte vectors, the
    backward at G = 32, one row on 4 warps, took 134 registers on sm_90: such a tile, over its
    budget at one row, goes to 8 warps by default in 16-bit types.)"""
    def prune(configs, named_args, **meta):
        GP, HSP, bits = meta['GP'], meta['HSP'], meta['DTYPE'].primitive_bitwidth
        smallest = triton.cdiv(256 // bits, HSP)  # 16 columns in 16-bit types, 8 in float32
        rows = elements // (bits // 16) ** 2 // (GP * HSP)
        # A 16-bit tile that fills the budget at its narrowest (G = 32 at head size 64) spreads
        # over 8 warps.
        warps = 8 if bits == 16 and GP * HSP * smallest >= elements else 4
        return pick(configs, max(smallest, rows), smallest, warps)
    return prune


def dynamic_tiles(configs, named_args, **meta):
    """The dynamic kernels' prune. Their tile is (ROWS, 2 * head size padded): 2048 elements by
    default (16 rows at head size 64), whatever the head size."""
    return pick(configs, max(1, 1024 // meta['HSP']))


def autotuned(prune, key=('G', 'HS'), trial_flag=None):
    """triton.autotune over CANDIDATES, pruned to the shape's tiles by prune; key: what a shape
    is, besides the tensors' dtypes. trial_flag: the name of a backward kernel's flag argument,
    set to 0 while configs are timed (see trial_flag below)."""
    tuner = None

    def do_bench(kernel_call, quantiles):
        flag = tuner.nargs[trial_flag] if trial_flag else None
        if flag is not None:
            flag.zero_()  # outside the timed calls: they run the kernel alone
        try:
            return benchmarker()(kernel_call, quantiles=quantiles)
        finally:
            if flag is not None:
                flag.fill_(1)

    def wrap(kernel):
        nonlocal tuner
        tuner = triton.autotune(CANDIDATES, key=list(key), do_bench=do_bench,
                                prune_configs_by={'early_config_prune': prune})(kernel)
        check_hook(tuner, do_bench)
        return tuner
    return wrap


def check_hook(tuner, do_bench):
    """Refuse a tuner that would not time configs through do_bench: a backward kernel timed
    without the trial flag adds its gradients once per timing run (hundreds of times)."""
    if getattr(tuner, '_do_bench', None) is not do_bench:
        raise ImportError(f"triton {triton.__version__}'s autotune does not use the do_bench "
                          "hook that the fused kernels' timing needs")


def benchmarker():
    """What times a config (the GPU driver's, as triton.autotune's default)."""
    return triton.runtime.driver.active.get_benchmarker()


TRIAL_FLAGS = {}


def trial_flag(device):
    """One int32 per device, read by the backward kernels: 1, add the sources' gradients into
    the gradient buffer; 0 (only while the autotuner times trial configs), load and store
    them unchanged. A trial then moves the same bytes as a real run and leaves the buffer as it
    was, so autotuning needs no copy of the buffer to restore, and times no copy."""
    key = str(device)
    if key not in TRIAL_FLAGS:
        TRIAL_FLAGS[key] = torch.ones(1, dtype=torch.int32, device=device)
    return TRIAL_FLAGS[key]


# ---------------------------------------------------------------------------------------------
# static: out[row, g, :] = sum_m sum_h R[g, m*G + h] * src_m[row, h, :]
# A "row" is one (batch, time, key-or-value) triple: G heads of HS channels, contiguous. A program
# takes ROWS rows at a time as a (G, ROWS*HS) tile, so the mix over heads is one small matmul per
# source on tensor cores: (G x G) @ (G x ROWS*HS). G and HS are padded to powers of two (masked).


@autotuned(static_tiles(4096))
@triton.jit(do_not_specialize=['S'])  # one compile for every layer
def static_mix_fwd_kernel(src_ptrs, R, out, n_rows, S, G: tl.constexpr, HS: tl.constexpr,
                          GP: tl.constexpr, HSP: tl.constexpr, DTYPE: tl.constexpr,
                          FP32_DOT: tl.constexpr, PRECISION: tl.constexpr, ROWS: tl.constexpr):
    col = tl.arange(0, ROWS * HSP)
    row = tl.program_id(0) * ROWS + col // HSP
    d = col % HSP
    g = tl.arange(0, GP)
    tile = g[:, None] * HS + (row.to(tl.int64) * (G * HS) + d)[None, :]  # (GP, ROWS*HSP) offsets
    mask = (g < G)[:, None] & ((row < n_rows) & (d < HS))[None, :]
    r_tile = g[:, None] * (S * G) + g[None, :]  # R[g, m*G + h] = r_tile + m*G
    r_mask = (g < G)[:, None] & (g < G)[None, :]
    acc = tl.zeros((GP, ROWS * HSP), dtype=tl.float32)
    for m in range(S):
        src = tl.multiple_of(tl.load(src_ptrs + m).to(tl.pointer_type(DTYPE)), 16)
        x = tl.load(src + tile, mask=mask, other=0.0)
        r = tl.load(R + r_tile + m * G, mask=r_mask, other=0.0)
        if FP32_DOT:
            acc += tl.dot(r.to(tl.float32), x.to(tl.float32), input_precision=PRECISION)
        else:
            acc += tl.dot(r.to(x.dtype), x, input_precision=PRECISION)
    tl.store(out + tile, acc.to(out.dtype.element_ty), mask=mask)


@autotuned(static_tiles(2048), trial_flag='accumulate')
@triton.jit(do_not_specialize=['S'])  # one compile for every layer
def static_mix_bwd_kernel(src_ptrs, R, dout, grads, grads_stride, dR_part, accumulate, n_rows, S,
                          G: tl.constexpr, HS: tl.constexpr, GP: tl.constexpr,
                          HSP: tl.constexpr, DTYPE: tl.constexpr, FP32_DOT: tl.constexpr,
                          PRECISION: tl.constexpr, FIRST: tl.constexpr, ROWS: tl.constexpr):
    # A fixed number of programs, each looping over tiles. Source m's gradient is added into
    # grads[m] (read, add in fp32, write back), or, by the first mix to run backward (FIRST),
    # written there. R's gradient is summed per program in a small
    # private slice of dR_part (S, GP, GP) (no atomics, so it is deterministic), which the
    # program zeroes first, and the slices are added up afterwards.
    pid, n_programs = tl.program_id(0), tl.num_programs(0)
    col = tl.arange(0, ROWS * HSP)
    d = col % HSP
    g = tl.arange(0, GP)
    r_tile = g[:, None] * (S * G) + g[None, :]
    r_mask = (g < G)[:, None] & (g < G)[None, :]
    part = dR_part + pid.to(tl.int64) * S * GP * GP + g[:, None] * GP + g[None, :]
    for m in range(S):
        tl.store(part + m * GP * GP, tl.zeros((GP, GP), dtype=tl.float32))
    keep = tl.load(accumulate) == 0  # an autotuning trial: write the gradients back unchanged
    for start in range(pid * ROWS, n_rows, n_programs * ROWS):
        row = start + col // HSP
        tile = g[:, None] * HS + (row.to(tl.int64) * (G * HS) + d)[None, :]
        mask = (g < G)[:, None] & ((row < n_rows) & (d < HS))[None, :]
        dy = tl.load(dout + tile, mask=mask, other=0.0)  # read once for all S sources
        if FP32_DOT:
            dy = dy.to(tl.float32)
        for m in range(S):
            src = tl.multiple_of(tl.load(src_ptrs + m).to(tl.pointer_type(DTYPE)), 16)
            x = tl.load(src + tile, mask=mask, other=0.0)
            r = tl.load(R + r_tile + m * G, mask=r_mask, other=0.0)
            if FP32_DOT:
                x, r = x.to(tl.float32), r.to(tl.float32)
            else:
                r = r.to(x.dtype)
            # d src_m[h, :] = sum_g R[g, h] dout[g, :]
            dx = tl.dot(tl.trans(r), dy, input_precision=PRECISION)
            grad = grads + tl.cast(m, tl.int64) * grads_stride + tile
            if FIRST:
                tl.store(grad, dx.to(DTYPE), mask=mask)
            else:
                old = tl.load(grad, mask=mask, other=0.0).to(tl.float32)
                tl.store(grad, tl.where(keep, old, old + dx).to(DTYPE), mask=mask)
            # d R[g, h] = sum over the tile of dout[g, :] src_m[h, :]
            dr = tl.dot(dy, tl.trans(x), input_precision=PRECISION)
            tl.store(part + m * GP * GP, tl.load(part + m * GP * GP) + dr)


def check_sources(sources):
    x = sources[0]
    if not all(s.shape == x.shape and s.dtype == x.dtype and s.device == x.device
               for s in sources):
        raise ValueError("the layer memory's tensors must share one shape, dtype and device")
    if x.dtype not in TL_DTYPES:
        raise ValueError(f"fused mix: unsupported dtype {x.dtype}")
    if x.device.type != 'cuda' and not INTERPRET:
        raise RuntimeError("fused=True on a CPU tensor needs Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before starting Python, or use fused=None / False")
    # The kernels load sources in 16-byte vectors (tl.multiple_of): a view that starts
    # elsewhere (torch allocates at 512-byte boundaries) is copied.
    return [s if s.is_contiguous() and s.data_ptr() % 16 == 0 else s.clone() for s in sources]


def kernel_meta(x):
    """The constexprs every kernel takes, for sources like x (B, T, 2, G, hs)."""
    _, _, _, G, HS = x.shape
    return dict(G=G, HS=HS, HSP=triton.next_power_of_2(HS), DTYPE=TL_DTYPES[x.dtype],
                FP32_DOT=INTERPRET)


def dot_precision(dtype):
    """tl.dot's input precision: on float32 tensors TF32 where torch allows TF32 for its own
    float32 matmuls, else exact ('ieee'; also under the interpreter, which computes exactly).
    16-bit inputs are multiplied exactly anyway."""
    if dtype != torch.float32 or INTERPRET:
        return 'ieee'
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, 'fp32_precision', None)  # torch >= 2.9
    if precision is None:
        return 'tf32' if matmul.allow_tf32 else 'ieee'
    return 'tf32' if precision == 'tf32' else 'ieee'


def addresses(tensors):
    """Triton takes one pointer per argument, so the S sources travel as a tensor of addresses."""
    ptrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    if tensors[0].is_cuda:  # from pinned memory the copy is asynchronous: the CPU need not wait
        ptrs = ptrs.pin_memory().to(tensors[0].device, non_blocking=True)
    return ptrs


def n_programs(device, n_tiles):
    if device.type == 'cuda':
        return min(n_tiles, 4 * torch.cuda.get_device_properties(device).multi_processor_count)
    return min(n_tiles, 8)  # the interpreter runs programs one by one


def on_device(x):
    """Launch on x's GPU: triton launches on the current CUDA device, which need not be x's."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def launch(kernel, grid, args, meta):
    kernel[grid](*args, **meta)


# The launches: each returns (kernel, grid, args, constexprs) for tensors already checked and
# contiguous, so tests/test_kernels_compile.py compiles exactly what a GPU run launches.

def static_forward_launch(R, sources, out):
    meta = kernel_meta(out)
    meta.update(GP=max(16, triton.next_power_of_2(meta['G'])),  # tl.dot wants every side >= 16
                PRECISION=dot_precision(out.dtype))
    n_rows = out.numel() // (meta['G'] * meta['HS'])
    grid = lambda cfg: (triton.cdiv(n_rows, cfg['ROWS']),)  # noqa: E731
    return static_mix_fwd_kernel, grid, (addresses(sources), R, out, n_rows, len(sources)), meta


def static_backward_launch(grad, R, sources, grads, dR_part, first=False):
    meta = kernel_meta(grad)
    meta.update(GP=dR_part.shape[-1], PRECISION=dot_precision(grad.dtype), FIRST=first)
    n_rows = grad.numel() // (meta['G'] * meta['HS'])
    args = (addresses(sources), R, grad, grads, grads.stride(0), dR_part, trial_flag(grad.device),
            n_rows, len(sources))
    return static_mix_bwd_kernel, (dR_part.shape[0],), args, meta


# The ops launch kernels on pointers read at the call (addresses()): a CUDA graph replaying them
# would read tensors that may no longer be there, so they are marked unsafe for CUDA graphs, and
# torch.compile(mode='reduce-overhead') leaves them out of its graphs.
UNSAFE_FOR_CUDA_GRAPHS = [torch.Tag.cudagraph_unsafe] if hasattr(torch.Tag, 'cudagraph_unsafe') else []


@torch.library.custom_op('lime::static_mix', mutates_args=(), tags=UNSAFE_FOR_CUDA_GRAPHS)
def static_mix_op(R: torch.Tensor, sources: list[torch.Tensor],
                  grads: Optional[torch.Tensor]) -> torch.Tensor:
    """sum_m sum_h R[g, m*G + h] * sources[m][..., h, :], for sources of shape (B, T, 2, G, hs).
    grads: where the backward adds the sources' gradients (see gradient_buffer); unused here."""
    sources = check_sources(sources)
    out = torch.empty_like(sources[0])
    with on_device(out):
        launch(*static_forward_launch(R.contiguous(), sources, out))
    return out


@static_mix_op.register_fake
def _(R, sources, grads):
    return torch.empty_like(sources[0])


@torch.library.custom_op('lime::static_mix_backward', mutates_args=('grads',),
                         tags=UNSAFE_FOR_CUDA_GRAPHS)
def static_mix_backward(grad: torch.Tensor, R: torch.Tensor, sources: list[torch.Tensor],
                        grads: torch.Tensor, first: bool = False) -> torch.Tensor:
    """Adds each source's gradient into grads[m] (first: writes it); returns R's gradient
    (G, S*G)."""
    sources = check_sources(sources)
    grad = grad.contiguous()
    _, _, _, G, HS = grad.shape
    S, GP = len(sources), max(16, triton.next_power_of_2(G))
    programs = n_programs(grad.device, grad.numel() // (G * HS))  # at most one per row
    # every program zeroes its own slice first
    dR_part = torch.empty((programs, S, GP, GP), dtype=torch.float32, device=grad.device)
    with on_device(grad):
        launch(*static_backward_launch(grad, R.contiguous(), sources, grads, dR_part, first))
    dR = dR_part.sum(0)[:, :G, :G]  # (m, g, h) -> R's layout (g, m*G + h)
    return dR.transpose(0, 1).reshape(G, S * G).to(R.dtype)


@static_mix_backward.register_fake
def _(grad, R, sources, grads, first=False):
    return torch.empty_like(R)


# ---------------------------------------------------------------------------------------------
# dynamic: out[b, t, c, g, :] = sum_m probs[b, t, g, m] * src_m[b, t, c, g, :]
# Here a "row" is one (batch, time, head) triple, whose 2*HS channels (key and value) share one
# weight per source: a program takes ROWS rows as a (ROWS, 2*HS) tile. No matmul, just a weighted
# sum, and the probabilities' gradient is a dot product per row.


@autotuned(dynamic_tiles)
@triton.jit(do_not_specialize=['S'])  # one compile for every layer
def dynamic_mix_fwd_kernel(src_ptrs, probs, out, n_rows, S, G: tl.constexpr, HS: tl.constexpr,
                           HSP: tl.constexpr, DTYPE: tl.constexpr, FP32_DOT: tl.constexpr,
                           ROWS: tl.constexpr):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    col = tl.arange(0, 2 * HSP)  # (key or value, channel)
    c, d = col // HSP, col % HSP
    tile = (((row // G).to(tl.int64) * (2 * G * HS) + (row % G) * HS)[:, None]
            + (c * (G * HS) + d)[None, :])
    mask = (row < n_rows)[:, None] & (d < HS)[None, :]
    acc = tl.zeros((ROWS, 2 * HSP), dtype=tl.float32)
    for m in range(S):
        src = tl.multiple_of(tl.load(src_ptrs + m).to(tl.pointer_type(DTYPE)), 16)
        x = tl.load(src + tile, mask=mask, other=0.0).to(tl.float32)
        p = tl.load(probs + row.to(tl.int64) * S + m, mask=row < n_rows, other=0.0)
        acc += p.to(tl.float32)[:, None] * x
    tl.store(out + tile, acc.to(out.dtype.element_ty), mask=mask)


@autotuned(dynamic_tiles, trial_flag='accumulate')
@triton.jit(do_not_specialize=['S'])  # one compile for every layer
def dynamic_mix_bwd_kernel(src_ptrs, probs, dout, grads, grads_stride, dprobs, accumulate, n_rows,
                           S, G: tl.constexpr, HS: tl.constexpr, HSP: tl.constexpr,
                           DTYPE: tl.constexpr, FP32_DOT: tl.constexpr, FIRST: tl.constexpr,
                           ROWS: tl.constexpr):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    col = tl.arange(0, 2 * HSP)
    c, d = col // HSP, col % HSP
    tile = (((row // G).to(tl.int64) * (2 * G * HS) + (row % G) * HS)[:, None]
            + (c * (G * HS) + d)[None, :])
    mask = (row < n_rows)[:, None] & (d < HS)[None, :]
    keep = tl.load(accumulate) == 0  # an autotuning trial: write the gradients back unchanged
    dy = tl.load(dout + tile, mask=mask, other=0.0).to(tl.float32)  # read once for all S sources
    for m in range(S):
        src = tl.multiple_of(tl.load(src_ptrs + m).to(tl.pointer_type(DTYPE)), 16)
        x = tl.load(src + tile, mask=mask, other=0.0).to(tl.float32)
        p_at = probs + row.to(tl.int64) * S + m
        p = tl.load(p_at, mask=row < n_rows, other=0.0).to(tl.float32)
        grad = grads + tl.cast(m, tl.int64) * grads_stride + tile
        if FIRST:  # the first mix to run backward: grads held nothing yet (see gradient_buffer)
            tl.store(grad, (p[:, None] * dy).to(DTYPE), mask=mask)
        else:
            old = tl.load(grad, mask=mask, other=0.0).to(tl.float32)
            tl.store(grad, tl.where(keep, old, old + p[:, None] * dy).to(DTYPE), mask=mask)
        tl.store(dprobs + row.to(tl.int64) * S + m,
                 tl.sum(dy * x, axis=1).to(dprobs.dtype.element_ty), mask=row < n_rows)


def dynamic_forward_launch(probs, sources, out):
    meta = kernel_meta(out)
    n_rows = out.numel() // (2 * meta['HS'])
    grid = lambda cfg: (triton.cdiv(n_rows, cfg['ROWS']),)  # noqa: E731
    return dynamic_mix_fwd_kernel, grid, (addresses(sources), probs, out, n_rows,
                                          len(sources)), meta


def dynamic_backward_launch(grad, probs, sources, grads, dprobs, first=False):
    meta = kernel_meta(grad)
    meta['FIRST'] = first
    n_rows = grad.numel() // (2 * meta['HS'])
    grid = lambda cfg: (triton.cdiv(n_rows, cfg['ROWS']),)  # noqa: E731
    args = (addresses(sources), probs, grad, grads, grads.stride(0), dprobs,
            trial_flag(grad.device), n_rows, len(sources))
    return dynamic_mix_bwd_kernel, grid, args, meta


@torch.library.custom_op('lime::dynamic_mix', mutates_args=(), tags=UNSAFE_FOR_CUDA_GRAPHS)
def dynamic_mix_op(probs: torch.Tensor, sources: list[torch.Tensor],
                   grads: Optional[torch.Tensor]) -> torch.Tensor:
    """sum_m probs[b, t, g, m] * sources[m][b, t, :, g, :], for sources of shape
    (B, T, 2, G, hs)."""
    sources = check_sources(sources)
    out = torch.empty_like(sources[0])
    with on_device(out):
        launch(*dynamic_forward_launch(probs.contiguous(), sources, out))
    return out


@dynamic_mix_op.register_fake
def _(probs, sources, grads):
    return torch.empty_like(sources[0])


@torch.library.custom_op('lime::dynamic_mix_backward', mutates_args=('grads',),
                         tags=UNSAFE_FOR_CUDA_GRAPHS)
def dynamic_mix_backward(grad: torch.Tensor, probs: torch.Tensor, sources: list[torch.Tensor],
                         grads: torch.Tensor, first: bool = False) -> torch.Tensor:
    """Adds each source's gradient into grads[m] (first: writes it); returns the probabilities'
    gradient (B, T, G, S)."""
    sources = check_sources(sources)
    probs = probs.contiguous()
    dprobs = torch.empty_like(probs)
    with on_device(grad):
        launch(*dynamic_backward_launch(grad.contiguous(), probs, sources, grads, dprobs,
                                        first))
    return dprobs


@dynamic_mix_backward.register_fake
def _(grad, probs, sources, grads, first=False):
    return torch.empty_like(probs)


# ---------------------------------------------------------------------------------------------
# Autograd, and the sources' gradients. Source m is read by the mixes of layers m..L-1. Left to
# autograd, each of them would return a fresh gradient for it and autograd would add them up:
# about 4 N bytes of traffic per (layer, source) pair, and many such tensors alive at once at
# depth. Instead every mix's backward adds its share into one buffer for the whole memory, grads
# (L, B, T, 2, G, hs) in the sources' dtype, and a source gets its gradient from the mix of its
# own layer only (layer 1's for layer 0, which has no router). That mix runs its backward last
# among the source's readers (every later layer depends on its output), so by then the sum is
# complete. The last layer's mix runs its backward first, and writes its shares rather than
# adding them, so a second backward through the same graph (retain_graph) starts afresh. This
# is right for backward passes through the whole model, the only use here; it is not a per-op
# gradient (autograd.grad of one layer's mix would miss the earlier sources), so a mix given a
# plain list, not the model's LayerMemory, keeps a buffer of its own and returns every source's
# gradient, as any op does. Compiled, the buffer must stay inside one graph: lime.py's model
# compiles with fullgraph=True while these kernels are on (NEEDS_ONE_GRAPH).
NEEDS_ONE_GRAPH = True


class LayerMemory(list):
    """lime.py's layer memory (every layer's raw keys/values, in order) with room for the buffer
    that its gradients are added into; GPT.forward makes one per forward while these kernels are
    in use."""

    def __init__(self, n_layer):
        super().__init__()
        self.n_layer, self.grad = n_layer, None


def gradient_buffer(memory):
    """The model's shared buffer for its memory's gradients (made at the first mix), or None.
    None too under torch.distributed: there torch.compile splits the model's graph at DDP's
    gradient buckets, and a buffer that the backward passes of several pieces write into cannot
    be split (AOTAutograd fails); each mix then keeps its own, and autograd adds them up."""
    if not torch.is_grad_enabled() or not isinstance(memory, LayerMemory) or distributed():
        return None
    if memory.grad is None:
        memory.grad = memory[0].new_zeros((memory.n_layer, *memory[0].shape))
    return memory.grad


def distributed():
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def setup_context(ctx, inputs, output):
    weights, sources, grads = inputs
    ctx.save_for_backward(weights, *sources)
    ctx.shared_grads = grads  # not a saved tensor: the backward passes of other layers write here


def backward_with(backward_op):
    def backward(ctx, grad):
        weights, *sources = ctx.saved_tensors
        S, shared = len(sources), ctx.shared_grads
        grads = shared if shared is not None else grad.new_zeros((S, *grad.shape))
        # The last layer reads every source: its mix is the first to run backward.
        first = shared is not None and S == len(shared)
        dweights = backward_op(grad, weights, sources, grads, first)
        if shared is None:
            return dweights, list(grads.unbind(0)), None
        # The own layer's source is the last; layer 0 has no router, so layer 1's mix (S = 2),
        # the last of source 0's readers to run backward, hands source 0 its gradient too.
        return dweights, [grads[m] if m == S - 1 or S == 2 else None for m in range(S)], None
    return backward


static_mix_op.register_autograd(backward_with(static_mix_backward), setup_context=setup_context)
dynamic_mix_op.register_autograd(backward_with(dynamic_mix_backward), setup_context=setup_context)


def static_mix(R, memory):
    """Static LIMe's mix: R (G, S*G), memory S tensors (B, T, 2, G, hs) -> (B, T, 2, G, hs)."""
    return static_mix_op(R, list(memory), gradient_buffer(memory))


def dynamic_mix(probs, memory):
    """Dynamic LIMe's mix: probs (B, T, G, S), memory S tensors (B, T, 2, G, hs)
    -> (B, T, 2, G, hs)."""
    return dynamic_mix_op(probs, list(memory), gradient_buffer(memory))


# lime.py asks the kernels in use for the training loss too: on a GPU, torch's own is the fastest.
cross_entropy = torch.nn.functional.cross_entropy


# ---------------------------------------------------------------------------------------------
# The self-check: what no CPU test can show (the compiled kernels, a GPU's bf16 arithmetic, the
# installed torch and triton), checked on the user's GPU before a run trusts the kernels.

def self_check(G, hs, dtype, device):
    """None if both mixes give, on device, what lime.py's plain mix gives in float32, else a
    line saying what differed. Three source layers of (1, 37, 2, G, hs) (an odd length, so tiles
    end part-full), with real autotuning: the output, every source's gradient and the router
    weights' gradient, at tolerances for dtype; the gradients must be added to the buffer exactly
    once (it is pre-filled with known values) and written, not added, by the first mix to run
    backward. The tile autotuned here is forgotten afterwards: the run tunes at its own shape."""
    try:
        return compare_with_plain(G, hs, dtype, torch.device(device))
    except Exception as e:  # a compile or launch failure, say: the plain mix still works
        return f"the self-check failed: {type(e).__name__}: {last_line(e)[:200]}"
    finally:
        for kernel in (static_mix_fwd_kernel, static_mix_bwd_kernel, dynamic_mix_fwd_kernel,
                       dynamic_mix_bwd_kernel):
            kernel.cache.clear()


def compare_with_plain(G, hs, dtype, device):
    S, shape = 3, (1, 37, 2, G, hs)
    gen = torch.Generator().manual_seed(0)  # its own: the run's random state is left alone
    sources = [torch.randn(shape, generator=gen).to(dtype).float() for _ in range(S)]
    R = torch.randn(G, S * G, generator=gen)
    probs = torch.randn(1, 37, G, S, generator=gen).softmax(-1)
    dout = torch.randn(shape, generator=gen).to(dtype).float()
    # float32 reads TF32 where torch allows it for its matmuls; 16-bit types round the output
    tolerance = {torch.float32: 5e-3, torch.float16: 5e-3}.get(dtype, 2e-2)
    mixes = {
        'static': (static_mix, R, lambda w, kv: w @ torch.cat(kv, dim=3)),
        'dynamic': (dynamic_mix, probs,
                    lambda w, kv: sum(x * w[:, :, None, :, m, None] for m, x in enumerate(kv))),
    }
    for name, (mix, weights, plain) in mixes.items():
        # the reference: lime.py's plain mix, in float32 on the CPU
        ref_weights = weights.clone().requires_grad_()
        ref_sources = [x.clone().requires_grad_() for x in sources]
        ref_out = plain(ref_weights, ref_sources)
        ref_out.backward(dout)
        for n_layer in (S, S + 1):  # the last layer's mix (writes), an earlier one's (adds)
            prefill = 0.5
            memory = LayerMemory(n_layer)
            memory.extend(x.to(device, dtype, copy=True).requires_grad_() for x in sources)
            memory.grad = torch.full((n_layer, *shape), prefill, device=device)
            w = weights.to(device, copy=True).requires_grad_()
            out = mix(w, memory)
            out.backward(dout.to(device, dtype))
            added = memory.grad[:S].cpu() - (0.0 if n_layer == S else prefill)
            checks = [('output', out, ref_out), ('weights\' gradient', w.grad, ref_weights.grad)]
            checks += [(f"source {m}'s gradient", added[m], ref_sources[m].grad)
                       for m in range(S)]
            for what, got, want in checks:
                error = relative_error(got, want)
                if not error <= tolerance:
                    return (f"the self-check of the {name} mix on {device} (G={G}, hs={hs}, "
                            f"{str(dtype).replace('torch.', '')}) found its {what} off by "
                            f"{error:.1e} (relative; allowed {tolerance:.0e})")
            if n_layer > S and not bool((memory.grad[S] == prefill).all()):
                return (f"the self-check of the {name} mix found a gradient slot changed that "
                        "it must not touch")
    return None


def relative_error(got, want):
    """max |got - want| over max |want|, in float32 on the CPU."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()
