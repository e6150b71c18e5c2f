"""
Tests for lab/bench.py at the tiny CPU shape: its table, a row a mix with its ratios to the
baseline; the time limit, which leaves rows out and says so; bad rows, in one line.

    python -m pytest -q tests/test_bench.py
"""
import pytest

from conftest import run


def table(stdout):
    return [[c.strip() for c in line.split('|')[1:-1]] for line in stdout.splitlines()
            if line.startswith('| tiny ')]


def test_bench_prints_one_row_per_mix_with_the_baseline_first():
    # No --shape: on a CPU the default is the tiny shape, which runs in seconds.
    result = run('lab/bench.py', '--device=cpu', '--steps=2', '--warmup=1',
                 '--routers=static,none,dynamic-v1,static-hc,hc')
    rows = table(result.stdout)
    assert [row[1] for row in rows] == ['none', 'static', 'dynamic-v1', 'static-hc', 'hc']
    assert rows[0][5] == '1.000' and all(float(row[5]) > 0 for row in rows), result.stdout
    # the routing floor counts v2's keys and values, not v1's hidden states
    assert [row[-1] == '-' for row in rows] == [False, False, True, False, False]
    assert 'Left out' not in result.stdout


def test_bench_leaves_out_the_rows_its_minutes_do_not_allow_and_says_so():
    # The first row always runs (nothing says how long a row takes before one has); after it,
    # no time is left
    result = run('lab/bench.py', '--device=cpu', '--steps=1', '--warmup=1', '--minutes=1e-4',
                 '--routers=none,static,dynamic')
    assert [row[1] for row in table(result.stdout)] == ['none']
    assert result.stdout.strip().splitlines()[-1] == (
        "Left out, the 0.0001 minutes spent: tiny/static, tiny/dynamic.")


@pytest.mark.parametrize('routers, message', [
    # two rows of one router would time it twice, not compare two
    ('none,static,none', "routers: 'none' named more than once"),
    ('none,hc-plain', "routers: 'hc-plain' is not one of"),
])
def test_bench_refuses_bad_rows_in_one_line_before_any_timing(routers, message):
    result = run('lab/bench.py', '--device=cpu', '--steps=1', '--warmup=1', f'--routers={routers}',
                 check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert '| tiny ' not in result.stdout
