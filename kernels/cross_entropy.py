"""
kernels/cross_entropy.py: the training loss on an eager CPU step, the same numbers as
F.cross_entropy(logits, targets, ignore_index=-1) in less new memory. lime.py's GPT.forward uses it
there (a CPU step 3-20% faster, docs/performance.md); compiled or on a GPU, it uses torch's.

F.cross_entropy makes three new (N, V) tensors (the log-softmax, and in backward its gradient and
the softmax it recomputes); this makes one, the gradient, written in place over a softmax.
"""
import torch


class CrossEntropy(torch.autograd.Function):
    """F.cross_entropy(logits, targets, ignore_index=-1) with one new (N, V) tensor, not three."""

    @staticmethod
    def forward(ctx, logits, targets):  # logits (N, V); targets (N,), -1 = ignored
        keep, targets = targets != -1, targets.clamp(min=0)[:, None]
        ctx.save_for_backward(logits, targets, share := keep[:, None] / keep.sum())  # (N, 1)
        logp = [x.log_softmax(-1).gather(1, t) for x, t in zip(logits.split(64), targets.split(64))]
        return -(torch.cat(logp) * share).sum()  # the log-softmax in small pieces, each freed

    @staticmethod
    def backward(ctx, grad):  # d loss / d logits = (softmax - one-hot target) * share
        logits, targets, share = ctx.saved_tensors
        g = logits.softmax(-1).scatter_add_(1, targets, torch.full_like(share, -1.0))
        return g.mul_(share * grad), None
