"""
kernels/cpu.py: LIMe's static mix and the training loss, the same numbers as lime.py's plain
PyTorch, faster on a CPU (docs/performance.md). lime.use_fused_kernels picks this module on a CPU
unless told otherwise (fused=False runs lime.py's own code, the definition these are tested against
in tests/test_fused.py).

- The static mix: torch.bmm with R expanded (a view, no copy) over every (token, key or value)
  row, about 2x faster on a CPU than the matmul that broadcasts R, which copies kv transposed.
- The loss: F.cross_entropy makes three new (N, V) tensors (the log-softmax, and in backward its
  gradient and the softmax it recomputes); CrossEntropy makes one, the gradient, written in place
  over a softmax. A CPU step is 3-20% faster. Compiled, torch's own is used (dynamo traces it).
"""
import torch
import torch.nn.functional as F


def static_mix(R, memory):
    """lime.StaticRouter's R @ cat(memory): the (B, T, 2, G, hs) mix of the S sources in memory."""
    kv = torch.cat(list(memory), dim=3).flatten(0, 2)  # (B*T*2, S*G, hs)
    return torch.bmm(R.expand(len(kv), *R.shape), kv).view_as(memory[0])  # R @ kv[i], every i


def dynamic_mix(probs, memory):
    """lime.DynamicRouter's mix: nothing faster on a CPU, so the same sum."""
    probs = probs.type_as(memory[0])
    return sum(kv * probs[:, :, None, :, m, None] for m, kv in enumerate(memory))


def LayerMemory(n_layer):
    """The layer memory: a plain list, as in lime.py (kernels/fused.py brings its own)."""
    return []


def cross_entropy(logits, targets, ignore_index=-1):
    """F.cross_entropy(logits, targets, ignore_index=-1), in one new (N, V) tensor when eager."""
    if ignore_index != -1 or torch.compiler.is_compiling():
        return F.cross_entropy(logits, targets, ignore_index=ignore_index)
    return CrossEntropy.apply(logits, targets)


class CrossEntropy(torch.autograd.Function):
    """F.cross_entropy(logits, targets, ignore_index=-1) with one new (N, V) tensor, not three."""

    @staticmethod
    def forward(ctx, logits, targets):  # logits (N, V); targets (N,), -1 = ignored
        keep = targets != -1
        targets = targets.clamp(min=0)[:, None]  # (N, 1); an ignored row's share is 0
        share = keep[:, None] / keep.sum()  # (N, 1): each kept row's weight in the mean
        ctx.save_for_backward(logits, targets, share)
        # The log-softmax in pieces of 64 rows, each freed once its targets' entries are taken.
        logp = [x.log_softmax(-1).gather(1, t) for x, t in zip(logits.split(64), targets.split(64))]
        return -(torch.cat(logp) * share).sum()

    @staticmethod
    def backward(ctx, grad):  # d loss / d logits = (softmax - one-hot target) * share
        logits, targets, share = ctx.saved_tensors
        g = logits.softmax(-1).scatter_add_(1, targets, torch.full_like(share, -1.0))
        return g.mul_(share * grad), None
