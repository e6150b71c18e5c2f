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
import glob
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import fields
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import configure, fail, or_fail
from lime import GPT, GPTConfig, load_checkpoint, save_checkpoint, use_fused_kernels
from prepare import Batches, read_shard, shard_paths, token_bytes

# -----------------------------------------------------------------------------
# default config values: a GPT-2-small-shaped LIMe model on FineWeb-Edu, on one GPU
# I/O
out_dir = 'out'  # where ckpt.pt and log.txt go; one run per out_dir
data_dir = 'data/fineweb_edu'  # the token shards written by prepare.py
eval_interval = 250  # steps between evaluations (and checkpoints)
eval_iters = 20  # batches of the validation shard per evaluation, always the same ones
log_interval = 10  # steps between log lines
always_save_checkpoint = True  # save at every evaluation, not only when val loss improves
init_from = 'scratch'  # 'scratch' or 'resume' (out_dir/ckpt.pt, with the settings saved in it)
overwrite = False  # replace a run already in out_dir (without this, a scratch run is refused)
mc_task = ''  # a multiple-choice task to score: 'hellaswag' or a task file (lab/evaluate.py)
mc_interval = 0  # steps between those scorings, a multiple of eval_interval; 0 = never
mc_examples = 1000  # the task's first this many examples, shared among processes
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
fused = None  # LIMe's mix in Triton kernels: None = on CUDA with triton, or True / False
peak_flops = 989e12  # for MFU: bf16 dense peak of one device (H100 SXM)
seed = 1337  # for the initial weights
# -----------------------------------------------------------------------------
config, given, autocast = configure(globals(), {  # what each key may hold (configurator.KINDS)
    'path': ['out_dir', 'data_dir'], 'text': ['mc_task'], 'positive': [
        'eval_interval', 'eval_iters', 'log_interval', 'mc_examples', 'n_layer', 'n_head', 'n_embd',
        'block_size', 'rope_base', 'vocab_size', 'batch_size', 'gradient_accumulation_steps',
        'learning_rate', 'max_iters', 'peak_flops'], 'non-negative': [
        'mc_interval', 'n_kv_head', 'mlp_hidden', 'hyper_connections', 'router_lr', 'weight_decay',
        'grad_clip', 'warmup_iters', 'lr_decay_iters', 'min_lr'], 'fraction': ['router_top_p'],
    'below one': ['beta1', 'beta2'], 'seed': ['seed'], 'device': ['device'], ('scratch', 'resume'):
    ['init_from'], ('none', 'static', 'dynamic'): ['router'], ('bfloat16', 'float32'): ['dtype']})
globals().update(config)

# -----------------------------------------------------------------------------
# setup: one process, or one per GPU under torchrun
ddp = int(os.environ.get('RANK', -1)) != -1
device_type = 'cuda' if device.startswith('cuda') else 'cpu'
rank, world_size = 0, 1
if ddp:
    dist.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if device_type == 'cuda':
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
if device_type == 'cuda' and ':' in device:
    torch.cuda.set_device(device)  # kernels launch on the current device: make it ours
master = rank == 0  # only it logs and writes checkpoints
log = partial(print, flush=True) if master else (lambda *args: None)
if device_type == 'cpu' and sys.platform == 'linux':
    # glibc hands big freed blocks (each step's logits) back to the OS and faults them in again
    # at the next step; keeping up to 1 GiB of freed heap made CPU steps 1.4-1.6x faster.
    try:  # mallopt M_MMAP_THRESHOLD (-3), M_TRIM_THRESHOLD (-1): heap blocks, kept when freed
        for option in (-3, -1):
            ctypes.CDLL('libc.so.6').mallopt(option, 1 << 30)
    except OSError:  # not glibc (musl, say): nothing to tune
        pass


# -----------------------------------------------------------------------------
# resume: the run that was saved, not today's defaults. The model is the checkpoint's (an override
# that contradicts it is a mistake); so are data, schedule and evaluation unless given again (the
# log says so). What belongs to this machine is today's: out_dir, device, dtype, compile, fused.
model_keys = [f.name for f in fields(GPTConfig)]
own_keys = {'out_dir', 'init_from', 'overwrite', 'device', 'dtype', 'compile', 'fused',
            'peak_flops'}
