"""
train.py: train a LIMe or baseline GPT on the token shards written by prepare.py.

    python train.py config/cpu_demo.py                       # a few minutes on a laptop CPU
    python train.py config/gpt2.py --router=none             # the baseline, on one GPU
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py --router=dynamic

Every key in the defaults block below can be overridden by config files and --key=value
(see configurator.py; `python train.py --help` lists them). Checkpoints go to out_dir/ckpt.pt;
--init_from=resume continues the run in one exactly where it stopped, with its settings;
out_dir/log.txt has one JSON object a line: the run's settings first, then a record per log and
evaluation step (plot.py draws them).
"""
import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import configure, fail, or_fail
from evaluate import (encode_example, multiple_choice, nats_and_bytes, read_examples, task_file,
                      task_tokenizer, token_byte_lengths)
from lime import GPT, GPTConfig, load_checkpoint, save_checkpoint
from prepare import read_shard, shard_paths

try:
    import fcntl  # POSIX file locks: one run at a time in an out_dir
except ImportError:  # Windows: no lock, so keep to one run per out_dir by hand
    fcntl = None

# -----------------------------------------------------------------------------
# default config values: a GPT-2-small-shaped LIMe model on FineWeb-Edu, on one GPU
# I/O
out_dir = 'out'  # where ckpt.pt and log.txt go; one run per out_dir
data_dir = 'data/fineweb_edu'  # the token shards written by prepare.py
eval_interval = 250  # steps between evaluations (and checkpoints)
eval_iters = 20  # batches of the validation shard per evaluation, always the same ones
mc_task = ''  # a multiple-choice task to score in training: 'hellaswag' or a task file (see evaluate.py)
mc_interval = 0  # steps between those scorings, a multiple of eval_interval; 0 = never
mc_examples = 1000  # the task's first this many examples, the same ones each time, shared among processes
log_interval = 10  # steps between log lines
always_save_checkpoint = True  # save at every evaluation, not only when val loss improves
init_from = 'scratch'  # 'scratch' or 'resume' (from out_dir/ckpt.pt, with the settings saved in it)
overwrite = False  # a scratch run into an out_dir that holds a run replaces it; without this it is refused
# model (see GPTConfig in lime.py for what each means)
n_layer = 12  # layers
n_head = 12  # query heads
n_kv_head = 0  # key/value heads (grouped-query attention when fewer); 0 means n_head
n_embd = 768  # width of the residual stream
mlp_hidden = 0  # SwiGLU hidden width; 0 means 4 * n_embd
block_size = 1024  # tokens per sequence
rope_base = 10000.0  # RoPE wavelength base, as in LLaMA
router = 'static'  # 'none' (LLaMA baseline), 'static' or 'dynamic' (LIMe)
router_top_p = 1.0  # prune routing weights to this share of their mass; 1 = off
hyper_connections = 0  # hyper-connections (the paper's other baseline): 0 = off, else n streams (paper: 4)
hc_dynamic = True  # dynamic (per-token) HC, as in the paper; False = static HC
vocab_size = 50257  # GPT-2's tokenizer; smaller for data with its own vocabulary
fused = None  # LIMe's mix as fused Triton kernels: None = where they run natively (CUDA), or True / False
# data: tokens per optimizer step = batch_size * block_size * gradient_accumulation_steps
batch_size = 16  # sequences per micro-step on each process
gradient_accumulation_steps = 32  # micro-steps per optimizer step, over all processes together
# optimizer (the paper's AdamW settings)
learning_rate = 1e-3  # the peak, reached after warmup
router_lr = 1e-2  # paper: 10x the base learning rate
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables clipping
max_iters = 20000  # optimizer steps in all
warmup_iters = 200  # steps of linear warmup
lr_decay_iters = 0  # cosine decay ends here; 0 means max_iters
min_lr = 1e-6  # router_lr decays by the same factor
# system
device = 'cuda' if torch.cuda.is_available() else 'cpu'  # 'cpu', 'cuda' or 'cuda:N'
dtype = 'bfloat16'  # 'bfloat16' (autocast) or 'float32'; on a CPU the default becomes float32
compile = True  # torch.compile the model; on a CPU the default becomes False
peak_flops = 989e12  # for MFU: bf16 dense peak of one device (H100 SXM)
seed = 1337  # for the initial weights
# -----------------------------------------------------------------------------
# What each key may hold (configurator.KINDS), checked for every key before anything runs.
config, given, autocast = configure(globals(), {
    'path': ['out_dir', 'data_dir'],
    'positive': ['eval_interval', 'eval_iters', 'log_interval', 'n_layer', 'n_head', 'n_embd', 'block_size',
                 'vocab_size', 'batch_size', 'gradient_accumulation_steps', 'learning_rate', 'max_iters',
                 'peak_flops', 'mc_examples', 'rope_base'],
    'non-negative': ['n_kv_head', 'mlp_hidden', 'hyper_connections', 'router_lr', 'weight_decay', 'grad_clip',
                     'warmup_iters', 'lr_decay_iters', 'min_lr', 'mc_interval'],
    'fraction': ['router_top_p'], 'below one': ['beta1', 'beta2'], 'seed': ['seed'], 'device': ['device'],
    ('scratch', 'resume'): ['init_from'], ('none', 'static', 'dynamic'): ['router'],
    ('bfloat16', 'float32'): ['dtype'], 'text': ['mc_task'],
})
globals().update(config)
device_type = 'cuda' if device.startswith('cuda') else 'cpu'

