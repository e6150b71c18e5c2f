"""
Tests for bench.py: its table, at the tiny CPU shape.

    python -m pytest -q tests/test_bench.py
"""
from test_train import run


def test_bench_prints_one_row_per_router_with_ratios_to_the_baseline():
    # No --shape: on a CPU the default is the tiny shape, which runs in seconds.
    result = run('lab/bench.py', '--device=cpu', '--steps=2', '--warmup=1', '--routers=static,none,dynamic-fused,static-v1')
    # A markdown table: | shape | router | params | ms/step | tok/s | vs none | ...
    rows = [[c.strip() for c in line.split('|')[1:-1]] for line in result.stdout.splitlines()
            if line.startswith('| tiny ')]
    assert [row[1] for row in rows] == ["none", "static", "dynamic-fused", "static-v1"], result.stdout
    assert rows[0][5] == '1.000'
    assert all(float(row[5]) > 0 for row in rows)


def test_bench_refuses_a_router_named_twice():
    # Two rows of one router would time it twice, not compare two: one error line, before any timing.
    result = run('lab/bench.py', '--device=cpu', '--steps=1', '--warmup=1', '--routers=none,static,none',
                 check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.strip() == "error: routers: 'none' named more than once", result.stderr
    assert '| tiny ' not in result.stdout