ckpt_path = os.path.join(out_dir, 'ckpt.pt')
model, checkpoint = None, None
if init_from == 'resume':
    model, checkpoint = or_fail(load_checkpoint, ckpt_path, device, (
        'optimizer', 'step', 'best_val_loss', 'config', 'data', 'rng'))
    saved = checkpoint['config']  # its schedule's length, kept (older checkpoints saved 0)
    saved['lr_decay_iters'] = saved.get('lr_decay_iters') or saved.get('max_iters', 0)
    defaults = {f.name: f.default for f in fields(GPTConfig)}  # older checkpoints lack new keys
    for key in sorted(given - own_keys):
        old = saved.get(key, defaults.get(key))
        if key in model_keys and config[key] != old:
            fail(f"--{key}={config[key]} contradicts the checkpoint's {old!r}")
        if key in saved and config[key] != old:
            log(f"note: resuming with {key}={config[key]!r}, changed from the checkpoint's {old!r}")
    config.update({key: saved[key] for key in saved.keys() & config.keys() - own_keys - given})
    globals().update(config)
gptconf = model.config if model else or_fail(GPTConfig, **{k: config[k] for k in model_keys})
or_fail(use_fused_kernels, fused, device)

if min_lr > learning_rate:
    fail(f"min_lr ({min_lr}) must not exceed learning_rate ({learning_rate})")
if gradient_accumulation_steps % world_size:
    fail(f"gradient_accumulation_steps ({gradient_accumulation_steps}) must be a multiple of the "
         f"number of processes ({world_size})")
accum_steps = gradient_accumulation_steps // world_size  # micro-steps on this process
tokens_per_step = batch_size * block_size * gradient_accumulation_steps
config['lr_decay_iters'] = lr_decay_iters = lr_decay_iters or max_iters  # saved: a resume keeps it
log(f"tokens per step: {tokens_per_step:,} = {batch_size} batch x {block_size} block x "
    f"{gradient_accumulation_steps} micro-steps ({world_size} process{'es' * (world_size > 1)})")
torch.manual_seed(seed)

# -----------------------------------------------------------------------------
# data: every shard is checked now, before step 0 (prepare.Batches reads them all)
if not os.path.isdir(data_dir):  # checked before a model is built, which can take a while
    fail(f"data_dir not found: {data_dir} (prepare.py writes shards: `--source fineweb` for "
         "data/fineweb_edu; to start small, `python prepare.py` for config/cpu_demo.py)")
