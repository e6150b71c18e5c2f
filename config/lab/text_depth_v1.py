"""
config/lab/text_depth_v1.py: a config file of lab/text.py's keys (not train.py's). The 24-layer
comparison of docs/results.md ("Depth, fairly") with the paper's v1 routers (memory='hidden'):
their rates tuned at 24 layers on one seed, then the chosen setting at seeds 1-4 and held-out
seeds 5-6, against the baseline's and v2 static's records of config/lab/text_depth.py
(docs/runs/text_depth):
    python -m lab.text config/lab/text_depth_v1.py --stage=grid
"""
out = 'out/text_depth_v1'
grid_layers = 24
grid_routers = 'static-v1,dynamic-v1'
grid_lrs = '3e-3,6e-3'
grid_router_x = '1,3,10'
grid_inits = 'noisy'
chosen = '24/static-v1:0.006:1,24/dynamic-v1:0.006:1'  # the grid's `as chosen` line
depths = '24'
deep_routers = 'static-v1,dynamic-v1'
seeds = '1,2,3,4'
heldout_seeds = '5,6'
