"""
train.py: train a LIMe or baseline GPT on the token shards that prepare.py writes.

    python train.py config/cpu_demo.py                       # a few minutes on a laptop CPU
    python train.py config/gpt2.py --router=none             # the baseline, on one GPU
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py --router=dynamic

Config files and --key=value set the keys of the defaults block below (`--help` lists them).
out_dir/ckpt.pt is the checkpoint (--init_from=resume continues the run exactly, with its
settings); out_dir/log.txt has a JSON object a line: the settings, then each log line's record.
bookkeeping.py keeps them (and refuses to replace an earlier run): this file is the training.
"""
from configurator import configure, fail, or_fail  # first, before torch: Ctrl-C is one line

import math
import os
import sys
import time
import zlib
from contextlib import nullcontext
from dataclasses import fields

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import bookkeeping
from lime import GPT, GPTConfig
from memory_limits import out_of_memory_in_one_line
from prepare import (BYTES_VOCAB, Batches, data_tokenizer, prepare_if_default, read_shard,
                     shard_paths, token_bytes)

# -----------------------------------------------------------------------------
# default config values: a GPT-2-small-shaped LIMe model on FineWeb-Edu, on one GPU
# I/O
out_dir = 'out'  # where ckpt.pt and log.txt go; one run per out_dir
data_dir = 'data/fineweb_edu'  # the token shards written by prepare.py
eval_interval = 250  # steps between evaluations (and checkpoints)
eval_iters = 20  # batches of the validation shard per evaluation, always the same ones
log_interval = 10  # steps between log lines
always_save_checkpoint = True  # save at every evaluation; False: only below the saved val loss
init_from = 'scratch'  # 'scratch' or 'resume' (out_dir/ckpt.pt, with the settings saved in it)
overwrite = False  # replace a run already in out_dir (without this, a scratch run is refused)
mc_task = ''  # a multiple-choice task to score: 'hellaswag' or a task file (lab/evaluate.py)
mc_interval = 0  # steps between those scorings, a multiple of eval_interval; 0 = never
mc_examples = 1000  # the task's first this many examples, shared among processes
wandb_log = False  # log.txt's records to Weights & Biases too (pip install wandb; rank 0 only)
wandb_project = 'lime'  # the W&B project the runs go to
wandb_run_name = ''  # '' = a name made from the config: router, shape, out_dir
# model (GPTConfig in lime.py says what each means)
n_layer = 12
n_head = 12
n_kv_head = 0  # key/value heads; 0 means n_head
n_embd = 768
mlp_hidden = 0  # SwiGLU hidden width; 0 means 4 * n_embd
block_size = 1024  # tokens per sequence
rope_base = 10000.0
router = 'static'  # 'none' (the LLaMA baseline), 'static' or 'dynamic' (LIMe)
router_top_p = 1.0  # prune routing weights to this share of their mass; 1 = off
router_init = 'noisy'  # the static router's start: 'noisy' (the authors') or 'identity'
memory = 'kv'  # what the routers mix: 'kv' = keys/values (paper v2), 'hidden' = states (v1)
hyper_connections = 0  # the paper's other baseline: 0 = off, else n streams (paper: 4)
hc_dynamic = True  # dynamic (per-token) hyper-connections; False = static
vocab_size = 50257  # GPT-2's tokenizer; smaller for data with its own vocabulary
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
dtype = 'bfloat16'  # 'bfloat16' (autocast) or 'float32'; on a CPU the default is float32
compile = True  # torch.compile the model; on a CPU the default is False
checkpoint_blocks = False  # activation checkpointing: recompute each block, for less memory
fused = False  # LIMe's mix by kernels/memory.py (faster on a CPU at depth), not lime.py's own
peak_flops = 989e12  # for MFU: bf16 dense peak of one device (H100 SXM)
seed = 1337  # for the initial weights
# -----------------------------------------------------------------------------
# The ranges of the keys that the model does not check itself (GPTConfig checks its own).
KEY_KINDS = {  # upper case: not a key itself
    'positive': ['eval_interval', 'eval_iters', 'log_interval', 'mc_examples', 'batch_size',
                 'gradient_accumulation_steps', 'learning_rate', 'max_iters', 'peak_flops'],
    'non-negative': ['mc_interval', 'router_lr', 'weight_decay', 'grad_clip', 'warmup_iters',
                     'lr_decay_iters', 'min_lr'],
    'below one': ['beta1', 'beta2'],
    'path': ['out_dir', 'data_dir'],
    'seed': ['seed'],
    'device': ['device'],
    ('scratch', 'resume'): ['init_from'],
    ('bfloat16', 'float32'): ['dtype'],
}
config, given, autocast = configure(globals(), KEY_KINDS)
# router_init is v2's static router's start, fused its fast mix. A preset's (config/deep.py's
# router_init='identity', config/depth_text.py's fused=True) is left aside when the command line
# picks a router or memory without that choice (none, dynamic; memory='hidden'); typed on the
# command line with one, it would do nothing, and the run stops to say so.
typed = {arg[2:].partition('=')[0] for arg in sys.argv[1:] if arg.startswith('--')}
if (config['router'] != 'static' or config['memory'] != 'kv') and 'router_init' not in typed:
    config['router_init'] = 'noisy'
