"""lab/text.py's keys for the 24-layer comparison with the paper's v1 routers (memory='hidden';
docs/results.md): their rates tuned at 24 layers, then seeds 1-4 and held-out 5-6 beside the
baseline's and v2 static's runs of config/lab/text_depth.py, whose records are copied in
(docs/results.md gives the commands):
    python -m lab.text config/lab/text_depth_v1.py --stage=all
"""
out = 'out/text_depth_v1'
grid_layers = 24
grid_routers = ['static-v1', 'dynamic-v1']
grid_lrs = [3e-3, 6e-3]
grid_inits = ['noisy']
chosen = [(24, 'none', 0.003, 0, 'noisy'), (24, 'static', 0.003, 1, 'identity'),
          (24, 'static-v1', 0.006, 1, 'noisy'), (24, 'dynamic-v1', 0.006, 1, 'noisy')]
heldout_seeds = [5, 6]
