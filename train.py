"""
train.py: train a LIMe or baseline GPT on the token shards that prepare.py writes.

    python train.py config/cpu_demo.py                       # a few minutes on a laptop CPU
    python train.py config/gpt2.py --router=none             # the baseline, on one GPU
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py --router=dynamic

Config files and --key=value set the keys of the defaults block below (`--help` lists them).
out_dir/ckpt.pt is the checkpoint (--init_from=resume continues the run exactly, with its
settings); out_dir/log.txt has a JSON object a line: the settings, then each log line's record.
"""
import ctypes
import math
import os
import shlex
import sys
import time
from contextlib import nullcontext
from dataclasses import fields

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from bookkeeping import RunDir, say
from configurator import configure, fail, or_fail
from lime import GPT, GPTConfig, load_checkpoint
from prepare import (BYTES_VOCAB, Batches, data_tokenizer, nats_and_bytes, prepare_if_default,
                     read_shard, shard_paths, token_bytes)

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
peak_flops = 989e12  # for MFU: bf16 dense peak of one device (H100 SXM)
seed = 1337  # for the initial weights
# -----------------------------------------------------------------------------
# The ranges of the keys that the model does not check itself (GPTConfig checks its own).
KEY_KINDS = {  # upper case: not a key itself
    'positive': ['eval_interval', 'eval_iters', 'log_interval', 'mc_examples', 'batch_size',
                 'gradient_accumulation_steps', 'learning_rate', 'max_iters', 'peak_flops'],
    'non-negative': ['mc_interval', 'router_lr', 'weight_decay', 'grad_clip', 'warmup_iters',
                     'lr_decay_iters', 'min_lr', 'seed'],
    'below one': ['beta1', 'beta2'],
    'path': ['out_dir', 'data_dir'],
    'device': ['device'],
    ('scratch', 'resume'): ['init_from'],
    ('bfloat16', 'float32'): ['dtype'],
}
config, given, autocast = configure(globals(), KEY_KINDS)

# -----------------------------------------------------------------------------
# resume: the run is the checkpoint's. What a machine may change (these keys, and the schedule's
# and the logs' keys when given) is applied; a key that would make it another run is refused.
MACHINE_KEYS = {'out_dir', 'init_from', 'overwrite', 'device', 'dtype', 'compile',
                'checkpoint_blocks', 'peak_flops'}
RUN_KEYS = {'data_dir', 'batch_size', 'block_size', 'eval_iters', 'seed',
            *(f.name for f in fields(GPTConfig))}
checkpoint = None
if config['init_from'] == 'resume':
    if config['overwrite']:
        fail("--overwrite=True replaces the run in out_dir, --init_from=resume continues it: give "
             "one of them")
    # To the CPU: the model moves to its device below (under torchrun, known only then)
    model, checkpoint = or_fail(load_checkpoint, os.path.join(config['out_dir'], 'ckpt.pt'), 'cpu')
    if missing := [key for key in ('config', 'data', 'optimizer', 'rng', 'step', 'val_loss')
                   if key not in checkpoint]:
        fail(f"{config['out_dir']}/ckpt.pt holds no {', '.join(missing)}: not a checkpoint "
             "train.py can resume")
    saved = checkpoint['config']
    saved['data_dir'] = checkpoint['data']['data_dir']  # its real path: one however it is written
    config['data_dir'] = os.path.realpath(config['data_dir'])
    changed = [key for key in sorted(given - MACHINE_KEYS) if config[key] != saved.get(key)]
    for key in changed:
        if key in RUN_KEYS and key in saved:
            fail(f"--{key}={config[key]!r} would make another run than the checkpoint's "
                 f"({key}={saved[key]!r}): train it into another --out_dir")
    config.update({key: value for key, value in saved.items()
                   if key in config and key not in given | MACHINE_KEYS})
    if checkpoint['step'] >= config['max_iters']:
        say(f"the checkpoint is at step {checkpoint['step']}, max_iters is {config['max_iters']}: "
            "nothing to train (a larger --max_iters trains it further)")
        raise SystemExit(0)
    for key in changed:
        say(f"note: resuming with {key}={config[key]!r}, changed from the checkpoint's "
            f"{saved.get(key)!r}")
globals().update(config)
if min_lr > learning_rate:
    fail(f"min_lr ({min_lr}) must not exceed learning_rate ({learning_rate})")
lr_decay_iters = lr_decay_iters or max_iters
config['lr_decay_iters'] = lr_decay_iters  # saved with the run: a resume keeps its schedule
# router_init is the start of v2's static router: the other routers have none, so it goes to the
# model only with it, and a preset's start (config/deep.py) stays out of their way.
model_keys = {f.name: config[f.name] for f in fields(GPTConfig)}
if router != 'static' or memory != 'kv':
    model_keys['router_init'] = 'noisy'
