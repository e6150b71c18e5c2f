"""
harness.py: a lime checkpoint as a model that EleutherAI's LM Evaluation Harness scores (lm-eval, an
optional dependency: pip install lm-eval==0.4.13), so that its tasks are scored by its own code;
lab/table1.py runs the paper's table with it. From Python:

    import lm_eval, lab.harness                 # importing this module registers the model 'lime'
    lm_eval.simple_evaluate(model='lime', model_args='out_dir=out/gpt2/static,dtype=float32',
                            tasks=['hellaswag'], num_fewshot=1)

LimeLM is a TemplateLM: the harness itself splits each request into context and continuation
tokens; here they are only scored, the log-softmax in float32 whatever the model ran in. A sequence
longer than block_size loses tokens on the left; tasks that generate text are refused.
"""
import os

import torch
import torch.nn.functional as F
from tqdm import tqdm

from configurator import fail, or_fail
from lime import load_model
from prepare import EOT, gpt2_encoding

try:  # an optional dependency, imported here only
    import lm_eval.models  # noqa: F401  (the harness's own model names: see register)
    from lm_eval import utils as lm_eval_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import model_registry
except ImportError as e:
    fail(f"scoring with the LM Evaluation Harness needs it: pip install lm-eval==0.4.13 ({e})")

NAME = 'lime'  # the model's name in the harness: simple_evaluate(model='lime', ...)


def register():
    """Make NAME known to the harness by the class's import path, once. The harness's
    @register_model decorator refuses a second class object under a name taken, which happens
    whenever this module runs twice (reloaded, or as both lab.harness and harness); a path is the
    same string each time. lm_eval.models is imported first: it fills the registry with the
    harness's own models only while the registry is empty, and 'lime' alone would hide them."""
    if NAME not in model_registry:
        model_registry.register(NAME, target='lab.harness:LimeLM')


class LimeLM(TemplateLM):
    """A lime checkpoint (out_dir/ckpt.pt) as a model the harness scores: the log-likelihood of
    each request's continuation given its context, and of whole texts (perplexity tasks)."""

    def __init__(self, out_dir='out', device=None, dtype=None, batch_size=8, max_batch_size=None):
        # simple_evaluate passes every model max_batch_size, for its 'auto' batch size (not here)
        super().__init__()
        device = str(device or ('cuda' if torch.cuda.is_available() else 'cpu'))
        dtype = dtype or ('bfloat16' if device.startswith('cuda') else 'float32')
        if dtype not in ('bfloat16', 'float32'):
            fail(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            fail(f"batch_size must be a whole number > 0, got {batch_size!r}")
        self.model, checkpoint = or_fail(load_model, os.path.join(out_dir, 'ckpt.pt'), device)
        config = self.model.config
        if config.vocab_size != EOT + 1:
            fail(f"the model's vocab_size is {config.vocab_size}, not GPT-2's {EOT + 1}: the "
                 "harness's text is tokenized with GPT-2's BPE")
        self.enc = or_fail(gpt2_encoding)
        self._device = torch.device(device)
        self.batch_size = int(batch_size)
        self.autocast = torch.autocast(self._device.type, torch.bfloat16,
                                       enabled=dtype == 'bfloat16')
        self.info = {'lime_out_dir': out_dir, 'lime_step': checkpoint['step'],
                     'lime_router': config.router, 'lime_dtype': dtype}

    @property
    def eot_token_id(self):
        return EOT  # also what an empty context becomes (TemplateLM.prefix_token_id)

    @property
    def max_length(self):
        return self.model.config.block_size

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.enc.encode_ordinary(string)  # '<|endoftext|>' in a text is text, not EOT

    def get_model_info(self):
        """What simple_evaluate puts in its results' config: the checkpoint and how it ran."""
        return self.info

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """(log-likelihood, greedy) of each request's continuation tokens after its context
        tokens, batch_size requests a forward, padded on the right (which leaves a causal model's
        logits before it as they were). requests: (key, context tokens, continuation tokens), the
        key the harness caches the answer under, or None (loglikelihood_rolling's windows)."""
        block_size = self.max_length
        for _, _, continuation in requests:
            if len(continuation) > block_size:
                fail(f"a continuation of {len(continuation)} tokens is longer than the model's "
                     f"block_size ({block_size}): it cannot be scored whole")
        answers = []
        for start in tqdm(range(0, len(requests), self.batch_size), disable=disable_tqdm):
            batch = requests[start:start + self.batch_size]
            # The model's inputs: all tokens but the last, cut on the left to block_size.
            inputs = [(context + continuation)[-(block_size + 1):][:-1]
                      for _, context, continuation in batch]
            tokens = torch.zeros((len(inputs), max(map(len, inputs))), dtype=torch.long)
            for i, row in enumerate(inputs):
                tokens[i, :len(row)] = torch.tensor(row)
            with self.autocast:
                logits, _ = self.model(tokens.to(self._device))
            for row, scores, (key, _, continuation) in zip(inputs, logits, batch):
                # Position t predicts token t + 1: the continuation's n by the last n positions.
                n = len(continuation)
                logprobs = F.log_softmax(scores[len(row) - n:len(row)].float(), dim=-1)
                target = torch.tensor(continuation, device=logprobs.device)
                answer = (logprobs.gather(1, target[:, None]).sum().item(),
                          bool((logprobs.argmax(-1) == target).all()))
                answers.append(answer)
                if key is not None:
                    self.cache_hook.add_partial('loglikelihood', key, answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """The log-likelihood of each text whole, <|endoftext|> before it, in the harness's rolling
        windows of block_size tokens: each token predicted once, with as much context as fits."""
        answers = []
        for (string,) in tqdm([request.args for request in requests], disable=disable_tqdm):
            windows = [(None, *lm_eval_utils.make_disjoint_window(window)) for window in
                       lm_eval_utils.get_rolling_token_windows(
                           token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                           max_seq_len=self.max_length, context_len=1)]
            total = sum(ll for ll, _ in self._loglikelihood_tokens(windows, disable_tqdm=True))
            self.cache_hook.add_partial('loglikelihood_rolling', (string,), total)
            answers.append(total)
        return answers

    def generate_until(self, requests, disable_tqdm=False):
        fail("lab/harness.py scores log-likelihoods only (multiple choice, perplexity): tasks "
             "that generate text are not supported")


register()
