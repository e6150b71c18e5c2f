"""lab/text.py's keys for the comparison of docs/results.md's "Text, fairly": at the rates the
8-layer grid chose (none at 1e-2; static at 1e-2, router 1x; dynamic at 1e-2, router 3x), none,
static and dynamic at 8 layers and none and static at 24, seeds 1-4:
    python -m lab.text config/lab/text.py --stage=compare
"""
chosen = [(8, 'none', 1e-2, 0, 'noisy'), (8, 'static', 1e-2, 1, 'noisy'),
          (8, 'dynamic', 1e-2, 3, 'noisy'), (24, 'none', 1e-2, 0, 'noisy'),
          (24, 'static', 1e-2, 1, 'noisy')]