# -----------------------------------------------------------------------------
# setup: one process, or one per GPU under torchrun

ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    dist.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if device_type == 'cuda':
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
else:
    rank, world_size = 0, 1
master = rank == 0  # only it logs and writes checkpoints


def log(*args):
    if master:
        print(*args, flush=True)


# -----------------------------------------------------------------------------
# resume: the run that was saved, not one made of today's defaults. The model's shape is the
# checkpoint's (a contradicting override is a mistake, not a wish); so are the data, schedule and
# evaluation settings, unless given again (then the log says what changed). What belongs to this
# machine and this process is today's: where the run lives, the device, dtype, compile and fused.

model_keys = [f.name for f in fields(GPTConfig) if f.name != 'fused']  # fused: how, not what, to compute
own_keys = {'out_dir', 'init_from', 'overwrite', 'device', 'dtype', 'compile', 'fused', 'peak_flops'}
ckpt_path = os.path.join(out_dir, 'ckpt.pt')
checkpoint = None
if init_from == 'resume':
    checkpoint = or_fail(load_checkpoint, ckpt_path, device, keys=('model', 'model_args', 'optimizer', 'step',
                                                                   'best_val_loss', 'config', 'data', 'rng'))
    saved = checkpoint['config']
    # A checkpoint older than a model key was made with that key's default in GPTConfig.
    model_defaults = {f.name: f.default for f in fields(GPTConfig)}
    for key in set(model_keys) & given:
        if config[key] != saved.get(key, model_defaults[key]):
            fail(f"--{key}={config[key]} contradicts the checkpoint's {saved.get(key, model_defaults[key])!r}")
    for key in sorted(given & saved.keys() - own_keys):
        if config[key] != saved[key]:
            log(f"note: resuming with {key}={config[key]!r}, changed from the checkpoint's {saved[key]!r}")
    config.update({key: saved[key] for key in saved.keys() & config.keys() - own_keys - given})
    globals().update(config)
    model_args = checkpoint['model_args']
else:
    model_args = {k: config[k] for k in model_keys}
model_args = {**model_args, 'fused': fused}  # how to compute the mix, not part of the model: ours to choose
gptconf = or_fail(GPTConfig, **model_args)

if min_lr > learning_rate:
    fail(f"min_lr ({min_lr}) must not exceed learning_rate ({learning_rate}): the decay would raise the rate")
