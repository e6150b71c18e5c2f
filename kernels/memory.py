"""
kernels/memory.py: LIMe's mix over a head-major layer memory, in plain PyTorch and autograd, for
every device. The same numbers as lime.py's routers (tests/test_kernels.py holds the two together),
faster on a CPU at depth; it runs where asked for (fused=True: kernels.install), since lime.py's
definition is what every script runs, and on a GPU, compiled, the faster.

lime.py keeps the layer memory as a list of per-layer tensors (B, T, 2, G, hs), token-major: its
static mix copies the whole memory so far into head-major rows (torch.cat) at every layer, then
mixes them with one matrix product. Here, as in the LIMe authors' code, the memory is one buffer
with a row per (layer, kv head) and a column per (batch*time, key or value, channel):

    rows (L, G, B, T, 2, hs)    viewed as a matrix (L*G, N'),  N' = B*T*2*hs

Forward. A layer's keys/values are copied into its G rows once, by the first mix after it, and the
mix of layer l reads the rows of layers 0..l in place (S = l + 1 of them):
- static: out = R (G, S*G) @ rows[:S] (S*G, N'), one matrix product;
- dynamic: out[gt] = sum_m probs[gt, m] * rows[m, gt], for every (kv head, token) gt.

Backward. A source m is read by the mixes of layers max(m, 1)..L-1. Rather than each of them
returning a share of its gradient for autograd to add up, they add their shares into one gradient
of the whole memory, in place: R^T @ dout (static), probs * dout (dynamic). That gradient travels
through autograd itself: every mix returns, besides its output, the memory so far as a tensor
(`chain`), and takes the one before as an input, so autograd hands the memory's gradient from each
mix to the one before it, like any other gradient. When mix l's backward runs, every mix after it
has run (autograd runs a node only once everything that used its outputs has), so the rows of the
sources it wrote are finished: it returns them as those sources' gradients and passes the rows
before them on. A backward pass that starts below the last layer (a loss on an earlier block, or
autograd.grad of one), a second one (retain_graph), two forwards before one backward, a pass that
fails half-way: each pass makes its own gradient, as autograd does for every tensor.

What autograd is not told: the rows are written through `.data` (write_rows), so that it does not
take a later layer's rows, written after an earlier mix saved the buffer, for a change to what that
mix saved. They are not one: a mix reads the rows of its own and earlier layers only, every one of
them written before it runs, and no row is written twice (a block run again for activation
checkpointing finds its rows written and writes nothing).

torch.compile does not trace a mix (torch.compiler.disable): a graph break at each routed layer,
the mix running as in eager mode between the compiled pieces. Bytes moved per layer are counted in
docs/performance.md.
"""
import math

import torch
from torch.autograd.function import once_differentiable



class LayerMemory:
    """The layer memory that GPT.forward makes once kernels.install has run, indexed by layer as
    lime.py's list is: CausalSelfAttention sets memory[l] to its keys/values (B, T, 2, G, hs) and
    hands its router memory[:l + 1]; the mixes copy them into one head-major buffer."""

    def __init__(self, n_layer):
        self.n_layer = n_layer
        self.sources = [None] * n_layer  # each layer's keys/values, until a mix writes them
        self.rows = None  # (L, G, B, T, 2, hs), made by the first mix
        self.written = 0  # the rows of layers 0..written-1 hold their keys/values
        self.chain = None  # the last mix's memory output: the next mix's memory input

    def __setitem__(self, layer, kv):
        self.sources[layer] = kv

    def __getitem__(self, layers):
        """memory[:S], the layers a router reads: this memory itself (a mix knows S from its
        router's weights)."""
        assert layers.start is None and layers.step is None, "a router reads layers 0..l"
        return self

    def write_rows(self, S):
        """Copy the sources of layers written..S-1 into their rows (making the buffer at the
        first call); returns them: the sources whose gradient the mix of layer S-1 returns."""
        first = min(self.written, S)
        sources = self.sources[first:S]
        if self.rows is None:
            B, T, _, G, hs = sources[0].shape
            self.rows = sources[0].new_empty(self.n_layer, G, B, T, 2, hs)
        for layer, kv in enumerate(sources, start=first):
            # Through .data: autograd's version check would take this write for a change to the
            # buffer that earlier mixes saved for their backward (the module's docstring).
            self.rows.data[layer] = head_major(kv.detach())
        # The rows hold them now (and a block run again finds its rows written): let them go.
        self.sources[:S] = [None] * S
        self.written = max(self.written, S)
        return sources