if config['memory'] != 'kv' and 'fused' not in typed:
    config['fused'] = False
# out_dir is this process's from here, before its checkpoint is read, to its end: a second run
# into it is refused (None where out_dir is not made yet: the run holds it once made, below)
out_dir_lock = bookkeeping.own(config['out_dir'])
# With --init_from=resume: the saved run's model and settings (checked as a --key=value is), not
# today's defaults; (None, None) for a new run.
model, checkpoint = bookkeeping.resume_settings(config, given, KEY_KINDS)
globals().update(config)

if model is None:
    gptconf = or_fail(GPTConfig, **{f.name: config[f.name] for f in fields(GPTConfig)})
else:
    gptconf = model.config
if fused and gptconf.memory != 'kv' and gptconf.router != 'none':  # before anything is built
    from kernels import MIXES_KV_ONLY
    fail(MIXES_KV_ONLY)
if min_lr > learning_rate:
    fail(f"min_lr ({min_lr}) must not exceed learning_rate ({learning_rate})")
lr_decay_iters = lr_decay_iters or max_iters
config['lr_decay_iters'] = lr_decay_iters  # saved with the run: a resume keeps its schedule

# -----------------------------------------------------------------------------
# setup: one process, or one per GPU under torchrun
ddp = int(os.environ.get('RANK', -1)) != -1
# Ctrl-C, SIGTERM (what a cluster's scheduler sends a job before it kills it), SIGUSR1 (SLURM's
# warning that the time is nearly up) or SIGHUP (a lost terminal): one line and the exit code a
# shell expects (130, 143, 138, 129), never a traceback; from the training loop on, with a save.
# An output that closes (a `| tee` gone) stops nothing.
interrupts = bookkeeping.Interrupts(ddp)
device_type = 'cuda' if device.startswith('cuda') else 'cpu'
rank = 0
world_size = 1
if ddp:
    dist.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    if device_type == 'cuda':
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
if device_type == 'cuda' and ':' in device:
    torch.cuda.set_device(device)  # kernels launch on the current device: make it ours
if device_type == 'cpu':
    bookkeeping.tune_cpu_allocator()
master = rank == 0  # only it logs and writes to out_dir
log = bookkeeping.say  # print, on rank 0 only

if gradient_accumulation_steps % world_size:
    fail(f"gradient_accumulation_steps ({gradient_accumulation_steps}) must be a multiple of the "
         f"number of processes ({world_size})")
accum_steps = gradient_accumulation_steps // world_size  # micro-steps on this process
tokens_per_step = batch_size * block_size * gradient_accumulation_steps
log(f"tokens per step: {tokens_per_step:,} = {batch_size} batch x {block_size} block x "
    f"{gradient_accumulation_steps} micro-steps ({world_size} process{'es' * (world_size > 1)})")
if max_iters <= warmup_iters:
    log(f"note: max_iters={max_iters} ends within the warmup (warmup_iters={warmup_iters}): the "
        f"learning rate rises all run, to {max_iters / warmup_iters:.0%} of its peak, no decay")
torch.manual_seed(seed)

# -----------------------------------------------------------------------------
# data: every shard is checked now, before step 0 (prepare.Batches reads them all), and again
# when it is opened
if master:  # data/pydoc(_bytes), missing: made now, so the quick start needs no prepare.py step
    or_fail(prepare_if_default, data_dir)
if ddp:
    dist.barrier()  # the other processes read the data once it is whole
# The data's tokenizer goes into the run's settings, so that sample.py decodes with it.
config['tokenizer'] = or_fail(data_tokenizer, data_dir)
if config['tokenizer'] == 'bytes' and vocab_size != BYTES_VOCAB:
    fail(f"{data_dir} holds byte-level shards: train on them with --vocab_size={BYTES_VOCAB}")