if gradient_accumulation_steps % world_size:
    fail(f"gradient_accumulation_steps ({gradient_accumulation_steps}) must be a multiple of the "
         f"number of processes ({world_size})")
accum_steps = gradient_accumulation_steps // world_size  # micro-steps on this process
tokens_per_step = batch_size * block_size * gradient_accumulation_steps
lr_decay_iters = lr_decay_iters or max_iters
log(f"tokens per step: {tokens_per_step:,} = {batch_size} batch x {block_size} block x "
    f"{gradient_accumulation_steps} micro-steps ({world_size} process{'es' * (world_size > 1)})")
torch.manual_seed(seed)


# -----------------------------------------------------------------------------
# data: every shard the run will read is checked now, before step 0, not when the run reaches it
# (an id past the model's vocabulary would crash the embedding lookup far from its cause).

if not os.path.isdir(data_dir):  # checked before a model is built, which can take a while
    fail(f"data_dir not found: {data_dir} (run `python prepare.py` first)")
train_files, val_files = or_fail(shard_paths, data_dir, 'train'), or_fail(shard_paths, data_dir, 'val')
# A micro-step reads span + 1 consecutive tokens of one shard (the 1: the last token's target). A
# shorter shard, such as the last one prepare.py writes, is skipped; at least one must be long enough.
span = batch_size * block_size * world_size
lengths = [len(or_fail(read_shard, path, vocab_size)) for path in train_files]
usable = [i for i, n in enumerate(lengths) if n > span]
for path, n in zip(train_files, lengths):
    if n <= span:
        log(f"note: skipping {path}: its {n:,} tokens are fewer than one micro-step's {span + 1:,} "
            "(batch_size * block_size * processes + 1)")
if not usable:
    fail(f"no training shard in {data_dir}/ holds one micro-step of batch_size * block_size * processes "
         f"+ 1 = {span + 1:,} tokens (the longest holds {max(lengths):,}): lower batch_size or block_size")
val_tokens = or_fail(read_shard, val_files[0], vocab_size)  # evaluation always uses this shard's start
val_batches = min(eval_iters, (len(val_tokens) - 1) // (batch_size * block_size))  # over all processes
if val_batches == 0:
    fail(f"the validation shard holds {len(val_tokens):,} tokens, fewer than one batch")
if val_batches < eval_iters:
    log(f"note: the validation shard fits only {val_batches} of eval_iters={eval_iters} batches")
# Bits per byte (evaluate.py) needs each token's UTF-8 bytes: GPT-2's, or arith.py's characters.
byte_lengths, why = token_byte_lengths(vocab_size, data_dir)
if byte_lengths is None:
    log(f"note: no bits per byte in the evaluations: {why}")
else:
    byte_lengths = byte_lengths.to(device)

# The multiple-choice task (evaluate.py), encoded once: this process's share of its first mc_examples.
if mc_interval:
    if not mc_task:
        fail("mc_interval needs mc_task: 'hellaswag' or a task file")
    if mc_interval % eval_interval:
        fail(f"mc_interval ({mc_interval}) must be a multiple of eval_interval ({eval_interval})")
    enc = task_tokenizer(vocab_size)
    mc_examples_all = read_examples(task_file(mc_task))[:mc_examples]
    mc_encoded = [encode_example(enc, example, block_size) for example in mc_examples_all[rank::world_size]]
    mc_labels = [label for *_, label in mc_examples_all[rank::world_size]]
    mc_name = os.path.basename(mc_task)


class Batches:
    """(x, y) batches of B sequences of T tokens, read in order through the shards, round and round.
    Each optimizer step consumes one stretch of span = B*T*world_size tokens per micro-step, and
    process r takes slice r of it, so the run sees the same tokens for any number of processes.
    Only the usable shards are read; a data position indexes all of them, so a checkpoint's means the
    same file whichever are skipped."""

    def __init__(self, files, usable, B, T, state=None):
        self.files, self.usable, self.B, self.T = files, usable, B, T
        self.span = B * T * world_size
        self.restore(state or {'shard': usable[0], 'pos': 0})

    def load(self, shard):
        self.shard, self.tokens = shard, or_fail(read_shard, self.files[shard])

    def following(self, shard):
        return next((i for i in self.usable if i > shard), self.usable[0])

    def state(self):
        return {'shard': self.shard, 'pos': self.pos}

    def restore(self, state):
        shard, pos = state['shard'], state['pos']
        if shard >= len(self.files):
            fail(f"the checkpoint stopped in training shard {shard + 1}, but {data_dir}/ "
                 f"holds only {len(self.files)}: is this the data it was trained on?")
        if shard not in self.usable:  # too short for this run's micro-steps: on to the next
            shard, pos = self.following(shard), 0
        self.load(shard)
        self.pos = pos

    def next(self):
        if self.pos + self.span + 1 > len(self.tokens):  # not enough left: on to the next shard
            self.load(self.following(self.shard))
            self.pos = 0
        start = self.pos + rank * self.B * self.T
        buf = torch.from_numpy(self.tokens[start:start + self.B * self.T + 1].astype(np.int64))
        self.pos += self.span
        x, y = buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)  # y is x shifted by one
        if device_type == 'cuda':  # pinned memory lets the copy overlap with the GPU's work
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)


