"""
kernels/memory.py: LIMe's mix over a head-major layer memory, in plain PyTorch, for every device.
The same numbers as lime.py's routers (tests/test_kernels.py holds the two together), faster:
lime.use_fused_kernels picks this module by default (fused=None), on a CPU and on a GPU.

lime.py keeps the layer memory as a list of per-layer tensors (B, T, 2, G, hs), token-major: a
static mix is then a batch of B*T*2 tiny (G x S*G) @ (S*G x hs) products, and torch.cat copies
the whole memory at every layer. Here, as in the LIMe authors' code, the memory is one buffer
with a row per (layer, kv head) and a column per (batch*time, key or value, channel):

    memory (L, G, B, T, 2, hs)    viewed as a matrix (L*G, N'),  N' = B*T*2*hs

Each layer copies its raw keys/values into its rows once, and its mix reads the rows of layers
0..l in place:
- static: out = R (G, S*G) @ memory[:S*G] (S*G, N'): one matrix product per layer.
- dynamic: out[gt] = probs[gt] (1, S) @ memory[:S, gt] (S, 2*hs) for every (head, token) gt: one
  batched product per layer, reading the memory through strides, or where those matrices are
  small, a weighted sum of the S sources' rows (mix_rows: whichever a CPU runs faster).

The backward pass. A source m is read by the mixes of layers max(m, 1)..L-1, and left to autograd
each of them would return a fresh gradient for it, to be added up (and kept alive) at depth.
Instead each mix's backward writes its output's gradient into its rows of one more buffer
(`grads`), and a source's gradient is computed once, by the mix that owns it (its own layer's;
layer 1's for layer 0, which has no router), as one product over the rows of every later layer,
the transpose of the forward's:
- static: d memory_m = sum_{l >= m} R_l[:, m]^T @ dout_l  (the R_l of every layer in `weights`)
- dynamic: d memory_m[gt] = sum_{l >= m} probs_l[gt, m] * dout_l[gt]  (every probs_l in `weights`)
That mix runs its backward last among the source's readers (each later layer's output depends on
its own), so every later row of `grads` is written by then. Nothing is added up in place, so a
second backward through the same graph (retain_graph) simply writes the rows again.

Each mix is one `torch.library` custom op (one node in a compiled graph, so compile time grows with
the depth, not its square); outside torch.compile the same functions run through one
autograd.Function (Mix), without the dispatcher's cost. The ops write the memory's and the
gradients' rows without declaring it: declared, torch.compile would copy the whole buffer at every
layer to keep its graph functional. That is safe because every read of a row comes after its write
in the graph's own data order (layer l's mix reads rows written by layers <= l, which its input
depends on; a source's gradient reads rows of later layers, whose backward its input depends on),
and because the buffers come from an op of their own (`new_buffers`) that the compiler can neither
see into nor recompute in the backward pass. A mix given a plain list (the walkthrough's, the
exercises') or run under DDP (whose compiled graph pieces could not share the gradient rows) keeps a
memory of its own and returns every source's gradient, as any op does.

Bytes moved per layer are counted in docs/performance.md.
"""
import math
from typing import Optional

import torch

from kernels.loss import cross_entropy  # noqa: F401  (lime.py asks the switch's module for it)
from lime import last_line  # lime imports kernels only inside a function


