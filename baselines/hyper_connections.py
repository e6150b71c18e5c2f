"""
baselines/hyper_connections.py: hyper-connections (HC), the LIMe paper's other baseline. lime.py
imports it only for a model with hyper_connections > 0; its Block then wraps the attention and the
MLP each in a HyperConnection instead of adding their outputs to one residual stream, and GPT
averages the streams before the final norm (HC's authors sum them: through the norm the same but
for its eps, and the mean keeps the model exactly the baseline at init). Parameter names follow
the LIMe authors' code.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class HyperConnection(nn.Module):
    """Hyper-connections (Zhu et al. 2024, arXiv 2409.19606, Sec. 2) around one sub-layer T
    (attention or MLP). The residual stream is n streams H (B, T, n, D); the sub-layer reads one
    mix of them, and its output is spread over the streams while they also mix among themselves:
        h = A_m^T H,    H' = B^T T(h) + A_r^T H
    with A_m (n,), A_r (n, n), B (n,) learned: static HC. Dynamic HC (as in the LIMe authors'
    code) adds a per-token correction read from each stream's normed vector:
        A_m(H) = A_m + s_a tanh(norm(H) W_m),  A_r(H) = A_r + s_a tanh(norm(H) W_r),
        B(H) = B + s_b tanh(norm(H) W_b)^T,    W = [W_m | W_r | W_b]: (D, n + 2)
    Init: A_m = e_(k mod n) for sub-layer k, A_r = I, B = 1, W = 0, s_a = s_b = 0.01. Then every
    stream holds the baseline's residual x + T(x) exactly, and the model is the baseline."""

    def __init__(self, config, index):  # index k: the sub-layer's place, 2 per block
        super().__init__()
        n = self.rate = config.hyper_connections
        self.index, self.width = index, config.n_embd
        self.static_alpha = nn.Parameter(torch.empty(n, n + 1))  # [A_m | A_r], row i: stream i
        self.static_beta = nn.Parameter(torch.empty(n))  # B
        self.proj = nn.Linear(config.n_embd, n + 2, bias=False) if config.hc_dynamic else None
        if config.hc_dynamic:
            self.alpha_scale = nn.Parameter(torch.empty(()))  # s_a
            self.beta_scale = nn.Parameter(torch.empty(()))  # s_b

    def reset_parameters(self):
        n = self.rate
        with torch.no_grad():
            self.static_alpha.zero_()
            self.static_alpha[self.index % n, 0] = 1.0  # sub-layer k reads stream k mod n
            self.static_alpha[:, 1:] = torch.eye(n)  # carry every stream on unchanged
            self.static_beta.fill_(1.0)  # add the output to every stream
            if self.proj is not None:
                self.proj.weight.zero_()
                self.alpha_scale.fill_(0.01)
                self.beta_scale.fill_(0.01)

    def flops_per_token(self):
        """Training FLOPs (6 per multiply-add) of the mixes, per token: for each channel, A_m and
        A_r (n (n + 1)) and B (n); as many again for W on the n streams if dynamic."""
        return 6 * self.width * self.rate * (self.rate + 2) * (1 + (self.proj is not None))

    def forward(self, H, branch):  # H: (B, T, n, D); branch: the sub-layer, (B, T, D) -> same
        alpha, beta = self.static_alpha, self.static_beta  # (n, n + 1), (n,)
        if self.proj is not None:
            dyn = torch.tanh(self.proj(F.rms_norm(H, (H.size(-1),), eps=1e-5)))  # (B, T, n, n+2)
            alpha = alpha + self.alpha_scale * dyn[..., :-1]  # (B, T, n, n + 1)
            beta = beta + self.beta_scale * dyn[..., -1]  # (B, T, n)
        mixed = alpha.transpose(-1, -2) @ H  # (..., n + 1, D): A_m^T H, then A_r^T H
        return mixed[..., 1:, :] + beta[..., None] * branch(mixed[..., 0, :])[..., None, :]
