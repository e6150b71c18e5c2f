"""
harness.py: lets EleutherAI's LM Evaluation Harness (lm-eval, an optional dependency:
`pip install lm-eval==0.4.13`) score a lime checkpoint, so that its tasks (the LIMe paper's Table 1:
ARC, Winogrande, COPA, MultiRC, RTE, HellaSwag, PIQA) are scored by its own code. lab/table1.py
runs the table; from Python:

    import lm_eval, lab.harness                 # importing this module registers the model 'lime'
    lm_eval.simple_evaluate(model='lime', model_args='out_dir=out/gpt2,dtype=float32',
                            tasks=['hellaswag'], num_fewshot=1)

or lm_eval.simple_evaluate(model=lab.harness.LimeLM(out_dir='out/gpt2'), ...). LimeLM is a
TemplateLM: the harness itself splits each request into context and continuation tokens (the
context's trailing spaces moved to the continuation, the pair tokenized whole and the continuation
being the tokens after the context's own) and puts <|endoftext|> before an empty context; here they
are only scored. A sequence longer than block_size loses tokens on the left; a continuation longer
than block_size cannot be scored whole and is refused. The log-softmax is taken in float32 whatever
the model ran in; that (float32, or bfloat16 autocast) is reported with the scores. Scoring only: tasks that
generate text (generate_until) are refused. docs/evaluation.md says more.
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
    """Make NAME known to the harness by the class's import path, not by the class itself, and
    once. Registering the class (the harness's @register_model decorator) fails whenever this
    module runs twice: a second class object under a name already taken is refused ("already
    registered"), and the module runs twice when it is reloaded or loaded under two names (as
    __main__ by `python -m`, or as `harness` with lab/ on sys.path, then as lab.harness). A
    path is the same string each time; the harness imports it when first asked for 'lime' (and
    from then on holds that class, so the path is not registered again). lm_eval.models is
    imported first: it adds the harness's own names (hf, ...) to the registry, which it
    otherwise does only on finding the registry empty, so registering 'lime' alone would hide
    them."""
    if NAME not in model_registry:
        model_registry.register(NAME, target='lab.harness:LimeLM')


class LimeLM(TemplateLM):
    """A lime checkpoint (out_dir/ckpt.pt) as a model the harness scores: the log-likelihood of
    each request's continuation given its context, and of whole texts (perplexity tasks)."""

    def __init__(self, out_dir='out', device=None, dtype=None, batch_size=8, max_batch_size=None):
        # simple_evaluate passes batch_size, max_batch_size and device to every model; the
        # harness's own 'auto' batch size is not supported, and max_batch_size goes with it.
        super().__init__()
        device = str(device or ('cuda' if torch.cuda.is_available() else 'cpu'))
        dtype = dtype or ('bfloat16' if device.startswith('cuda') else 'float32')
        if dtype not in ('bfloat16', 'float32'):
            fail(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
        if isinstance(batch_size, str) and batch_size.isdigit():
            batch_size = int(batch_size)
        if type(batch_size) is not int or batch_size < 1:
            fail(f"batch_size must be a whole number > 0, got {batch_size!r}")
        self.model, checkpoint = or_fail(load_model, os.path.join(out_dir, 'ckpt.pt'), device)
        if self.model.config.vocab_size != EOT + 1:
            fail(f"the model's vocab_size is {self.model.config.vocab_size}, not GPT-2's "
                 f"{EOT + 1}: the harness's text is tokenized with GPT-2's BPE")
        self.enc = or_fail(gpt2_encoding)
        self._device = torch.device(device)
        self.batch_size, self.dtype = batch_size, dtype
        bf16 = dtype == 'bfloat16'
        self.autocast = torch.autocast(self._device.type, torch.bfloat16, enabled=bf16)
        config = self.model.config
        self.info = {'out_dir': out_dir, 'step': checkpoint['step'], 'router': config.router,
                     'block_size': config.block_size, 'dtype': dtype,
                     'log_softmax': 'float32'}

    # -------------------------------------------------------------------------
    # what TemplateLM asks of a model: its tokenizer and its end-of-text token

    @property
    def eot_token_id(self):
        return EOT  # also what an empty context becomes (TemplateLM.prefix_token_id)

    @property
    def max_length(self):
        return self.model.config.block_size

    @property
    def tokenizer_name(self):
        return 'gpt2'

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.enc.encode_ordinary(string)  # '<|endoftext|>' in a text is text, not EOT

    def tok_decode(self, tokens, **kwargs):
        return self.enc.decode(tokens)

    def get_model_info(self):
        """What simple_evaluate puts in its results' config: the checkpoint and how it ran."""
        return {f'lime_{key}': value for key, value in self.info.items()}

    # -------------------------------------------------------------------------
    # scoring

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """(log-likelihood, greedy) of each request's continuation tokens after its context
        tokens: requests are (key, context tokens, continuation tokens), key being the
        (context, continuation) strings, or None for windows of loglikelihood_rolling. Longest
        first, batch_size at a time, padded on the right (which cannot change the logits of the
        positions before it in a causal model); the answers come back in the requests' order."""
        block_size = self.max_length
        for _, _, continuation in requests:
            if len(continuation) > block_size:
                fail(f"a continuation of {len(continuation)} tokens is longer than the model's "
                     f"block_size ({block_size}): it cannot be scored whole")
        # The model's inputs: all tokens but the last, cut on the left to block_size.
        inputs = [(context + continuation)[-(block_size + 1):][:-1]
                  for _, context, continuation in requests]
        order = sorted(range(len(requests)), key=lambda i: -len(inputs[i]))
        answers = [None] * len(requests)
        batches = range(0, len(order), self.batch_size)
        for start in tqdm(batches, disable=disable_tqdm, unit='batch'):
            rows = order[start:start + self.batch_size]
            scored = self.score_batch([inputs[i] for i in rows], [requests[i][2] for i in rows])
            for i, answer in zip(rows, scored):
                answers[i] = answer
                if requests[i][0] is not None:  # the harness's request cache, where it keeps one
                    self.cache_hook.add_partial('loglikelihood', requests[i][0], answer)
        return answers

    @torch.no_grad()
    def score_batch(self, inputs, continuations):
        """(summed log-probability, every token the most likely one) of each continuation, its
        tokens the last of its input's targets."""
        length = max(map(len, inputs))
        tokens = torch.zeros((len(inputs), length), dtype=torch.long)
        for i, row in enumerate(inputs):
            tokens[i, :len(row)] = torch.tensor(row)
        with self.autocast:
            logits, _ = self.model(tokens.to(self._device))
        answers = []
        for i, (row, continuation) in enumerate(zip(inputs, continuations)):
            n = len(continuation)
            # Position t predicts token t + 1: the continuation's n tokens by the last n positions.
            logprobs = F.log_softmax(logits[i, len(row) - n:len(row)].float(), dim=-1)  # (n, vocab)
            target = torch.tensor(continuation, device=logprobs.device)
            greedy = bool((logprobs.argmax(-1) == target).all())
            answers.append((logprobs.gather(1, target[:, None]).sum().item(), greedy))
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """The log-likelihood of each text whole, <|endoftext|> before it: in windows of block_size
        tokens, each token predicted once and with as much context as fits (the harness's
        get_rolling_token_windows, as its own models use it)."""
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