B, T = batch_size, block_size
train_batches = or_fail(Batches, data_dir, B, T, rank, world_size, vocab_size, log)
val_tokens = or_fail(read_shard, or_fail(shard_paths, data_dir, 'val')[0], vocab_size)
val_batches = min(eval_iters, (len(val_tokens) - 1) // (B * T))
if val_batches == 0:
    fail(f"the validation shard holds {len(val_tokens):,} tokens, fewer than one batch "
         f"(batch_size * block_size = {B * T:,}): lower them, as config/cpu_demo.py does")
if val_batches < eval_iters:
    log(f"note: the validation shard fits only {val_batches} of eval_iters={eval_iters} batches")
# Bits per byte needs each token's UTF-8 bytes: known for GPT-2, and for arith.py's characters.
byte_counts, why = token_bytes(vocab_size, data_dir)
if byte_counts is None:
    log(f"note: no bits per byte in the evaluations: {why}")
else:
    byte_counts = torch.from_numpy(byte_counts).to(device)

if mc_interval:  # a multiple-choice task, scored during training: lab/evaluate.py does that
    if not mc_task:
        fail("mc_interval needs mc_task: 'hellaswag' or a task file")
    if mc_interval % eval_interval:
        fail(f"mc_interval ({mc_interval}) must be a multiple of eval_interval ({eval_interval})")
    from lab.evaluate import TaskScorer
    mc = TaskScorer(mc_task, mc_examples, vocab_size, block_size, rank, world_size)
step = checkpoint['step'] if checkpoint is not None else 0


# -----------------------------------------------------------------------------
# out_dir: one run at a time, and no run lost to a repeated command
def claim_out_dir(header):
    """out_dir/log.txt, opened with the run's record (header), locked while this process lives (a
    second run is refused). A scratch run refuses a run there unless told to overwrite it; a
    resumed run drops the records written after its checkpoint."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        log_file = open(os.path.join(out_dir, 'log.txt'), 'a+', errors='replace')
    except OSError as e:
        fail(f"cannot write to out_dir {out_dir}: {e.strerror}")
    try:
        import fcntl  # POSIX file locks; Windows has none: keep to one run per out_dir by hand
        fcntl.flock(log_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:
        pass
    except BlockingIOError:
        fail(f"another run is training into {out_dir}: wait for it, or choose another --out_dir")
    for name in glob.glob(os.path.join(glob.escape(out_dir), 'ckpt.pt.*.tmp')):
        os.remove(name)  # a checkpoint half-written by a killed run: useless
    log_file.seek(0)
    records = log_file.readlines()
    if init_from == 'scratch':
        held = ['ckpt.pt'] * os.path.exists(ckpt_path) + ['log.txt'] * bool(records)
        if held and not overwrite:
            fail(f"{out_dir} holds a run ({', '.join(held)}): continue it with --init_from=resume,"
                 " train into another --out_dir, or replace it with --overwrite=True")
        if held:
            log(f"note: --overwrite=True: replacing the run in {out_dir}")
            if 'ckpt.pt' in held:
                os.remove(ckpt_path)
        records = []
    else:  # a record cut short by the kill goes too, and the old run record gives way to ours
        try:
            records = [r for r in records
                       if r.endswith('\n') and json.loads(r).get('step', step + 1) <= step]
        except (ValueError, AttributeError) as e:  # edited by hand, or another file
            fail(f"{out_dir}/log.txt is not train.py's log ({e}): move it away to resume")
    log_file.truncate(0)  # in append mode every write goes to the end, here the start
    log_file.writelines([json.dumps(header) + '\n'] + records)
    log_file.flush()
    return log_file


# -----------------------------------------------------------------------------
# model and optimizer
model = (model or GPT(gptconf)).to(device).train()
optimizer = model.configure_optimizers(weight_decay, learning_rate, router_lr, (beta1, beta2),
                                       fused=device_type == 'cuda')
base_lrs = [group['lr'] for group in optimizer.param_groups]  # the schedule scales each of these
best_val_loss, saved_step = float('inf'), None
if checkpoint is not None:
    best_val_loss, saved_step = checkpoint['best_val_loss'], step
    try:  # the data position means nothing in other data (older checkpoints: the path as given)
        trained_on = checkpoint['data'].get('data_dir', os.path.realpath(saved['data_dir']))
        optimizer.load_state_dict(checkpoint['optimizer'])
        torch.set_rng_state(checkpoint['rng']['cpu'])
        if device_type == 'cuda' and checkpoint['rng']['cuda'] is not None:
            torch.cuda.set_rng_state(checkpoint['rng']['cuda'])
        if os.path.realpath(data_dir) == trained_on:
            train_batches.restore(checkpoint['data'])
        else:
            log(f"note: {data_dir} is read from its start")
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:  # edited by hand?
        fail(f"cannot resume from {ckpt_path}: {e if type(e) is ValueError else repr(e)}")
    log(f"resumed from {ckpt_path} at step {step}")
    checkpoint = None  # free the memory
log(f"model: {model.num_params() / 1e6:.2f}M parameters, router={gptconf.router}")
log_file = claim_out_dir({'config': config, 'params': model.num_params(),
                          'flops_per_token': model.flops_per_token()}) if master else None

raw_model = model  # the uncompiled module: its state dict is what checkpoints hold
if compile:
    log("compiling the model (a minute or so)...")
    model = torch.compile(model)
eval_model = model  # evaluation needs no gradient averaging
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
    eval_model.eval()
    loss = nats = nbytes = 0.0
    for i in range(rank, val_batches, world_size):
        buf = torch.from_numpy(val_tokens[i * B * T:(i + 1) * B * T + 1].astype(np.int64))
        x, y = buf[:-1].view(B, T).to(device), buf[1:].view(B, T).to(device)
        with autocast:
            logits, _ = eval_model(x)
        losses = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction='none')
        loss += losses.mean().item()
        if byte_counts is not None:
            text_bytes = byte_counts[y.flatten()]
            nats += (losses * (text_bytes > 0)).sum().item()
            nbytes += text_bytes.sum().item()
    eval_model.train()
    nbytes = sum_over_processes(nbytes)
    bpb = sum_over_processes(nats) / (math.log(2) * nbytes) if nbytes else None
    return sum_over_processes(loss) / val_batches, bpb


def save():
    """Everything a resumed run needs, in one checkpoint (written atomically by lime.py)."""
    rng = {'cpu': torch.get_rng_state(),
           'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None}
    try:
        save_checkpoint(ckpt_path, raw_model, optimizer=optimizer.state_dict(), step=step, rng=rng,
                        best_val_loss=best_val_loss, config=config, data=train_batches.state())
    except OSError as e:  # a full disk, say: the previous checkpoint is still whole
        fail(f"could not write {ckpt_path}: {e.strerror or e}")


def stop_if_not_finite(value, what):
    if not math.isfinite(value):
        fail(f"{what} is {value} at step {step}: stopping. " + (
            f"The last good checkpoint ({ckpt_path}, step {saved_step}) is kept: resume from it "
            "with --init_from=resume and a lower learning_rate" if saved_step is not None else
            f"No checkpoint was saved before it (the first comes at step "
            f"{min(eval_interval, max_iters)}): start again with a lower learning_rate and "
            "--overwrite=True"))


# -----------------------------------------------------------------------------
# training loop
start_step = step
if step >= max_iters:
    log(f"the checkpoint is at step {step}, max_iters is {max_iters}: nothing to train")
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
            acc, acc_norm = mc.score(eval_model, device, autocast, compiled=compile)
            line += f" | {mc.name} acc {acc:.4f} acc_norm {acc_norm:.4f}"
            record.update(mc_acc=acc, mc_acc_norm=acc_norm)
        log(line)
        stop_if_not_finite(val_loss, 'the validation loss')
        if master:
            print(json.dumps(record), file=log_file, flush=True)
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
        stop_if_not_finite(train_loss, 'the training loss')
        stop_if_not_finite(grad_norm.item(), 'the gradient norm')  # the weights are poisoned too
        dt = (time.time() - window_start) / window_steps
        tokens_per_sec = tokens_per_step / dt
        line = (f"step {step}/{max_iters} | loss {train_loss:.4f} | lr {base_lrs[0] * factor:.2e} "
                f"| norm {grad_norm.item():.3f} | {dt * 1000:.1f} ms | {tokens_per_sec:,.0f} tok/s")
        if device_type == 'cuda':
            line += f" | mfu {raw_model.estimate_mfu(tokens_per_sec / world_size, peak_flops):.1%}"
        eta = dt * (max_iters - step) / 60  # minutes
        log(line + (f" | eta {eta / 60:.1f} h" if eta > 90 else f" | eta {eta:.1f} min"))
        if master:
            print(json.dumps({'step': step, 'train_loss': train_loss, 'lr': base_lrs[0] * factor,
                              'grad_norm': grad_norm.item(), 'ms_per_step': dt * 1000,
                              'tokens_per_sec': tokens_per_sec}), file=log_file, flush=True)
        window_start, window_steps = time.time(), 0

if ddp:
    dist.barrier()  # rank 0 may still be saving: tearing down under it can abort (SIGABRT) a run
    dist.destroy_process_group()