def head_major(kv):
    """(B, T, 2, G, hs) -> (G, B, T, 2, hs): a source's rows of the memory (a view)."""
    return kv.permute(3, 0, 1, 2, 4)


def token_major(rows):
    """(G, B, T, 2, hs) -> (B, T, 2, G, hs), the sources' layout (a view)."""
    return rows.permute(1, 2, 3, 0, 4)


class Mix(torch.autograd.Function):
    """One layer's mix, static or dynamic (`how`: STATIC or DYNAMIC below), over rows 0..S-1.
    Inputs: the router's weights; the memory so far as the mix before left it (its `chain`
    output, None at the first mix); the sources this mix writes into the memory, one argument
    each (autograd sees only tensors passed as arguments). Outputs: the mix (G, B, T, 2, hs) and
    the memory after it (the `chain` of the next mix: rows 0..S-1 as autograd sees them, a tensor
    that holds no numbers of its own)."""

    @staticmethod
    def forward(ctx, how, memory, S, weights, chain, *sources):
        ctx.set_materialize_grads(False)  # no gradient for an output: None, not a tensor of zeros
        first = S - len(sources)
        rows = memory.rows
        out = how.forward(weights, rows[:S])
        ctx.save_for_backward(weights, rows)
        ctx.how = how
        ctx.S = S
        ctx.first = first
        ctx.chain_rows = None if chain is None else chain.shape[0]
        return out, rows.new_empty(()).expand(S, *rows.shape[1:])

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dmemory):
        weights, rows = ctx.saved_tensors
        S = ctx.S
        # The memory's gradient, rows 0..S-1, with the shares of every later mix added; None where
        # no later mix ran in this backward pass (this is the last layer, or the loss is here).
        if dmemory is None:
            dmemory = rows.new_zeros(S, *rows.shape[1:])
        dweights = None
        if dout is not None:
            dout = dout.contiguous()
            dweights = ctx.how.backward(dout, weights, rows[:S], dmemory)  # adds into dmemory
        # The rows of the sources this mix wrote are finished: their gradients, as views.
        dsources = [token_major(dmemory[m]) for m in range(ctx.first, S)]
        dchain = None if ctx.chain_rows is None else dmemory[:ctx.chain_rows]
        return None, None, None, dweights, dchain, *dsources


@torch.compiler.disable  # a graph break: torch.compile runs the mix as eager code
def mix(how, weights, memory, S):
    """Layer S-1's mix, (G, B, T, 2, hs), with its weights (already in the memory's dtype)."""
    sources = memory.write_rows(S)
    # In the memory's dtype, whatever autocast would choose: the weights are cast to it already
    with torch.autocast(memory.rows.device.type, enabled=False):
        out, memory.chain = Mix.apply(how, memory, S, weights, memory.chain, *sources)
    return out


# ---------------------------------------------------------------------------------------------
# static: out = R (G, S*G) @ rows[:S] (S*G, N')


class STATIC:
    @staticmethod
    def forward(R, rows):
        S, G = rows.shape[:2]
        return (R @ rows.view(S * G, -1)).view(rows.shape[1:])

    @staticmethod
    def backward(dout, R, rows, dmemory):
        """R's gradient; adds R^T @ dout, every source's share, into dmemory (S, G, B, T, 2, hs)."""
        S, G = rows.shape[:2]
        dout = dout.view(G, -1)
        # Source m's share, R_m^T (G, G) @ dout, for every m at once: a batch of S products.
        # (As one product R^T (S*G, G) @ dout, a CPU ran 3-4x slower: so few columns in R^T.)
        R_t = R.t().view(S, G, G)  # R_t[m] = R_m^T, R_m = R[:, m*G:(m+1)*G]
        dmemory.view(S, G, -1).baddbmm_(R_t, dout.expand(S, G, -1))
        # R's gradient, dout @ rows^T, as products over pieces of the columns, added up: in one
        # piece, a product of so few rows over so many columns ran at half the speed on a CPU
        n = column_pieces(rows)
        pieces = rows.view(S * G, n, -1).permute(1, 2, 0)  # (n, columns / n, S*G)
        return torch.bmm(dout.view(G, n, -1).transpose(0, 1), pieces).sum(0)