B, T = batch_size, block_size
train_batches = or_fail(Batches, data_dir, B, T, rank, world_size, vocab_size, log)
val_shard = or_fail(shard_paths, data_dir, 'val')[0]
val_tokens = or_fail(read_shard, val_shard, vocab_size)
val_batches = min(eval_iters, (len(val_tokens) - 1) // (B * T))
if val_batches == 0:
    fail(f"the validation shard holds {len(val_tokens):,} tokens, fewer than one batch "
         f"(batch_size * block_size = {B * T:,}): lower them, as config/cpu_demo.py does")
if val_batches < eval_iters:
    log(f"note: the validation shard fits only {val_batches} of eval_iters={eval_iters} batches")
# What every evaluation reads, copied into memory: nothing done to the file can change it now
val_tokens = np.array(val_tokens[:val_batches * B * T + 1])
# and how, saved with each checkpoint: only val losses measured the same way compare (RunDir.save)
val_measure = {'batches': val_batches, 'batch_size': B, 'block_size': T,
               'tokens': zlib.crc32(val_tokens.tobytes())}
# Bits per byte needs each token's UTF-8 bytes: known for GPT-2, bytes, and arith.py's characters.
byte_counts, why = token_bytes(vocab_size, data_dir)
if byte_counts is None:
    log(f"note: no bits per byte in the evaluations: {why}")
else:
    byte_counts = torch.from_numpy(byte_counts).to(device)

if mc_interval:  # a multiple-choice task, scored during training: lab/evaluate.py does that
    from lab.evaluate import TaskScorer
    mc = TaskScorer.for_training(config, rank, world_size)

# -----------------------------------------------------------------------------
# model and optimizer: what training holds must fit in this process's memory (checked first)
run = bookkeeping.RunDir(config, master, val_measure, out_dir_lock)  # out_dir: log.txt, ckpt.pt
bookkeeping.check_training_memory(gptconf, config, built=model is not None)
# The check counts a floor: memory that runs out all the same, here or at any step, ends the run in
# one line naming what to lower, with out_dir's last checkpoint as it was.
out_of_memory_in_one_line(bookkeeping.LOWER_TO_FIT, run.kept)
if model is None:
    model = GPT(gptconf)
model.to(device).train()
if fused:  # faster code for the same numbers, asked for by name (kernels/__init__.py)
    import kernels
    mix_dtype = torch.bfloat16 if dtype == 'bfloat16' else torch.float32
    or_fail(kernels.install, model, device, mix_dtype)
model.checkpoint_blocks = checkpoint_blocks  # how to run, not what: not saved with the model
optimizer = model.configure_optimizers(weight_decay, learning_rate, router_lr, (beta1, beta2),
                                       fused=device_type == 'cuda')
base_lrs = [group['lr'] for group in optimizer.param_groups]  # the schedule scales each of these
step = 0
if checkpoint is not None:
    step = checkpoint['step']
    bookkeeping.restore_state(checkpoint, optimizer, train_batches, config)
log(f"model: {model.num_params() / 1e6:.2f}M parameters, router={gptconf.router}")
run.claim(model, checkpoint)  # resumed: the checkpoint's step and evaluation
remeasure = run.measured_otherwise(checkpoint)  # its val loss taken over other batches?
checkpoint = None  # free the memory

raw_model = model  # the model itself: its state dict is what checkpoints hold
if compile:
    log("compiling the model (a minute or so)...")
    model = torch.compile(model)
if ddp:  # the model's only buffers are constants (RoPE tables): DDP need not broadcast them
    local = [int(os.environ['LOCAL_RANK'])] if device_type == 'cuda' else None
    model = DDP(model, device_ids=local, broadcast_buffers=False)


# -----------------------------------------------------------------------------
# helpers for the loop
def lr_factor(it):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters: a factor on each group's lr."""
    if it < warmup_iters:
        return (it + 1) / warmup_iters
    if it >= lr_decay_iters:
        return min_lr / learning_rate
    progress = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    lr = min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (learning_rate - min_lr)
    return lr / learning_rate


def stop_signal():
    """The signal to stop at this step (bookkeeping.stop_signals), 0 while none has come: under
    DDP the one any process got (one all_reduce of a number a step), so that all stop together."""
    if not ddp:
        return interrupts.signal
    signum = torch.tensor(interrupts.signal, device=device)
    dist.all_reduce(signum, op=dist.ReduceOp.MAX)
    return signum.item()


def sum_over_processes(value):
    value = torch.tensor(value, dtype=torch.float64, device=device)
    if ddp:
        dist.all_reduce(value)
    return value.item()


@torch.no_grad()
def evaluate():
    """Mean loss and bits per byte (None where unknown) over the first val_batches batches of the
    validation shard, the same ones for any number of processes (they share them out). Bits per
    byte: the loss in nats summed over the tokens of text, over ln 2 times their UTF-8 bytes, so
    that models with other tokenizers compare (<|endoftext|> has 0 bytes and is left out)."""
    model.eval()
    loss = 0.0
    nats = 0.0
    nbytes = 0.0
    for i in range(rank, val_batches, world_size):
        buf = torch.from_numpy(val_tokens[i * B * T:(i + 1) * B * T + 1].astype(np.int64))
        x = buf[:-1].view(B, T).to(device)
        y = buf[1:].view(B, T).to(device)
        with autocast:
            logits, _ = model(x)
        losses = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction='none')
        loss += losses.mean().item()
        if byte_counts is not None:
            text_bytes = byte_counts[y.flatten()]
            nats += (losses * (text_bytes > 0)).sum().item()
            nbytes += text_bytes.sum().item()
    model.train()
    nbytes = sum_over_processes(nbytes)
    bpb = sum_over_processes(nats) / (math.log(2) * nbytes) if nbytes else None
    return sum_over_processes(loss) / val_batches, bpb


