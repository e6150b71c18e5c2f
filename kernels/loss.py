"""
kernels/loss.py: the training loss with the numbers of F.cross_entropy(..., ignore_index=-1), in
less memory on a CPU. F.cross_entropy makes three new (N, V) tensors (the log-softmax, and in
backward its gradient and the softmax it recomputes); CrossEntropy makes one, the gradient, written
in place over a softmax: a CPU step is 3-20% faster (docs/performance.md). On a GPU, and compiled,
torch's own is used. tests/test_kernels.py holds it to torch's.
"""
import torch
import torch.nn.functional as F


def cross_entropy(logits, targets, ignore_index=-1):
    """F.cross_entropy(logits, targets, ignore_index=-1): one new (N, V) tensor on a CPU, eager."""
    if ignore_index != -1 or logits.is_cuda or torch.compiler.is_compiling():
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
