"""lab/text.py's keys for LIMe at depth, fairly (docs/results.md): rates tuned at 24 layers for the
baseline and static LIMe from both starts, then the two compared at the rates chosen, seeds 1-4 and
held-out 5-6, at 24 layers and at 8 (the 8-layer grid's rates). Every stage, in one command:
    python -m lab.text config/lab/text_depth.py --stage=all
"""
out = 'out/text_depth'
grid_layers = 24
grid_routers = ['none', 'static']
grid_lrs = [3e-3, 6e-3, 1e-2]
grid_router_x = [1, 3]
grid_inits = ['noisy', 'identity']
chosen = [(24, 'none', 0.003, 0, 'noisy'), (24, 'static', 0.003, 1, 'identity'),
          (8, 'none', 1e-2, 0, 'noisy'), (8, 'static', 1e-2, 1, 'identity')]
heldout_seeds = [5, 6]