# -----------------------------------------------------------------------------
# out_dir: one run at a time, and no run lost to a repeated command


def claim_out_dir(header):
    """out_dir/log.txt, opened by the run's record (header: its settings and size, for plot.py) and
    locked for as long as this process lives: a second run into the same out_dir is refused rather
    than mixing its checkpoints with ours. Under the lock, a scratch run
    refuses an out_dir that holds a run unless told to overwrite it, and a resumed run drops the
    records that the killed run wrote after its checkpoint, which it is about to write again."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        log_file = open(os.path.join(out_dir, 'log.txt'), 'a+')
    except OSError as e:
        fail(f"cannot write to out_dir {out_dir}: {e.strerror}")
    try:
        if fcntl is not None:
            fcntl.flock(log_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fail(f"another run is training into {out_dir}: wait for it to end, or choose another --out_dir")
    log_file.seek(0)
    records = log_file.readlines()
    if init_from == 'scratch':
        held = [name for name, there in (('ckpt.pt', os.path.exists(ckpt_path)), ('log.txt', records))
                if there]
        if held and not overwrite:
            fail(f"{out_dir} holds a run ({', '.join(held)}): continue it with --init_from=resume, train "
                 "into another --out_dir, or replace it with --overwrite=True")
        if held:
            log(f"note: --overwrite=True: replacing the run in {out_dir}")
            if os.path.exists(ckpt_path):
                os.remove(ckpt_path)
        records = []
    else:  # a record cut short by the kill is dropped too, and the old run record gives way to ours
        records = [r for r in records if r.endswith('\n') and json.loads(r).get('step', step + 1) <= step]
    log_file.seek(0)
    log_file.truncate()
    log_file.writelines([json.dumps(header) + '\n'] + records)
    log_file.flush()
    return log_file


step = checkpoint['step'] if checkpoint is not None else 0

# -----------------------------------------------------------------------------
# model and optimizer

model = GPT(gptconf).to(device)
optimizer = model.configure_optimizers(weight_decay, learning_rate, router_lr, (beta1, beta2),
                                       fused=device_type == 'cuda')
base_lrs = [group['lr'] for group in optimizer.param_groups]  # the schedule scales each of these
best_val_loss, data_state, saved_step = float('inf'), None, None
if checkpoint is not None:
    model.load_state_dict(checkpoint['model'])
    optimizer.load_state_dict(checkpoint['optimizer'])
    best_val_loss, saved_step = checkpoint['best_val_loss'], step
    if os.path.realpath(data_dir) == os.path.realpath(checkpoint['config']['data_dir']):
        data_state = checkpoint['data']
    else:  # its data position means nothing in other data
        log(f"note: {data_dir} is read from its start")
    torch.set_rng_state(checkpoint['rng']['cpu'])
    if device_type == 'cuda' and checkpoint['rng']['cuda'] is not None:
        torch.cuda.set_rng_state(checkpoint['rng']['cuda'])
    log(f"resumed from {ckpt_path} at step {step}")
    checkpoint = None  # free the memory
log(f"model: {model.num_params() / 1e6:.2f}M parameters, router={gptconf.router}")
log_file = claim_out_dir({'config': config, 'params': model.num_params(),
                          'flops_per_token': model.flops_per_token()}) if master else None
train_batches = Batches(train_files, usable, batch_size, block_size, data_state)

# -----------------------------------------------------------------------------
# compile, wrap, and helpers for the loop

raw_model = model  # the uncompiled module: its state dict is what checkpoints hold
if compile:
    log("compiling the model (a minute or so)...")
    model = torch.compile(model)
eval_model = model  # evaluation needs no gradient averaging
if ddp:  # the model's only buffers are RoPE tables: constants, so DDP need not broadcast them
    model = DDP(model, device_ids=[int(os.environ['LOCAL_RANK'])] if device_type == 'cuda' else None,
                broadcast_buffers=False)


def lr_factor(it):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters (a factor on each group's lr)."""
    if it < warmup_iters:
        return (it + 1) / warmup_iters
    if it >= lr_decay_iters:
        return min_lr / learning_rate
    progress = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return (min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (learning_rate - min_lr)) / learning_rate