gptconf = model.config if checkpoint is not None else or_fail(GPTConfig, **model_keys)

# -----------------------------------------------------------------------------
# setup: one process, or one per GPU under torchrun
ddp = int(os.environ.get('RANK', -1)) != -1
device_type = 'cuda' if device.startswith('cuda') else 'cpu'
rank = int(os.environ.get('RANK', 0))  # torchrun's number for this process, and how many it runs
world_size = int(os.environ.get('WORLD_SIZE', 1))
if ddp:
    dist.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
    if device_type == 'cuda':
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
if device_type == 'cuda':
    torch.cuda.set_device(device)  # kernels launch on the current device: make it ours
    torch.backends.cuda.matmul.allow_tf32 = True  # float32 matmuls may use TF32 (bf16: no change)
if device_type == 'cpu' and sys.platform == 'linux':
    # glibc hands each step's large freed blocks (the logits) back to the OS and faults them in
    # again at the next step: keeping up to 1 GiB of freed heap made CPU steps 1.4-1.6x faster
    mallopt = getattr(ctypes.CDLL(None), 'mallopt', None)  # None: not glibc (musl, on Alpine)
    if mallopt is not None:
        mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: blocks up to 1 GiB come from the heap
        mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: and the heap is not trimmed below that

if gradient_accumulation_steps % world_size:
    fail(f"gradient_accumulation_steps ({gradient_accumulation_steps}) must be a multiple of the "
         f"number of processes ({world_size})")
accum_steps = gradient_accumulation_steps // world_size  # micro-steps on this process
tokens_per_step = batch_size * block_size * gradient_accumulation_steps
say(f"tokens per step: {tokens_per_step:,} = {batch_size} batch x {block_size} block x "
    f"{gradient_accumulation_steps} micro-steps ({world_size} process{'es' * (world_size > 1)})")
if max_iters <= warmup_iters:
    say(f"note: max_iters={max_iters} ends within the warmup (warmup_iters={warmup_iters}): the "
        f"learning rate rises all run, to {max_iters / warmup_iters:.0%} of its peak, no decay")
torch.manual_seed(seed)

# -----------------------------------------------------------------------------
# data: every training shard is checked now, before step 0 (prepare.Batches reads them all)
if rank == 0:  # data/pydoc(_bytes), missing: made now, so the quick start needs no prepare step
    or_fail(prepare_if_default, data_dir)
if ddp:
    dist.barrier()  # the other processes read the data once it is there
# The data's tokenizer goes into the run's settings, so that sample.py decodes with it.
config['tokenizer'] = or_fail(data_tokenizer, data_dir)
if config['tokenizer'] == 'bytes' and vocab_size != BYTES_VOCAB:
    fail(f"{data_dir} holds byte-level shards: train on them with --vocab_size={BYTES_VOCAB}")
