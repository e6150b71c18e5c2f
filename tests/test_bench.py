"""
Tests for lab/bench.py at the tiny CPU shape: its table, a row a mix with its gradients checked;
the pass rule, which a router whose gradient is lost must fail, on a compiled bf16 step as a GPU
runs it; the time limit, which leaves rows out and says so; bad rows, in one line.

    python -m pytest -q tests/test_bench.py
"""
import pytest
import torch

from test_train import run


def table(stdout):
    return [[c.strip() for c in line.split('|')[1:-1]] for line in stdout.splitlines()
            if line.startswith('| tiny ')]


def test_bench_prints_one_row_per_mix_with_ratios_and_checked_gradients():
    # No --shape: on a CPU the default is the tiny shape, which runs in seconds.
    result = run('lab/bench.py', '--device=cpu', '--steps=2', '--warmup=1',
                 '--routers=static,none,dynamic-fused,static-v1')
    rows = table(result.stdout)
    assert [row[1] for row in rows] == ["none", "static", "dynamic-fused", "static-v1"], result.stdout
    assert rows[0][5] == '1.000'
    assert all(float(row[5]) > 0 for row in rows)
    # every parameter's first-step gradient within float32's tolerance of the definition's
    assert all(row[-1].split()[1:3] == ['passed,', 'nearest:'] for row in rows), result.stdout
    assert 'Left out' not in result.stdout


def test_bench_leaves_out_the_rows_its_minutes_do_not_allow_and_says_so():
    # The first row always runs (nothing says how long a row takes before one has); after it,
    # no time is left
    result = run('lab/bench.py', '--device=cpu', '--steps=1', '--warmup=1', '--minutes=1e-4',
                 '--routers=none,static,dynamic')
    assert [row[1] for row in table(result.stdout)] == ['none']
    assert result.stdout.strip().splitlines()[-1] == (
        "Left out, the 0.0001 minutes spent: tiny/static, tiny/dynamic.")


@pytest.mark.parametrize('router, parameter', [('static', 'blocks.3.attn.router.weight'),
                                               ('dynamic', 'blocks.1.attn.router.proj.weight')])
def test_the_gradients_pass_rule_fails_a_router_whose_gradient_is_lost(monkeypatch, router,
                                                                       parameter):
    # A rule that loss curves could not be: they agreed with a router's gradient replaced by
    # zeros. One bf16 step's gradients, as on a GPU (eager: the rule is what is tested, and a
    # compile here would take most of the test's time), judged as they are, then with that zero.
    from lab import bench
    from lime import GPTConfig
    for key, value in dict(device='cpu', device_type='cpu', dtype='bfloat16',
                           autocast=torch.autocast('cpu', torch.bfloat16)).items():
        monkeypatch.setattr(bench, key, value, raising=False)
    cfg = GPTConfig(router=router, **bench.SHAPES['tiny'][0])
    x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size + 1),
                      generator=torch.Generator().manual_seed(0))
    reference, alone = bench.reference_gradients(cfg, x)
    model = bench.seeded_model(cfg)
    with bench.autocast:
        _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    fast = bench.gradients(model)
    passed, failed, worst = bench.judge(reference, alone, fast)
    assert failed == [] and passed == len(reference), worst
    fast[parameter] = torch.zeros_like(fast[parameter])
    assert bench.judge(reference, alone, fast)[1] == [parameter]


def test_bench_refuses_a_router_named_twice():
    # Two rows of one router would time it twice, not compare two: one error line, before any timing.
    result = run('lab/bench.py', '--device=cpu', '--steps=1', '--warmup=1', '--routers=none,static,none',
                 check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.strip() == "error: routers: 'none' named more than once", result.stderr
    assert '| tiny ' not in result.stdout
