"""The paper's deep-narrow models: 256 wide, 8 heads, SwiGLU 1024, 32 layers here; the paper also
trains 64 and 128 (--n_layer=64), where LIMe's lead grows (a 64-layer LIMe beats a 128-layer LLaMA).
Routing reads O(n_layer^2) keys/values per token, so a deep LIMe step costs noticeably more.
bench.py's `deep` shape times this model at 64 layers (and a 1,024-token block). Where its
activations do not fit, --checkpoint_blocks=True keeps only each block's input and recomputes the
rest in the backward pass (docs/performance.md: on a CPU at 32 layers x 64, a fifth to a third of
a LIMe step's peak memory, for 1.35-1.5x its time).
    python train.py config/deep.py --router=none --max_iters=5000
"""
out_dir = 'out/deep'
data_dir = 'data/fineweb_edu'
n_layer = 32
n_head = 8
n_embd = 256
mlp_hidden = 1024
# Static LIMe starts from the identity alone (each layer reads its own keys and values, the
# baseline's model), not from the authors' identity plus noise: tuned at 24 layers, it trained to
# a lower loss than the authors' start on every seed run (docs/results.md, "Depth, fairly").
# --router_init=noisy gives the authors' start; --router=none and dynamic leave the key aside.
router_init = 'identity'
block_size = 2048
batch_size = 16
gradient_accumulation_steps = 64  # 16 x 64 = 1024 sequences = 2.1M tokens per step, as in the paper
max_iters = 20000
warmup_iters = 200
eval_interval = 500