def column_pieces(rows):
    """How many pieces R's gradient cuts the memory's columns into: whole tokens, about 1,024
    columns each (on a CPU 10-20% faster than a piece per sequence, 2x faster than one piece)."""
    S, G, B, T, _, hs = rows.shape
    tokens = math.gcd(B * T, max(1, 512 // hs))
    return B * T // tokens


def static_mix(R, memory):
    """lime.StaticRouter's mix: R (G, S*G), memory S tensors (B, T, 2, G, hs) -> (B, T, 2, G, hs),
    a view of the mix's head-major output."""
    memory = as_layer_memory(memory)
    S = R.shape[1] // R.shape[0]
    return token_major(mix(STATIC, R.to(memory_dtype(memory)), memory, S))


# ---------------------------------------------------------------------------------------------
# dynamic: out[gt] = sum_m p[gt, m] * rows[m, gt], for each (kv head, token) gt


class DYNAMIC:
    @staticmethod
    def forward(p, rows):
        return mix_rows(p, rows).view(rows.shape[1:])

    @staticmethod
    def backward(dout, p, rows, dmemory):
        """p's gradient (G*B*T, S); adds p[:, m] * dout, source m's share, into dmemory[m]."""
        S, G, B, T, _, hs = rows.shape
        dout = dout.view(G * B * T, 2 * hs)
        for m in range(S):
            dmemory[m].view(G * B * T, 2 * hs).addcmul_(dout, p[:, m, None])
        # each probability's gradient: its source's row . dout, for every (head, token)
        return torch.bmm(token_rows(rows), dout.unsqueeze(2)).view(G * B * T, S)


def per_row(probs):
    """(B, T, G, S) -> (G*B*T, S): each (head, token)'s weights, in the memory's row order."""
    B, T, G, S = probs.shape
    return probs.permute(2, 0, 1, 3).reshape(G * B * T, S)


def token_rows(rows):
    """rows (S, G, B, T, 2, hs) as (G*B*T, S, 2*hs): each (head, token)'s S sources, a view
    (the batched product reads them through strides, as fast as a copy would be)."""
    S, G, B, T, _, hs = rows.shape
    return rows.view(S, G * B * T, 2 * hs).transpose(0, 1)


def mix_rows(p, rows):
    """sum_m p[:, m] * rows[m], for each (head, token): p (G*B*T, S), rows (S, G, B, T, 2, hs)
    -> (G*B*T, 2*hs). As one batched product of (1 x S) @ (S x 2*hs) where those matrices hold
    512 numbers or more; below that, CPU's batched product ran 3.5-6.5x slower than a weighted
    sum, source by source (and 1.5-2x faster above it; one thread, 4 kv heads, 8 x 128 tokens)."""
    S = p.shape[1]
    if S * 2 * rows.shape[-1] >= 512:
        return torch.bmm(p.unsqueeze(1), token_rows(rows)).squeeze(1)
    rows = rows.view(S, p.shape[0], -1)  # each source's rows, (G*B*T, 2*hs)
    p = p.t().contiguous()  # each source's weights in a row of their own, read in order
    out = rows[0] * p[0, :, None]
    for m in range(1, S):
        out.addcmul_(rows[m], p[m, :, None])
    return out


def dynamic_mix(probs, memory):
    """lime.DynamicRouter's mix: probs (B, T, G, S), memory S tensors (B, T, 2, G, hs)
    -> (B, T, 2, G, hs), a view of the mix's head-major output."""
    memory = as_layer_memory(memory)
    S = probs.shape[-1]
    p = per_row(probs.to(memory_dtype(memory)))  # (G*B*T, S), a copy that autograd sees
    return token_major(mix(DYNAMIC, p, memory, S))


# ---------------------------------------------------------------------------------------------
# What the two mixes share


def as_layer_memory(memory):
    """memory as a LayerMemory; a plain list (a router called on its own, as the walkthrough and
    the exercises call one) gets a memory of its own, whose one mix writes every source."""
    if isinstance(memory, LayerMemory):
        return memory
    sources = list(memory)
    layer_memory = LayerMemory(len(sources))
    layer_memory.sources = sources
    return layer_memory


def memory_dtype(memory):
    """The dtype of the keys/values (bf16 under autocast): the mix's weights are cast to it."""
    if memory.rows is not None:
        return memory.rows.dtype
    return memory.sources[0].dtype


# ---------------------------------------------------------------------------------------------
# The self-check: what no CPU test can show (a GPU's arithmetic, the installed torch), checked on
# the user's GPU at the run's shape before a run trusts this module (kernels.install). The mix
# is never compiled (a graph break), so its eager run here, under the run's autocast, is the code
# a run runs; it cannot see the compiled pieces around it (lab/bench.py times those).

def self_check(G, hs, dtype, device):
    """None if both mixes give on device what the plain definition gives in float32 on the CPU,
    else a line saying what differed: a chain of layers of (1, 37, 2, G, hs) keys/values, each
    layer's made from the mix before it (so the backward passes run in a model's order), deep
    enough that the dynamic mix takes both of mix_rows' ways; the outputs, every source's
    gradient and the routers' weights' gradients, at tolerances for dtype. float32 products run in
    full float32 while it checks (not TF32), whatever the run allows; its setting is restored."""
    # What the check is after is the mix's arithmetic. train.py lets float32 products on CUDA use
    # TF32 (configurator.configure), whose own rounding through the check's 34 layers (4 kv heads
    # of size 8) reached the float32 tolerance: 5.1e-3 against 5e-3 on an H100 (2026-11-27).
    # Under bf16 autocast the mix's products are in bf16, where TF32 does not enter.
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return compare_with_plain(G, hs, dtype, torch.device(device))
    except Exception as e:  # an error on this device: the plain mix still works
        lines = [line for line in str(e).splitlines() if line.strip()] or ['']
        return f"the self-check failed: {type(e).__name__}: {lines[-1].strip()[:200]}"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32  # even where the check raised


def plain_static(R, memory):
    return R @ torch.cat(list(memory), dim=3)


def plain_dynamic(probs, memory):
    return sum(kv * probs[:, :, None, :, m, None] for m, kv in enumerate(memory))


def chain_of_layers(mix_fn, weights, leaves, memory):
    """Layers 1..L-1 of a memory of L = len(leaves) layers, layer l's source leaves[l] plus half
    the mix before it (half: at depth, rounding would compound); returns every layer's output."""
    memory[0] = leaves[0]
    memory[1] = leaves[1]
    outs = []
    for layer in range(1, len(leaves)):
        if layer > 1:
            memory[layer] = leaves[layer] + 0.5 * outs[-1]
        outs.append(mix_fn(weights[layer - 1], memory[:layer + 1]))
    return outs


def compare_with_plain(G, hs, dtype, device):
    L = max(3, 512 // (2 * hs) + 2)  # the dynamic mix's last layers take the batched product
    shape = (1, 37, 2, G, hs)
    gen = torch.Generator().manual_seed(0)  # its own: the run's random state is left alone
    leaves = [torch.randn(shape, generator=gen).to(dtype).float() for _ in range(L)]
    douts = [torch.randn(shape, generator=gen).to(dtype).float() for _ in range(L - 1)]
    weights = {'static': [torch.randn(G, S * G, generator=gen) for S in range(2, L + 1)],
               'dynamic': [torch.randn(1, 37, G, S, generator=gen).softmax(-1)
                           for S in range(2, L + 1)]}
    # float32 (in full float32: self_check) at 5e-3, which a mix 1% off fails; 16-bit types round
    # the output, and each later layer's share of a gradient once more as it is added (by the
    # definition too): random roundings, growing as the square root of their number
    tolerance = 5e-3 if dtype in (torch.float32, torch.float16) else 2e-2
    if dtype != torch.float32:
        tolerance *= math.sqrt(L / 3)
    autocast = torch.autocast(device.type, dtype, enabled=dtype != torch.float32)
    for name, (fast, plain) in {'static': (static_mix, plain_static),
                                'dynamic': (dynamic_mix, plain_dynamic)}.items():
        results = []
        for mix_fn, dev, dt in ((plain, 'cpu', torch.float32), (fast, device, dtype)):
            w = [x.to(dev, copy=True).requires_grad_() for x in weights[name]]
            xs = [x.to(dev, dt, copy=True).requires_grad_() for x in leaves]
            memory = [None] * L if mix_fn is plain else LayerMemory(L)
            with autocast if mix_fn is fast else torch.autocast('cpu', enabled=False):
                outs = chain_of_layers(mix_fn, w, xs, memory)
            loss = sum((out.float() * d.to(dev)).sum() for out, d in zip(outs, douts))
            loss.backward()
            results.append([outs[-1], *(x.grad for x in w + xs)])
        what = ['output', *(f"layer {l}'s weights' gradient" for l in range(1, L)),
                *(f"source {m}'s gradient" for m in range(L))]
        for thing, got, want in zip(what, results[1], results[0]):
            error = relative_error(got, want)
            if not error <= tolerance:
                return (f"the self-check of the {name} mix on {device} (G={G}, hs={hs}, "
                        f"{str(dtype).replace('torch.', '')}, {L} layers) found its {thing} off "
                        f"by {error:.1e} (relative; allowed {tolerance:.1e})")
    return None


def relative_error(got, want):
    """max |got - want| over max |want|, in float32 on the CPU."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()