B, T = batch_size, block_size
train_batches = or_fail(Batches, data_dir, B, T, rank, world_size, vocab_size, say)
val_tokens = or_fail(read_shard, or_fail(shard_paths, data_dir, 'val')[0], vocab_size)
val_batches = min(eval_iters, (len(val_tokens) - 1) // (B * T))
if val_batches == 0:
    fail(f"the validation shard holds {len(val_tokens):,} tokens, fewer than one batch "
         f"(batch_size * block_size = {B * T:,}): lower them, as config/cpu_demo.py does")
if val_batches < eval_iters:
    say(f"note: the validation shard fits only {val_batches} of eval_iters={eval_iters} batches")
val_tokens = np.array(val_tokens[:val_batches * B * T + 1])  # what every evaluation reads
# Bits per byte needs each token's UTF-8 bytes: known for GPT-2, bytes, and arith.py's characters.
byte_counts, why = token_bytes(vocab_size, data_dir)
if byte_counts is None:
    say(f"note: no bits per byte in the evaluations: {why}")
else:
    byte_counts = torch.from_numpy(byte_counts).to(device)

if mc_interval:  # a multiple-choice task, scored during training: lab/evaluate.py does that
    from lab.evaluate import TaskScorer
    mc = TaskScorer.for_training(config, rank, world_size)

# -----------------------------------------------------------------------------
# model and optimizer
if checkpoint is None:
    model = GPT(gptconf)
model.to(device).train()
model.checkpoint_blocks = checkpoint_blocks  # how to run, not what: not saved with the model
optimizer = model.configure_optimizers(weight_decay, learning_rate, router_lr, (beta1, beta2),
                                       fused=device_type == 'cuda')
base_lrs = [group['lr'] for group in optimizer.param_groups]  # the schedule scales each of these
step = 0
if checkpoint is not None:
    step = checkpoint['step']
    # The moments are the checkpoint's; each group's settings (betas, weight_decay) today's
    settings = [{k: v for k, v in group.items() if k != 'params'}
                for group in optimizer.param_groups]
    optimizer.load_state_dict(checkpoint['optimizer'])
    for group, today in zip(optimizer.param_groups, settings):
        group.update(today)
    torch.set_rng_state(checkpoint['rng']['cpu'])
    if device_type == 'cuda' and checkpoint['rng']['cuda'] is not None:
        torch.cuda.set_rng_state(checkpoint['rng']['cuda'])
    or_fail(train_batches.restore, checkpoint['data'])
    say(f"resumed from {config['out_dir']}/ckpt.pt at step {step}")
say(f"model: {model.num_params() / 1e6:.2f}M parameters, router={gptconf.router}")
run = RunDir(config, {'config': config, 'params': model.num_params(),  # out_dir's files
                      'flops_per_token': model.flops_per_token()}, checkpoint)
checkpoint = None  # free the memory

raw_model = model  # the model itself: its state dict is what checkpoints hold
if compile:
    say("compiling the model (a minute or so)...")
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
    """The stop signal to stop on after this step, 0 while none has come. Under DDP all stop at
    one step, on the signal any got: asked at log steps only (the all_reduce waits for the GPU)."""
    if not ddp:
        return run.signum
    if step % log_interval and step != max_iters:
        return 0
    signum = torch.tensor(run.signum, device=device)
    dist.all_reduce(signum, op=dist.ReduceOp.MAX)
    return signum.item()


def sum_over_processes(value):
    value = torch.tensor(value, dtype=torch.float64, device=device)
    if ddp:
        dist.all_reduce(value)
    return value.item()


@torch.no_grad()
def evaluate():
    """Mean loss and bits per byte (None where unknown: prepare.nats_and_bytes says how) over the
    first val_batches batches of the validation shard, for any number of processes the same."""
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
            n, b = nats_and_bytes(losses, y.flatten(), byte_counts)
            nats += n
            nbytes += b
    model.train()
    nbytes = sum_over_processes(nbytes)
    bpb = sum_over_processes(nats) / (math.log(2) * nbytes) if nbytes else None
    return sum_over_processes(loss) / val_batches, bpb


# -----------------------------------------------------------------------------
# training loop
start_step = step
window_start = time.time()  # steps are timed over the window since the last log line
window_steps = 0
while True:
    last_step = step >= max_iters
    # evaluate, log and save a checkpoint (at step 0 of a new run: evaluate only)
    if (step % eval_interval == 0 or last_step) and (step > start_step or init_from == 'scratch'):
        val_loss, val_bpb = evaluate()
        line = f"step {step}/{max_iters} | val loss {val_loss:.4f}"
        record = {'step': step, 'val_loss': val_loss}
        if val_bpb is not None:
            line += f" | bpb {val_bpb:.4f}"
            record['val_bpb'] = val_bpb
        if mc_interval and (step % mc_interval == 0 or last_step):
            acc, acc_norm = mc.score(model, device, autocast, compiled=compile)
            line += f" | {mc.name} acc {acc:.4f} acc_norm {acc_norm:.4f}"
            record.update(mc_acc=acc, mc_acc_norm=acc_norm)
        say(line)
        run.write(record)
        if step > start_step:
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
        x, y = (torch.from_numpy(a) for a in train_batches.next())
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
        grad_norm = grad_norm.item()
        seconds_per_step = (time.time() - window_start) / window_steps
        tokens_per_sec = tokens_per_step / seconds_per_step
        lr = base_lrs[0] * factor
        line = (f"step {step}/{max_iters} | loss {train_loss:.4f} | lr {lr:.2e} "
                f"| norm {grad_norm:.3f} | {seconds_per_step * 1000:.1f} ms "
                f"| {tokens_per_sec:,.0f} tok/s")
        if device_type == 'cuda':
            mfu = raw_model.estimate_mfu(tokens_per_sec / world_size, peak_flops)
            line += f" | mfu {mfu:.1%}"
        minutes_left = seconds_per_step * (max_iters - step) / 60
        line += f" | eta {minutes_left / 60:.1f} h" if minutes_left > 90 else \
            f" | eta {minutes_left:.1f} min"
        say(line)
        run.write({'step': step, 'train_loss': train_loss, 'lr': lr, 'grad_norm': grad_norm,
                   'ms_per_step': seconds_per_step * 1000, 'tokens_per_sec': tokens_per_sec})
        window_start = time.time()
        window_steps = 0
    if (signum := stop_signal()) and step < max_iters:  # (the last step saves as always)
        run.stop(signum, raw_model, optimizer, train_batches, step)
        break

if ddp:
    dist.barrier()  # rank 0 may still be saving: tearing down under it can abort (SIGABRT) a run
    dist.destroy_process_group()
if step < max_iters:  # stopped by a signal: exit as a shell says it stopped it
    raise SystemExit(128 + signum)
say(f"next: python sample.py {shlex.quote(f'--out_dir={out_dir}')}")
