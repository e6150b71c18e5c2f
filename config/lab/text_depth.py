"""
config/lab/text_depth.py: a config file of lab/text.py's keys (not train.py's). LIMe at depth,
fairly (docs/results.md): the rates tuned at 24 layers, for the baseline and for static LIMe from
both of its starts (router_init: the authors' identity plus noise, and the identity alone), then
the two compared at the rates each chose over seeds 1-4, at 24 layers and at 8 (there with the
8-layer grid's rates), and two held-out seeds after. Every stage, in one command (finished runs
are kept, an interrupted one resumes):
    python -m lab.text config/lab/text_depth.py --stage=all
"""
out = 'out/text_depth'
grid_layers = 24
grid_routers = 'none,static'
grid_lrs = '3e-3,6e-3,1e-2'
grid_router_x = '1,3'
grid_inits = 'noisy,identity'
# The 24-layer grid's choice (docs/results.md), as its `as chosen` line gives it; at 8 layers, the
# 8-layer grid's rates with the start the 24-layer grid chose.
chosen = '24/none:0.003:0,24/static:0.003:1:identity,8/none:1e-2:0,8/static:1e-2:1:identity'
depths = '24,8'
deep_routers = 'none,static'
seeds = '1,2,3,4'
heldout_seeds = '5,6'