# -----------------------------------------------------------------------------
# training loop
start_step = step
if remeasure:  # the checkpoint's weights, evaluated as this run evaluates: the loss to beat
    run.remeasured(evaluate()[0])
# From here a stop signal ends the run after the step in flight, with a checkpoint; a second (not
# the same one again at once, as a job script that forwards it sends it) stops it at once.
interrupts.save_first(run)
window_start = time.time()  # steps are timed over the window since the last log line
window_steps = 0
while True:
    last_step = step >= max_iters
    # evaluate, log and save a checkpoint (at step 0 of a new run: evaluate only)
    if (step % eval_interval == 0 or last_step) and (step > start_step or init_from == 'scratch'):
        val_loss, val_bpb = evaluate()
        mc_scores = None
        if mc_interval and (step % mc_interval == 0 or last_step):
            mc_scores = (mc.name, *mc.score(model, device, autocast, compiled=compile))
        run.log_eval(step, val_loss, val_bpb, mc_scores)
        if step > start_step:  # replaces the checkpoint if RunDir.save's rule lets it
            run.save(raw_model, optimizer, train_batches, step)
        window_start = time.time()  # keep evaluation out of the timings
        window_steps = 0
    if last_step:
        break

    # one optimizer step: gradients of accum_steps micro-batches, added up
    factor = lr_factor(step)
    for group, base_lr in zip(optimizer.param_groups, base_lrs):
        group['lr'] = base_lr * factor
    loss_sum = torch.zeros((), device=device)
    for micro_step in range(accum_steps):
        # (through or_fail: a shard deleted since step 0 stops the run in one line)
        x, y = (torch.from_numpy(a) for a in or_fail(train_batches.next))
        if device_type == 'cuda':  # from pinned memory the copy overlaps the GPU's work
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # Under DDP, average the gradients across processes only after the last micro-step.
        sync = nullcontext() if not ddp or micro_step == accum_steps - 1 else model.no_sync()
        with sync:
            with autocast:
                _, loss = model(x, y)
            # Gradients add up over micro-steps; dividing makes them those of the mean loss.
            (loss / accum_steps).backward()
        loss_sum += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip or float('inf'))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    window_steps += 1

    if step % log_interval == 0 or step == max_iters:
        train_loss = sum_over_processes(loss_sum.item() / accum_steps) / world_size  # waits for GPU
        seconds_per_step = (time.time() - window_start) / window_steps
        run.log_step(step, train_loss, grad_norm.item(), base_lrs[0] * factor, seconds_per_step,
                     raw_model)
        window_start = time.time()
        window_steps = 0
    signum = stop_signal() if step < max_iters else 0  # the last step saves as always
    if signum:
        run.save(raw_model, optimizer, train_batches, step, signum)
        break

if ddp:
    dist.barrier()  # rank 0 may still be saving: tearing down under it can abort (SIGABRT) a run
    dist.destroy_process_group()
if step < max_iters:  # stopped by a signal: say how to go on
    run.stop(signum, step)