class LayerMemory:
    """The layer memory that GPT.forward makes while this module is in use. CausalSelfAttention
    appends each layer's keys/values (B, T, 2, G, hs) as to lime.py's list; the first mix makes
    the buffers, and each mix copies into them the sources appended since the last one.
    shared: keep every layer's output gradient rows, for the sources' one-pass gradients."""

    def __init__(self, n_layer, shared=True):
        self.n_layer = n_layer
        self.shared = shared
        self.sources = []  # the appended tensors, layer by layer (None once written, mostly)
        self.written = 0  # how many of them are in `memory` already
        self.memory = None  # (L, G, B, T, 2, hs)
        self.weights = None  # every layer's R (static) or probabilities (dynamic), or None
        self.grads = None  # the output gradients of layers 1..L-1, or None

    def append(self, kv):
        self.sources.append(kv)

    def __len__(self):
        return len(self.sources)

    def keeps_every_source(self):
        """Whether each mix returns every source's gradient (no shared gradient rows, and a
        backward pass to come): then each mix takes all the sources."""
        return self.grads is None and torch.is_grad_enabled()

    def owned_sources(self):
        """(first, sources): the sources whose gradient this mix returns, layers first..l: those
        it writes into the memory, where the gradient rows are shared (each then gets its
        finished gradient there), else all of them."""
        first = 0 if self.keeps_every_source() else self.written
        return first, self.sources[first:]

    def mark_written(self):
        """After a mix: the sources it wrote live on in the memory. They are let go of here, so
        that they are freed, unless every mix takes them all."""
        if not self.keeps_every_source():
            self.sources[self.written:] = [None] * (len(self.sources) - self.written)
        self.written = len(self.sources)

    def prepare(self, router):
        """Make the buffers, at the first mix: no gradient rows where no backward pass will run
        (inference), nor under DDP (see the module's docstring)."""
        if self.memory is not None:
            return
        B, T, _, G, hs = self.sources[0].shape
        L = self.n_layer
        memory = (L, G, B, T, 2, hs)
        if self.shared and torch.is_grad_enabled() and not distributed():
            # static: layer l's R in rows (l-1)*G..l*G - 1 and its S*G first columns;
            # dynamic: layer l's probabilities (G*B*T, S) side by side (packed_columns)
            weights = {'static': ((L - 1) * G, L * G),
                       'dynamic': (G * B * T, packed_columns(L))}[router]
            self.memory, self.weights, self.grads = new_buffers(self.sources[0].detach(), memory,
                                                                weights)
        else:
            self.memory, = new_buffers(self.sources[0].detach(), memory, None)


def distributed():
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def head_major(kv):
    """(B, T, 2, G, hs) -> (G, B, T, 2, hs): a source's rows of the memory (a view)."""
    return kv.permute(3, 0, 1, 2, 4)


def token_major(rows):
    """(G, B, T, 2, hs) -> (B, T, 2, G, hs), the sources' layout (a view)."""
    return rows.permute(1, 2, 3, 0, 4)


# ---------------------------------------------------------------------------------------------
# The buffers


@torch.library.custom_op('lime::new_buffers', mutates_args=(),
                         tags=[torch.Tag.nondeterministic_seeded])
def new_buffers(like: torch.Tensor, memory: list[int],
                weights: Optional[list[int]]) -> list[torch.Tensor]:
    """Uninitialised buffers like `like`'s dtype and device: the memory; with a weights shape,
    also the weights and the gradient rows, empty until the backward pass needs them
    (gradient_rows). One op of its own, tagged as random, so that torch.compile keeps the very
    tensors that the mixes write for the backward pass, rather than making new empty ones there
    (or one tensor of two alike)."""
    shapes = [memory] if weights is None else [memory, weights, [0]]
    return [like.new_empty(shape) for shape in shapes]


@new_buffers.register_fake
def _(like, memory, weights):
    shapes = [memory] if weights is None else [memory, weights, [0]]
    return [like.new_empty(shape) for shape in shapes]


def write(buffer, index, value):
    """buffer[index] = value, out of autograd's sight. The mixes save the buffers for the backward
    pass before later layers write into them; autograd would take that for a change to a saved
    tensor. It is not one: no row is written after a mix has read it (the module's docstring)."""
    with torch.autograd._unsafe_preserve_version_counter(buffer):
        buffer[index] = value


def gradient_rows(grads, memory):
    """The output gradients of layers 1..L-1 (layer 0 has no mix): (L - 1, G, B, T, 2, hs), made
    by the first backward pass through the mixes (the last layer's), not at the forward pass, so
    that they do not wait in memory meanwhile."""
    if grads.numel() == 0:
        with torch.autograd._unsafe_preserve_version_counter(grads):
            grads.resize_((memory.shape[0] - 1, *memory.shape[1:]))
    return grads


def write_sources(sources, memory, first, written):
    """Copy sources[k] (layer first + k) into the memory's rows, for the layers not written yet."""
    for layer in range(written, first + len(sources)):
        write(memory, layer, head_major(sources[layer - first]))


# ---------------------------------------------------------------------------------------------
# Autograd: both mixes take (router weights, sources, memory, weights, grads, first, written)


def save(ctx, inputs, keep_weights):
    mix_weights, sources, memory, weights, grads, first, written = inputs
    # Saved tensors, so that a backward pass frees them (a second one needs retain_graph). The
    # writes of later layers into them happen inside the ops, out of autograd's sight: they do
    # not count as changes to what was saved.
    ctx.save_for_backward(mix_weights if keep_weights else None, memory, weights, grads)
    ctx.first, ctx.S = first, first + len(sources)