def sum_over_processes(value):
    value = torch.tensor(value, dtype=torch.float64, device=device)
    if ddp:
        dist.all_reduce(value)
    return value.item()


@torch.no_grad()
def evaluate():
    """Mean loss, and bits per byte (None where unknown), over the first val_batches batches of the
    validation shard, the same ones for any number of processes (they share them out)."""
    eval_model.eval()
    B, T = batch_size, block_size
    total = nats = nbytes = 0.0
    for i in range(rank, val_batches, world_size):
        buf = torch.from_numpy(val_tokens[i * B * T:(i + 1) * B * T + 1].astype(np.int64)).to(device)
        with autocast:
            logits, loss = eval_model(buf[:-1].view(B, T), buf[1:].view(B, T))
        total += loss.item()
        if byte_lengths is not None:
            n, b = nats_and_bytes(logits, buf[1:].view(B, T), byte_lengths)
            nats, nbytes = nats + n, nbytes + b
    eval_model.train()
    nbytes = sum_over_processes(nbytes)
    bpb = sum_over_processes(nats) / (math.log(2) * nbytes) if nbytes else None
    return sum_over_processes(total) / val_batches, bpb


def score_task():
    """(acc, acc_norm) on the multiple-choice task's fixed examples, which the processes share out."""
    eval_model.eval()
    right, right_norm, _ = multiple_choice(eval_model, mc_encoded, mc_labels, device, autocast,
                                           block_size if compile else None)
    eval_model.train()
    n = len(mc_examples_all)
    return sum_over_processes(right) / n, sum_over_processes(right_norm) / n


