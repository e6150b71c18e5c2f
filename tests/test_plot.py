"""
Tests for plot.py and compare.sh: the figures and tables from fabricated logs (with and without
matplotlib), and the three-router comparison end to end at a tiny shape on the CPU.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from lab import plot as plot_py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: scripts run from there
HAVE_MATPLOTLIB = importlib.util.find_spec('matplotlib') is not None
# Runs plot.py as `python -m lab.plot ARGS` would, but with `import matplotlib` failing.
WITHOUT_MATPLOTLIB = ("import runpy, sys; sys.modules['matplotlib'] = None; "
                      "runpy.run_module('lab.plot', run_name='__main__', alter_sys=True)")


def plot(*args, matplotlib=True, check=True):
    command = ['-m', 'lab.plot'] if matplotlib else ['-c', WITHOUT_MATPLOTLIB]
    result = subprocess.run([sys.executable, *command, *args], capture_output=True, text=True, cwd=ROOT,
                            timeout=120)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def fake_run(path, router, seed, n_layer=4, accuracy=None, final_val=2.0, **settings):
    """An out_dir as train.py (and arith.py, given accuracy {n_ops: share}) would leave it."""
    os.makedirs(path)
    config = {'router': router, 'seed': seed, 'n_layer': n_layer, 'batch_size': 2, 'block_size': 8,
              'gradient_accumulation_steps': 1, 'hyper_connections': 0, 'out_dir': str(path),
              **settings}
    records = [{'config': config, 'params': 1000, 'flops_per_token': 6000}]
    for step in range(0, 101, 10):
        records.append({'step': step, 'train_loss': 3.0 - step / 100, 'lr': 1e-3,
                        'ms_per_step': 100.0, 'tokens_per_sec': 160.0})  # 2 x 8 tokens a step
        if step % 50 == 0:
            records.append({'step': step, 'val_loss': final_val + 1 - step / 100, 'val_bpb': 1.0})
    with open(os.path.join(path, 'log.txt'), 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in records)
    if accuracy is not None:  # of the checkpoint at step 100: its best val loss is the last
        result = {'router': router, 'accuracy': {str(k): v for k, v in accuracy.items()},
                  'accuracy_all': {str(k): 0.99 for k in accuracy}, 'step': 100,
                  'best_val_loss': records[-1]['val_loss']}
        with open(os.path.join(path, 'arith_eval.json'), 'w') as f:
            f.write(json.dumps(result) + '\n')
    return str(path)


@pytest.fixture
def runs(tmp_path):
    """none and static, two seeds each, at 4 layers; static also at 8 layers."""
    made = {}
    for router, seed, n_layer, six in [('none', 1, 4, 0.10), ('none', 2, 4, 0.20), ('static', 1, 4, 0.50),
                                        ('static', 2, 4, 0.70), ('static', 1, 8, 0.90)]:
        made[router, seed, n_layer] = fake_run(tmp_path / f'L{n_layer}_{router}_s{seed}', router, seed, n_layer,
                                               accuracy={1: None, 5: 0.8, 6: six}, final_val=2.0 + seed / 10)
    return made


@pytest.mark.optional
@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='matplotlib is not installed')
def test_loss_curves_are_drawn_with_a_row_per_run(runs, tmp_path):
    four_layers = [d for (r, s, n), d in runs.items() if n == 4]
    result = plot(f"--runs={','.join(four_layers)}", f'--out={tmp_path / "curves.png"}')
    rows = [line for line in result.stdout.splitlines() if line.startswith('| ') and ' seed ' in line]
    assert [row.split(' | ')[0] for row in rows] == ['| none seed 1', '| none seed 2', '| static seed 1',
                                                     '| static seed 2']
    assert '2.1000 (step 100)' in rows[0] and '2.2000 (step 100)' in rows[1]  # the last val loss
    assert '| none | 2 | 2.1500 ± 0.0707 (step 100) |' in result.stdout, result.stdout  # seeds'
    with open(tmp_path / 'curves.png', 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_without_matplotlib_the_table_prints_and_one_line_says_how_to_install_it(runs, tmp_path):
    result = plot(f"--runs={tmp_path}/L4_*", f'--out={tmp_path / "curves.png"}', matplotlib=False, check=False)
    assert result.returncode != 0 and result.stderr.strip().count('\n') == 0, result.stderr
    assert 'pip install matplotlib' in result.stderr and 'Traceback' not in result.stderr
    assert '| static seed 2 |' in result.stdout and not (tmp_path / 'curves.png').exists()


@pytest.mark.optional  # the figure too, where matplotlib is installed
def test_arith_table_gives_mean_and_spread_over_seeds(runs, tmp_path):
    result = plot('--mode=arith', f"--runs={tmp_path}/L4_*", f'--out={tmp_path / "a.png"}',
                  matplotlib=HAVE_MATPLOTLIB, check=HAVE_MATPLOTLIB)
    row = next(line for line in result.stdout.splitlines() if line.startswith('| 6 |'))
    # none: 10% and 20% -> 15.0 ± 7.1; static: 50% and 70% -> 60.0 ± 14.1 (sample standard deviation)
    assert row == '| 6 | 7 | 15.0 ± 7.1 | 60.0 ± 14.1 |', row
    one = next(line for line in result.stdout.splitlines() if line.startswith('| 1 |'))
    assert '99.0 ± 0.0' in one  # no held-out expression with one operator: accuracy over all of them
    assert (tmp_path / 'a.png').exists() == HAVE_MATPLOTLIB


@pytest.mark.optional  # the figure too, where matplotlib is installed
def test_depth_table_has_a_row_per_depth_and_a_column_per_router(runs, tmp_path):
    result = plot('--mode=depth', f"--runs={tmp_path}/L*", '--n_ops=6', f'--out={tmp_path / "d.png"}',
                  matplotlib=HAVE_MATPLOTLIB, check=HAVE_MATPLOTLIB)
    lines = result.stdout.splitlines()
    assert '| 4 | 15.0 ± 7.1 (2) | 60.0 ± 14.1 (2) |' in lines, result.stdout
    assert '| 8 | - | 90.0 ± 0.0 (1) |' in lines, result.stdout
    missing = plot('--mode=depth', f"--runs={tmp_path}/L*", '--n_ops=9', check=False)
    assert 'no 9-operator accuracy' in missing.stderr and 'Traceback' not in missing.stderr


def test_bad_runs_give_one_clear_line(runs, tmp_path):
    os.makedirs(tmp_path / 'old')
    (tmp_path / 'old' / 'log.txt').write_text('{"step": 0, "val_loss": 3.0}\n')
    not_evaluated = fake_run(tmp_path / 'trained_only', 'static', 1)
    for args, message in [(['--runs=' + str(tmp_path / 'nothing*')], 'no directory matches'),
                          (['--runs=' + str(tmp_path / 'old')], "does not open with the run's record"),
                          (['--runs=' + str(tmp_path / 'absent')], 'log not found'),
                          (['--mode=arith', '--runs=' + not_evaluated], 'evaluation not found'),
                          (['--mode=bars'], "mode must be one of")]:
        with pytest.raises(SystemExit) as stop:  # in this process: plot.py's main, as its command runs it
            plot_py.main(args)
        assert str(stop.value).startswith('error:') and message in str(stop.value), (args, str(stop.value))
        assert '\n' not in str(stop.value)


def test_runs_that_differ_in_more_than_the_seed_are_named_so_never_averaged(tmp_path, capsys):
    # Three static runs of seed 1337 with other learning rates and widths: three settings, each
    # named by what differs, and no mean over them. Where they live (out_dir) does not count.
    runs = [fake_run(tmp_path / f'r{i}', 'static', 1337, learning_rate=lr, n_embd=width)
            for i, (lr, width) in enumerate([(1e-3, 64), (3e-3, 64), (1e-3, 128)])]
    plot_py.plot_curves(runs)
    rows = [line.split(' | ')[0] for line in capsys.readouterr().out.splitlines() if '/r' in line]
    assert rows == ['| static lr=0.001 n_embd=64', '| static lr=0.003 n_embd=64',
                    '| static lr=0.001 n_embd=128'], rows
    # The same setting and seed twice (a copied run) is not two seeds.
    copy = fake_run(tmp_path / 'copy', 'static', 1337, learning_rate=1e-3, n_embd=64)
    with pytest.raises(SystemExit, match=r'^error: .*r0 and .*copy are the same setting with'):
        plot_py.plot_curves(runs + [copy])


def test_one_data_dir_reached_by_two_paths_is_one_setting(tmp_path, capsys, monkeypatch):
    # Seeds 1 and 2 read one directory, as data/x relative to where train.py started (out_dir is
    # relative to there too) and through a link; seed 3 reads the data/x of another start.
    for start in ('a', 'b'):
        os.makedirs(tmp_path / start / 'data' / 'x')
    os.symlink(tmp_path / 'a' / 'data' / 'x', tmp_path / 'link')
    runs = [fake_run(tmp_path / 'a' / 'out' / 's1', 'static', 1, data_dir='data/x', out_dir='out/s1'),
            fake_run(tmp_path / 'r2', 'static', 2, data_dir=str(tmp_path / 'link')),
            fake_run(tmp_path / 'b' / 'out' / 's3', 'static', 3, data_dir='data/x', out_dir='out/s3')]
    monkeypatch.chdir(tmp_path / 'b')  # and plot.py runs from neither start
    groups, _ = plot_py.by_setting([os.path.relpath(run) for run in runs[:2]], depth_axis=False)
    assert list(groups) == ['static'], groups  # two seeds of one setting, not two settings
    plot_py.plot_curves(runs[:2])
    assert '| static | 2 | ' in capsys.readouterr().out
    groups, _ = plot_py.by_setting(runs, depth_axis=False)
    assert list(groups) == [f"static data_dir={tmp_path.resolve() / 'a' / 'data' / 'x'}",
                            f"static data_dir={tmp_path.resolve() / 'b' / 'data' / 'x'}"], groups
    # A relative data_dir with an absolute out_dir says nothing of where it started: from here.
    here = fake_run(tmp_path / 'r4', 'static', 4, data_dir='data/x')
    monkeypatch.chdir(tmp_path / 'a')
    assert list(plot_py.by_setting(runs[:2] + [here], depth_axis=False)[0]) == ['static']


def test_an_evaluation_of_another_checkpoint_is_refused(runs, tmp_path):
    run = runs['static', 1, 4]
    path = os.path.join(run, 'arith_eval.json')
    good = json.loads(open(path).read())
    for changed in ({'best_val_loss': 2.5},  # left by an earlier run in this out_dir
                    {'step': 50},  # a checkpoint that later evaluations replaced
                    {'step': None, 'best_val_loss': None}):  # an older arith.py's: unknown
        with open(path, 'w') as f:
            f.write(json.dumps({**good, **changed}))
        with pytest.raises(SystemExit, match=r'^error: .*arith_eval.json scored another'):
            plot_py.read_eval(run, plot_py.read_log(run)[1])
    with open(path, 'w') as f:
        f.write(json.dumps(good))
    assert plot_py.read_eval(run, plot_py.read_log(run)[1])[6] == 0.5


def test_training_flops_count_each_steps_own_batch_after_a_resume():
    # 10 steps of 16 tokens, then a resume at step 10 with twice the batch: 32 tokens a step.
    header = {'config': {'batch_size': 4, 'block_size': 8, 'gradient_accumulation_steps': 1},
              'flops_per_token': 6}  # the resumed run's record: its batch of 4 x 8
    records = [{'step': s, 'train_loss': 1.0, 'ms_per_step': 100.0, 'tokens_per_sec': 160.0}
               for s in (5, 10)]
    records += [{'step': s, 'train_loss': 1.0, 'ms_per_step': 200.0, 'tokens_per_sec': 160.0}
                for s in (15, 20)]
    flops = plot_py.flops_by_step(header, records)
    assert [flops(s) for s in (0, 10, 20, 25)] == [0, 6 * 160, 6 * (160 + 320), 6 * (160 + 480)]


def test_a_log_cut_short_or_edited_by_hand_gives_a_note_or_one_line(runs, tmp_path, capsys):
    run = runs['none', 1, 4]
    log = os.path.join(run, 'log.txt')
    whole = open(log).read()
    with open(log, 'a') as f:  # a run killed while writing a line
        f.write('{"step": 110, "train')
    assert plot_py.read_log(run)[1][-1]['step'] == 100
    assert 'log.txt:16: the last line is cut short' in capsys.readouterr().err
    for text, message in [(whole.replace('"step": 50', '"step": "50"', 1), 'record 8'),
                          (whole.replace('"batch_size": 2', '"batch_size": "x"'), 'batch_size'),
                          (whole.replace('"step": 50', '"step": [', 1), 'log.txt:8: not JSON')]:
        with open(log, 'w') as f:
            f.write(text)
        with pytest.raises(SystemExit) as stop:
            plot_py.main([f'--runs={run}'])
        assert str(stop.value).startswith('error:') and message in str(stop.value), str(stop.value)
        assert '\n' not in str(stop.value)


@pytest.mark.optional
@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='matplotlib is not installed')
def test_out_must_name_an_image_file(runs, tmp_path):
    for out in (tmp_path, tmp_path / 'curves.txt', tmp_path / 'curves'):
        with pytest.raises(SystemExit, match='^error: cannot write .*name a file ending in .png'):
            plot_py.main([f"--runs={runs['none', 1, 4]}", f'--out={out}'])
    assert not list(tmp_path.glob('curves*'))


def test_compare_sh_trains_each_router_and_draws_their_curves(tmp_path, gpt2):  # GPT-2 tokens
    """The small-text preset, end to end at a tiny shape: prepare.py on a file, then compare.sh."""
    text = tmp_path / 'text.jsonl'
    words = 'the cat is on the mat and the dogs are in the house where they were last night'.split()
    with open(text, 'w') as f:
        for i in range(200):
            f.write(json.dumps({'text': ' '.join(words[(i + j) % len(words)] for j in range(60))}) + '\n')
    # compare.sh's `python` is the one running the tests, so HAVE_MATPLOTLIB speaks for it too.
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', '')
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PATH': path}
    data = tmp_path / 'data'
    subprocess.run([sys.executable, 'prepare.py', '--input', str(text), '--out_dir', str(data), '--workers', '1'],
                   check=True, capture_output=True, cwd=ROOT, env=env, timeout=120)
    out = tmp_path / 'cmp'
    tiny = ['--device=cpu', '--compile=False', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32',
            '--batch_size=2', '--max_iters=4', '--eval_interval=2', '--eval_iters=1', '--warmup_iters=1',
            f'--data_dir={data}', f'--out_dir={out}']
    # An interrupted comparison: none trained, static and dynamic never started. --init_from=resume
    # (the README's recovery) resumes none (nothing left to train) and starts the other two.
    subprocess.run([sys.executable, 'train.py', 'config/small_text.py', *tiny[:-1], '--router=none',
                    f'--out_dir={out}/none'], check=True, capture_output=True, cwd=ROOT, env=env,
                   timeout=300)
    result = subprocess.run(['bash', 'lab/compare.sh', 'config/small_text.py', *tiny,
                             '--init_from=resume'], capture_output=True, text=True, cwd=ROOT,
                            env=env, timeout=300)
    if HAVE_MATPLOTLIB:
        assert result.returncode == 0, result.stdout + result.stderr
        assert (out / 'loss_curves.png').exists()
    else:
        assert 'pip install matplotlib' in result.stderr
    for router in ('none', 'static', 'dynamic'):
        assert (out / router / 'ckpt.pt').exists() and f'| {router} | {out / router} |' in result.stdout
    again = subprocess.run(['bash', 'lab/compare.sh', 'config/small_text.py', *tiny], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=300)
    assert again.returncode != 0 and 'holds a run' in again.stderr  # the first run is kept, not replaced


def test_help_lists_the_keys_with_their_comments():
    result = plot('--help')
    assert result.stdout.startswith('plot.py: draw what train.py and arith.py record'), result.stdout
    assert re.search(r'^  --n_ops=6 +depth mode: the operator count', result.stdout, re.M), result.stdout


@pytest.mark.optional
@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='drawing needs matplotlib')
def test_band_draws_each_settings_mean_between_its_least_and_most(tmp_path):
    # Two seeds of static whose val losses are 3, 2.5, 2 and 4, 3.5, 3, one of none: static's line
    # is their mean, its band from the one to the other; none, one seed, a line in a band of no width.
    runs = [fake_run(tmp_path / 's1', 'static', 1, final_val=2.0),
            fake_run(tmp_path / 's2', 'static', 2, final_val=3.0),
            fake_run(tmp_path / 'n1', 'none', 1, final_val=2.5, router_lr=0.0)]  # as lab.text's
    fig = plot_py.plot_curves(runs, band=True)
    val = fig.axes[1]  # validation loss by step
    lines = {line.get_label(): line for line in val.lines}
    assert set(lines) == {'static (2 seeds)', 'none'}, lines  # none's router_lr names no setting
    assert list(lines['static (2 seeds)'].get_ydata()) == pytest.approx([3.5, 3.0, 2.5])
    band = val.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(2.0) and band.max() == pytest.approx(4.0)
    assert len(fig.axes[3].collections) == 2  # and against FLOPs, a band per setting
    refused = plot('--mode=arith', f'--runs={runs[0]}', '--band=True', check=False)
    assert refused.returncode == 1 and 'band is for the loss curves' in refused.stderr


@pytest.mark.optional
@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason='drawing needs matplotlib')
def test_lab_text_draws_its_runs_curves_a_figure_per_depth(tmp_path):
    # lab/text.py's last step, by lab/plot.py; tests/test_text.py trains the runs it draws
    from lab import text
    fake_run(tmp_path / 'static', 'static', 1, n_layer=2, final_val=2.0)
    fake_run(tmp_path / 'none', 'none', 1, n_layer=2, final_val=2.5, router_lr=0.0)
    text.draw([{'name': 'static', 'layers': 2}, {'name': 'none', 'layers': 2}], str(tmp_path))
    assert (tmp_path / 'curves_L2.png').stat().st_size > 0


def test_the_static_start_names_a_setting_only_among_static_runs(tmp_path):
    # router_init changes static runs alone; logs from before the key had the authors' start.
    runs = [fake_run(tmp_path / 'n1', 'none', 1, router_init='noisy'),
            fake_run(tmp_path / 'i1', 'static', 1, router_init='identity'),
            fake_run(tmp_path / 'd1', 'dynamic', 1, router_init='noisy')]
    groups, _ = plot_py.by_setting(runs, depth_axis=False)
    assert list(groups) == ['none', 'static', 'dynamic'], groups
    runs.append(fake_run(tmp_path / 'o1', 'static', 1))  # an older log: no router_init
    groups, _ = plot_py.by_setting(runs, depth_axis=False)
    assert list(groups) == ['none', 'static init=identity', 'dynamic', 'static init=noisy'], groups


def test_a_setting_names_floats_short_where_that_keeps_them_apart_and_old_logs_v2s_memory(
        tmp_path):
    # min_lr = learning_rate / 10 in floating point: 3e-3/10 is 0.00030000000000000003
    runs = [fake_run(tmp_path / 'a', 'static', 1, min_lr=3e-3 / 10, memory='kv'),
            fake_run(tmp_path / 'b', 'static', 1, min_lr=6e-3 / 10, memory='hidden'),
            fake_run(tmp_path / 'c', 'static', 2, min_lr=3e-4)]  # an older log: no memory key
    groups, _ = plot_py.by_setting(runs, depth_axis=False)
    assert list(groups) == ['static memory=kv min_lr=0.00030000000000000003',
                            'static memory=hidden min_lr=0.0006',
                            'static memory=kv min_lr=0.0003'], groups
    groups, _ = plot_py.by_setting(runs[1:], depth_axis=False)  # 0.0003 alone: short
    assert list(groups) == ['static memory=hidden min_lr=0.0006',
                            'static memory=kv min_lr=0.0003'], groups
