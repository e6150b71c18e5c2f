"""The paper's deep-narrow models, 32 layers here; the paper also trains 64 and 128 (--n_layer=64).
Where activations do not fit, --checkpoint_blocks=True recomputes each block in the backward pass
(docs/performance.md measures what it saves and costs).
    python train.py config/deep.py --router=none --max_iters=5000
"""
out_dir = 'out/deep'
n_layer = 32
n_head = 8
n_embd = 256
mlp_hidden = 1024
# Static LIMe starts as the baseline's model, not the authors' identity plus noise: at 24 layers it
# trained to a lower loss on every seed (docs/results.md, "Depth, fairly"). Other routers ignore it.
router_init = 'identity'
block_size = 2048
batch_size = 16
gradient_accumulation_steps = 64  # 16 x 64 = 1024 sequences = 2.1M tokens per step, as in the paper
eval_interval = 500