def save():
    """Everything a resumed run needs, in one checkpoint (lime.save_checkpoint writes it atomically)."""
    rng = {'cpu': torch.get_rng_state(), 'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None}
    try:
        save_checkpoint(ckpt_path, raw_model, optimizer=optimizer.state_dict(), step=step, rng=rng,
                        best_val_loss=best_val_loss, config=config, data=train_batches.state())
    except OSError as e:  # a full disk, say: the previous checkpoint is still whole
        fail(f"could not write {ckpt_path}: {e.strerror or e}")


def write_log(**record):
    log_file.write(json.dumps(record) + '\n')
    log_file.flush()


def stop_if_not_finite(loss, what):
    if not math.isfinite(loss):
        if saved_step is None:
            kept = (f"No checkpoint was saved before it (the first comes at step "
                    f"{min(eval_interval, max_iters)}): start again with a lower learning_rate and "
                    "--overwrite=True")
        else:
            kept = (f"The last good checkpoint ({ckpt_path}, step {saved_step}) is kept: resume from it "
                    "with --init_from=resume and a lower learning_rate")
        fail(f"{what} is {loss} at step {step}: stopping. {kept}")


def duration(seconds):
    h, rest = divmod(int(seconds), 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


# -----------------------------------------------------------------------------
# training loop

start_step = step
if step >= max_iters:
    log(f"the checkpoint is at step {step}, max_iters is {max_iters}: nothing to train (raise --max_iters)")
window_start, window_steps = time.time(), 0
while True:
    last_step = step >= max_iters
    if (step % eval_interval == 0 or last_step) and (step > start_step or init_from == 'scratch'):
        val_loss, val_bpb = evaluate()
        line = f"step {step}/{max_iters} | val loss {val_loss:.4f}"
        record = {'step': step, 'val_loss': val_loss}
        if val_bpb is not None:
            line += f" | bpb {val_bpb:.4f}"
            record['val_bpb'] = val_bpb
        if mc_interval and (step % mc_interval == 0 or last_step):
            acc, acc_norm = score_task()
            line += f" | {mc_name} acc {acc:.4f} acc_norm {acc_norm:.4f}"
            record.update(mc_acc=acc, mc_acc_norm=acc_norm)
        log(line)
        stop_if_not_finite(val_loss, 'the validation loss')
        if master:
            write_log(**record)
            if step > start_step and (val_loss < best_val_loss or always_save_checkpoint):
                best_val_loss = min(best_val_loss, val_loss)
                save()
                saved_step = step
                log(f"saved checkpoint to {ckpt_path}")
        window_start, window_steps = time.time(), 0  # keep evaluation out of the timings
    if last_step:
        break

    factor = lr_factor(step)
    for group, base_lr in zip(optimizer.param_groups, base_lrs):
        group['lr'] = base_lr * factor
    loss_sum = torch.zeros((), device=device)
    for micro_step in range(accum_steps):
        x, y = train_batches.next()
        # Under DDP, average the gradients across processes only after the last micro-step.
        sync = nullcontext() if not ddp or micro_step == accum_steps - 1 else model.no_sync()
        with sync:
            with autocast:
                _, loss = model(x, y)
            # The gradients add up over micro-steps; dividing makes them those of the mean loss.
            (loss / accum_steps).backward()
        loss_sum += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip or float('inf'))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    window_steps += 1

    if step % log_interval == 0 or step == max_iters:
        train_loss = sum_over_processes(loss_sum.item() / accum_steps) / world_size  # waits for the GPU
        stop_if_not_finite(train_loss, 'the training loss')
        stop_if_not_finite(grad_norm.item(), 'the gradient norm')  # the weights are now poisoned too
        dt = (time.time() - window_start) / window_steps
        tokens_per_sec = tokens_per_step / dt
        mfu = raw_model.estimate_mfu(tokens_per_sec / world_size, peak_flops)
        line = (f"step {step}/{max_iters} | loss {train_loss:.4f} | lr {base_lrs[0] * factor:.2e} | "
                f"norm {grad_norm.item():.3f} | {dt * 1000:.1f} ms | {tokens_per_sec:,.0f} tok/s")
        line += f" | mfu {mfu:.1%}" if device_type == 'cuda' else ""
        log(line + f" | eta {duration(dt * (max_iters - step))}")
        if master:
            write_log(step=step, train_loss=train_loss, lr=base_lrs[0] * factor, grad_norm=grad_norm.item(),
                      ms_per_step=dt * 1000, tokens_per_sec=tokens_per_sec)
        window_start, window_steps = time.time(), 0

if ddp:
    # Rank 0 may still be writing the checkpoint. A rank that tears down its gloo group while
    # another still uses it can abort at exit (SIGABRT), failing a finished run: wait for all.
    dist.barrier()
    dist.destroy_process_group()
