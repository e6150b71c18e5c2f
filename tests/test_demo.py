"""
lab/demo.py, the class demonstration, at a tiny size: both runs train side by side, their
validation losses print as they come, then the table and the gap. (Whether LIMe ends below the
baseline at the full size is docs/teaching.md's measurement, not a test's.)
"""
from conftest import run


def test_demo_trains_both_side_by_side_and_prints_their_losses(tmp_path):
    run('lab/arith.py', '--mode=prepare', f'--out_dir={tmp_path / "arith"}', '--train_per_ops=300',
        '--val_per_ops=150', '--max_ops=2')
    result = run('lab/demo.py', '--max_iters=4', f'--data_dir={tmp_path / "arith"}',
                 f'--out_dir={tmp_path / "demo"}')
    lines = result.stdout.splitlines()
    for step in (0, 4):
        assert any(line.startswith(f'step {step:>5}: validation loss none ') and ', static ' in line
                   for line in lines), result.stdout
    assert any(line.startswith('both trained in ') for line in lines), result.stdout
    assert any(line.startswith('| static | ') and '(step 4)' in line for line in lines)
    assert "perplexity per character is" in result.stdout or 'the baseline ended lower' in result.stdout
    for router in ('none', 'static'):
        assert (tmp_path / 'demo' / f'{router}_s1' / 'log.txt').is_file()