def static_setup(ctx, inputs, output):
    save(ctx, inputs, keep_weights=True)


def dynamic_setup(ctx, inputs, output):
    # With shared gradient rows the probabilities are in `weights` already: not kept twice.
    save(ctx, inputs, keep_weights=inputs[3] is None)


def mix_backward(backward, ctx, dout):
    """The router weights' gradient and the owned sources' (a list), by a mix's backward."""
    mix_weights, memory, weights, grads = ctx.saved_tensors
    dweights, *dsources = backward(dout, mix_weights, memory, weights, grads, ctx.first, ctx.S)
    return dweights, dsources


def backward_with(backward_op):
    """The backward of a mix's custom op, by its backward op."""
    def backward(ctx, dout):
        dweights, dsources = mix_backward(backward_op, ctx, dout)
        return dweights, dsources, None, None, None, None, None
    return backward


class Mix(torch.autograd.Function):
    """A mix outside torch.compile: the custom op's own forward and backward functions, called
    directly. Through the dispatcher, a custom op's call and its backward cost 0.3-0.7 ms a layer
    and step on a CPU (docs/performance.md), which made this module slower than the definition at
    small shapes; the compiler needs the op (one node), eager autograd does not. The sources come
    last, one argument each: autograd sees only tensors passed as arguments."""

    @staticmethod
    def forward(ctx, kind, mix_weights, memory, weights, grads, first, written, *sources):
        forward, ctx.backward_function, setup = kind
        inputs = (mix_weights, list(sources), memory, weights, grads, first, written)
        out = forward(*inputs)
        setup(ctx, inputs, out)
        return out

    @staticmethod
    def backward(ctx, dout):
        dweights, dsources = mix_backward(ctx.backward_function, ctx, dout)
        return None, dweights, None, None, None, None, None, *dsources


def run(op, kind, mix_weights, sources, memory, weights, grads, first, written):
    """A mix: its custom op where torch.compile traces, else Mix with the same functions."""
    if torch.compiler.is_compiling():
        return op(mix_weights, sources, memory, weights, grads, first, written)
    return Mix.apply(kind, mix_weights, memory, weights, grads, first, written, *sources)


# ---------------------------------------------------------------------------------------------
# static: out = R (G, S*G) @ memory[:S*G] (S*G, N')


def static_forward(R: torch.Tensor, sources: list[torch.Tensor], memory: torch.Tensor,
                   weights: Optional[torch.Tensor], grads: Optional[torch.Tensor], first: int,
                   written: int) -> torch.Tensor:
    """Layer S-1's mix (S = first + len(sources)), (G, B, T, 2, hs), after writing the sources
    not yet in the memory, and R into `weights`. grads: for the backward pass only."""
    S = first + len(sources)
    G = memory.shape[1]
    write_sources(sources, memory, first, written)
    if weights is not None:
        write(weights, (slice((S - 2) * G, (S - 1) * G), slice(0, S * G)), R)
    return (R @ memory[:S].view(S * G, -1)).view(memory.shape[1:])


def static_backward(dout: torch.Tensor, R: torch.Tensor, memory: torch.Tensor,
                    weights: Optional[torch.Tensor], grads: Optional[torch.Tensor],
                    first: int, S: int) -> list[torch.Tensor]:
    """[R's gradient, then the gradients of sources first..S-1, (B, T, 2, G, hs) each]."""
    L, G = memory.shape[:2]
    if grads is None:  # a memory of its own: R^T @ dout is every source's share, and all of it
        dout = dout.contiguous().view(G, -1)
        shares = (R.t() @ dout).view(S, *memory.shape[1:]).unbind(0)
    else:
        grads = gradient_rows(grads, memory)
        write(grads, S - 2, dout)  # this layer's rows of the output gradients
        dout = grads[S - 2].view(G, -1)
        grad_rows = grads.view((L - 1) * G, -1)
        shares = []
        for m in range(first, S):
            # the rows of layers max(m, 1)..L-1, in `weights` and in `grads` alike
            readers = slice((max(m, 1) - 1) * G, (L - 1) * G)
            column = weights[readers, m * G:(m + 1) * G]  # their R_l[:, m's heads]
            shares.append((column.t() @ grad_rows[readers]).view(memory.shape[1:]))
    # R's gradient, dout @ memory[:S*G]^T, as products over pieces of the columns, added up: in
    # one piece, a product of so few rows over so many columns ran at half the speed on a CPU
    n = column_pieces(memory)
    rows = memory[:S].view(S * G, n, -1).permute(1, 2, 0)  # (n, columns / n, S*G)
    dR = torch.bmm(dout.view(G, n, -1).transpose(0, 1), rows).sum(0)
    return [dR] + [token_major_copy(share) for share in shares]


