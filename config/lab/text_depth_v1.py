"""
config/lab/text_depth_v1.py: a config file of lab/text.py's keys (not train.py's). The 24-layer
comparison of docs/results.md ("Depth, fairly") with the paper's v1 routers (memory='hidden'):
their rates tuned at 24 layers on one seed, then the chosen setting at seeds 1-4 and held-out
seeds 5-6, beside the baseline and v2 static at the rates config/lab/text_depth.py chose. Those
two are the same runs as there (same data, preset, steps, seeds): copy their records,
docs/runs/text_depth/compare/<name>.json and .log.txt, to out/text_depth_v1/compare/<name>/ as
final.json and log.txt, and the command keeps them, training only the v1 runs:
    python -m lab.text config/lab/text_depth_v1.py --stage=grid
    python -m lab.text config/lab/text_depth_v1.py --stage=compare
"""
out = 'out/text_depth_v1'
grid_layers = 24
grid_routers = 'static-v1,dynamic-v1'
grid_lrs = '3e-3,6e-3'
grid_router_x = '1,3,10'
grid_inits = 'noisy'
# the grid's `as chosen` line, after config/lab/text_depth.py's 24-layer rates
chosen = '24/none:0.003:0,24/static:0.003:1:identity,24/static-v1:0.006:1,24/dynamic-v1:0.006:1'
depths = '24'
deep_routers = 'static-v1,dynamic-v1'
seeds = '1,2,3,4'
heldout_seeds = '5,6'