def column_pieces(memory):
    """How many pieces R's gradient cuts the memory's columns into: whole tokens, about 1,024
    columns each (on a CPU 10-20% faster than a piece per sequence, 2x faster than one piece)."""
    L, G, B, T, _, hs = memory.shape
    tokens = math.gcd(B * T, max(1, 512 // hs))
    return B * T // tokens


# The ops that torch.compile sees: the functions above, each with a "fake" one that makes only
# its outputs' shapes, for tracing. Inductor caches what it compiled on disk, and after an edit of
# a fake function alone it reused a graph made with the old shapes: clear its cache then
# (rm -rf /tmp/torchinductor_$USER).
static_mix_op = torch.library.custom_op('lime::static_mix', static_forward, mutates_args=())
static_mix_backward = torch.library.custom_op('lime::static_mix_backward', static_backward,
                                              mutates_args=())
STATIC = static_forward, static_backward, static_setup


@static_mix_op.register_fake
def _(R, sources, memory, weights, grads, first, written):
    return memory.new_empty(memory.shape[1:])


@static_mix_backward.register_fake
def _(dout, R, memory, weights, grads, first, S):
    return [torch.empty_like(R)] + [token_major_fake(memory) for _ in range(S - first)]


static_mix_op.register_autograd(backward_with(static_mix_backward), setup_context=static_setup)


def static_mix(R, memory):
    """lime.StaticRouter's mix: R (G, S*G), memory S tensors (B, T, 2, G, hs) -> (B, T, 2, G, hs),
    a view of the mix's head-major output."""
    memory = as_layer_memory(memory, 'static')
    first, sources = memory.owned_sources()
    buffers = memory.memory, memory.weights, memory.grads
    out = run(static_mix_op, STATIC, R.to(memory.memory.dtype), sources, *buffers, first,
              memory.written)
    memory.mark_written()
    return token_major(out)


# ---------------------------------------------------------------------------------------------
# dynamic: out[gt] = probs[gt] (1, S) @ memory[:S, gt] (S, 2*hs), for each (head, token) gt


def per_row(probs):
    """(B, T, G, S) -> (G*B*T, S): each (head, token)'s weights, in the memory's row order."""
    B, T, G, S = probs.shape
    return probs.permute(2, 0, 1, 3).reshape(G * B * T, S)


def token_rows(rows, S):
    """rows[:S] (S, G, B, T, 2, hs) as (G*B*T, S, 2*hs): each (head, token)'s S sources, a view
    (the batched product reads them through strides, as fast as a copy would be)."""
    L, G, B, T, _, hs = rows.shape
    return rows[:S].view(S, G * B * T, 2 * hs).transpose(0, 1)


def mix_rows(p, rows):
    """sum_m p[:, m] * rows[m], for each (head, token): p (G*B*T, n), rows (n, G, B, T, 2, hs)
    -> (G*B*T, 2*hs). As one batched product of (1 x n) @ (n x 2*hs) where those matrices hold
    512 numbers or more; below that, CPU's batched product ran 3.5-6.5x slower than a weighted
    sum, source by source (and 1.5-2x faster above it; one thread, 4 kv heads, 8 x 128 tokens)."""
    n = p.shape[1]
    if n * 2 * rows.shape[-1] >= 512:
        return torch.bmm(p.unsqueeze(1), token_rows(rows, n)).squeeze(1)
    rows = rows.view(n, p.shape[0], -1)  # each source's rows, (G*B*T, 2*hs)
    p = p.t().contiguous()  # each source's weights in a row of their own, read in order
    out = rows[0] * p[0, :, None]
    for m in range(1, n):
        out.addcmul_(rows[m], p[m, :, None])
    return out


def packed_columns(L):
    """The columns of the dynamic weights: S = l + 1 for each layer l >= 1, side by side."""
    return L * (L + 1) // 2 - 1


def first_column(layer):
    """Where layer l's S = l + 1 probabilities start among the packed columns."""
    return layer * (layer + 1) // 2 - 1


def reader_columns(L, m, device):
    """The packed columns of source m's probabilities in the layers that read it, max(m, 1)..L-1."""
    readers = torch.arange(max(m, 1), L, device=device)
    return first_column(readers) + m


def dynamic_forward(p: torch.Tensor, sources: list[torch.Tensor], memory: torch.Tensor,
                    weights: Optional[torch.Tensor], grads: Optional[torch.Tensor], first: int,
                    written: int) -> torch.Tensor:
    """Layer S-1's mix, (G, B, T, 2, hs), of each (head, token)'s sources by its probabilities p
    (G*B*T, S), after writing the sources not yet in the memory, and p into `weights`."""
    S = first + len(sources)
    write_sources(sources, memory, first, written)
    if weights is not None:
        start = first_column(S - 1)
        write(weights, (slice(None), slice(start, start + S)), p)
    return mix_rows(p, memory[:S]).view(memory.shape[1:])


def dynamic_backward(dout: torch.Tensor, p: Optional[torch.Tensor], memory: torch.Tensor,
                     weights: Optional[torch.Tensor], grads: Optional[torch.Tensor],
                     first: int, S: int) -> list[torch.Tensor]:
    """[p's gradient (G*B*T, S), then the gradients of sources first..S-1, (B, T, 2, G, hs) each].
    p: only without shared gradient rows (with them, `weights` holds it)."""
    L, G, B, T, _, hs = memory.shape
    BT = B * T
    if grads is None:  # a memory of its own: each source's share is its probability times dout
        dout = dout.contiguous().view(G * BT, 1, 2 * hs)
        shares = torch.bmm(p.unsqueeze(2), dout)  # (G*B*T, S, 2*hs)
        shares = [shares[:, m].view(memory.shape[1:]) for m in range(S)]
    else:
        grads = gradient_rows(grads, memory)
        write(grads, S - 2, dout)  # this layer's rows of the output gradients
        dout = grads[S - 2].view(G * BT, 1, 2 * hs)
        shares = []
        for m in range(first, S):
            # the probabilities for source m of layers max(m, 1)..L-1 (G*B*T, n), and their rows
            pm = weights.index_select(1, reader_columns(L, m, memory.device))
            shares.append(mix_rows(pm, grads[max(m, 1) - 1:]).view(memory.shape[1:]))
    # each probability's gradient: its source's row . dout, for every (head, token)
    dp = torch.bmm(token_rows(memory, S), dout.transpose(1, 2))  # (G*B*T, S, 1)
    return [dp.view(G * BT, S)] + [token_major_copy(share) for share in shares]


dynamic_mix_op = torch.library.custom_op('lime::dynamic_mix', dynamic_forward, mutates_args=())
dynamic_mix_backward = torch.library.custom_op('lime::dynamic_mix_backward', dynamic_backward,
                                               mutates_args=())
DYNAMIC = dynamic_forward, dynamic_backward, dynamic_setup


@dynamic_mix_op.register_fake
def _(p, sources, memory, weights, grads, first, written):
    return memory.new_empty(memory.shape[1:])


@dynamic_mix_backward.register_fake
def _(dout, p, memory, weights, grads, first, S):
    L, G, B, T, _, hs = memory.shape
    return [memory.new_empty(G * B * T, S)] + [token_major_fake(memory) for _ in range(S - first)]


dynamic_mix_op.register_autograd(backward_with(dynamic_mix_backward), setup_context=dynamic_setup)


def dynamic_mix(probs, memory):
    """lime.DynamicRouter's mix: probs (B, T, G, S), memory S tensors (B, T, 2, G, hs)
    -> (B, T, 2, G, hs), a view of the mix's head-major output."""
    memory = as_layer_memory(memory, 'dynamic')
    first, sources = memory.owned_sources()
    buffers = memory.memory, memory.weights, memory.grads
    p = per_row(probs.to(memory.memory.dtype))  # (G*B*T, S), a copy that autograd sees
    out = run(dynamic_mix_op, DYNAMIC, p, sources, *buffers, first, memory.written)
    memory.mark_written()
    return token_major(out)


# ---------------------------------------------------------------------------------------------
# What the two mixes share


def as_layer_memory(memory, router):
    """memory as a LayerMemory with its buffers made; a plain list (a router called on its own)
    gets a memory of its own, without shared gradient rows."""
    if not isinstance(memory, LayerMemory):
        sources = list(memory)
        memory = LayerMemory(len(sources), shared=False)
        memory.sources = sources
    memory.prepare(router)
    return memory


def token_major_copy(rows):
    """A source's gradient rows (G, B, T, 2, hs) in the source's own layout (B, T, 2, G, hs), as
    its projection's backward wants it: a copy always (an op's outputs must not share memory)."""
    return token_major(rows).clone(memory_format=torch.contiguous_format)


def token_major_fake(memory):
    L, G, B, T, _, hs = memory.shape
    return memory.new_empty(B, T, 2, G, hs)


# ---------------------------------------------------------------------------------------------
# The self-check: what no CPU test can show (a GPU's arithmetic, the installed torch), checked on
# the user's GPU at the run's shape before a run trusts this module (kernels/__init__.py).

def self_check(G, hs, dtype, device):
    """None if both mixes give on device what lime.py's plain mix gives in float32 on the CPU,
    else a line saying what differed. Three layers of (1, 37, 2, G, hs) keys/values, the third
    layer's input made from the second's output (so the backward passes run in a model's order):
    the output, every source's gradient and the routers' weights' gradients, at tolerances for
    dtype, through the model's shared gradient rows and through a plain list."""
    try:
        return compare_with_plain(G, hs, dtype, torch.device(device))
    except Exception as e:  # an error on this device: the plain mix still works
        return f"the self-check failed: {type(e).__name__}: {last_line(e)[:200]}"


def plain_static(R, memory):
    return R @ torch.cat(list(memory), dim=3)


def plain_dynamic(probs, memory):
    return sum(kv * probs[:, :, None, :, m, None] for m, kv in enumerate(memory))


def three_layers(mixes, weights, leaves, shared):
    """Layers 1 and 2 of a three-layer memory; returns the last output."""
    memory = LayerMemory(3) if shared else []
    memory.append(leaves[0])
    memory.append(leaves[1])
    out = mixes(weights[0], memory)
    memory.append(leaves[2] + out)
    return mixes(weights[1], memory)


def compare_with_plain(G, hs, dtype, device):
    shape = (1, 37, 2, G, hs)
    gen = torch.Generator().manual_seed(0)  # its own: the run's random state is left alone
    leaves = [torch.randn(shape, generator=gen).to(dtype).float() for _ in range(3)]
    dout = torch.randn(shape, generator=gen).to(dtype).float()
    weights = {'static': [torch.randn(G, S * G, generator=gen) for S in (2, 3)],
               'dynamic': [torch.randn(1, 37, G, S, generator=gen).softmax(-1) for S in (2, 3)]}
    # float32 may use TF32 where torch allows it for its matmuls; 16-bit types round the output
    tolerance = 5e-3 if dtype in (torch.float32, torch.float16) else 2e-2
    for name, (fast, plain) in {'static': (static_mix, plain_static),
                                'dynamic': (dynamic_mix, plain_dynamic)}.items():
        results = []
        for mix, dev, dt, shared in ((plain, 'cpu', torch.float32, None),
                                     (fast, device, dtype, True), (fast, device, dtype, False)):
            w = [x.to(dev, copy=True).requires_grad_() for x in weights[name]]
            xs = [x.to(dev, dt, copy=True).requires_grad_() for x in leaves]
            out = three_layers(mix, w, xs, shared)
            out.backward(dout.to(dev, out.dtype))
            results.append([out, *(x.grad for x in w + xs)])
        names = ['output', "layer 1's weights' gradient", "layer 2's weights' gradient",
                 *(f"source {m}'s gradient" for m in range(3))]
        for how, result in zip(('with shared gradient rows', 'on a plain list'), results[1:]):
            for what, got, want in zip(names, result, results[0]):
                error = relative_error(got, want)
                if not error <= tolerance:
                    return (f"the self-check of the {name} mix {how} on {device} (G={G}, hs={hs}, "
                            f"{str(dtype).replace('torch.', '')}) found its {what} off by "
                            f"{error:.1e} (relative; allowed {tolerance:.0e})")
    return None


def relative_error(got, want):
    """max |got - want| over max |want|, in float32 on the CPU."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()
