"""
What the tests share: Ctrl-C as a terminal gives it, and whether GPT-2's tokenizer files are at
hand without the network. tiktoken
downloads them (1.5 MB) on first use and caches them; the tests never download. Where the cache
lacks them (a newcomer offline), the tests that need them skip, saying why, and the rest run: such
a test, or its fixture, asks for the fixture `gpt2`.

    python -m pytest -q -rs    # -rs lists each skipped test with its reason

.ci/run runs the suite twice at once, and LIME_TESTS says which half a run is: 'bare' (only
requirements.txt, no tokenizer files) runs every test, as a newcomer would; 'optional' (every
optional package, the tokenizer files) runs only what the bare half cannot: the tests that ask for
`gpt2` or carry the mark `optional` (a test that skips, or checks other things, without an optional
package). So that no test is left out of both, a test that skips in the bare half without being
one of those, or skips at all in the optional half, fails that half.
"""
import collections
import hashlib
import os
import signal
import subprocess
import sys
import tempfile

import pytest

# The tests are many small jobs, each a core's work: on a busy machine a second thread mostly waits
# (at load 4, a step of config/cpu_demo.py took 3.1-3.4 s at two threads and 0.5 s at one). Set
# before torch is imported; the scripts the tests start inherit it.
os.environ.setdefault('OMP_NUM_THREADS', '1')

# The tests of Ctrl-C send SIGINT to the scripts they start, which must take it as a terminal's
# Ctrl-C. A shell starts a background job (`python -m pytest &` in a script) with SIGINT ignored,
# and every process it starts would inherit that: pytest takes Python's own Ctrl-C back, which a
# process it starts then has from the start, as one started in a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: scripts run there
# The tiny model every test that trains uses: seconds on one CPU core.
TINY = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32',
        '--batch_size=4', '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=1',
        '--warmup_iters=2', '--learning_rate=3e-3', '--router_lr=3e-2', '--min_lr=3e-4']
BYTES = '--vocab_size=257'  # the model for byte-level data (the fixture bytes_dir)


def command(script):
    """How a user runs script from the repo root: python train.py, or python -m lab.evaluate."""
    if '/' in script:
        return [sys.executable, '-m', script.removesuffix('.py').replace('/', '.')]
    return [sys.executable, os.path.join(ROOT, script)]


def run(script, *args, check=True, cwd=ROOT, env=None):
    """script run with args as a user runs it; with check, it must exit 0."""
    env = {**os.environ, 'PYTHONPATH': ROOT, **(env or {})}
    result = subprocess.run([*command(script), *args], capture_output=True, text=True, cwd=cwd,
                            timeout=600, env=env)
    if check:
        assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result


HALF = pytest.StashKey()  # LIME_TESTS: which half of .ci/run this is, if any
OPTIONAL = pytest.StashKey()  # the node ids of the tests the optional half runs

# The two files of tiktoken's "gpt2" encoding (tiktoken_ext/openai_public.py). tiktoken/load.py
# caches each under the SHA-1 of its URL, in TIKTOKEN_CACHE_DIR, else DATA_GYM_CACHE_DIR, else
# data-gym-cache in the temporary directory; an empty TIKTOKEN_CACHE_DIR caches nothing.
GPT2_URLS = ['https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe',
             'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json']


def gpt2_files_missing():
    """None where tiktoken's cache holds GPT-2's files (it then needs no network); else why not."""
    cache = os.environ.get('TIKTOKEN_CACHE_DIR', os.environ.get('DATA_GYM_CACHE_DIR'))
    if cache is None:
        cache = os.path.join(tempfile.gettempdir(), 'data-gym-cache')
    paths = [os.path.join(cache, hashlib.sha1(url.encode()).hexdigest()) for url in GPT2_URLS]
    if cache and all(os.path.isfile(path) for path in paths):
        return None
    where = cache or "none: TIKTOKEN_CACHE_DIR is empty"
    return (f"GPT-2's tokenizer files are not in tiktoken's cache ({where}), and the tests never "
            "download: online, run python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\" "
            "once; offline, point TIKTOKEN_CACHE_DIR at a copy of the cache")


@pytest.fixture(scope='session')
def gpt2():
    """GPT-2's tokenizer, tiktoken's encoding; uncached, the test skips, saying why."""
    why = gpt2_files_missing()
    if why is not None:
        pytest.skip(why)
    import prepare
    return prepare.gpt2_encoding()


@pytest.fixture(scope='session')
def bytes_dir(tmp_path_factory):
    """The Python docs at byte level (train.py's default data): no tokenizer files needed."""
    import prepare
    out = tmp_path_factory.mktemp('data') / 'pydoc_bytes'
    prepare.main(['--out_dir', str(out), '--workers', '2', '--tokenizer', 'bytes'])
    return str(out)


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory, gpt2):
    """The Python docs in GPT-2 tokens: skips offline without the tokenizer's files."""
    import prepare
    out = tmp_path_factory.mktemp('data') / 'pydoc'
    prepare.main(['--out_dir', str(out), '--workers', '2'])
    return str(out)


@pytest.fixture(scope='session')
def trained(tmp_path_factory, bytes_dir):
    """trained(router, memory): the out_dir of a finished TINY run on bytes_dir (8 steps,
    evaluated and saved at 4 and 8), trained once per session for each router and memory and
    shared by every test that needs a checkpoint. Read it; a test that changes it copies it."""
    runs = {}

    def get(router='static', memory='kv'):
        if (router, memory) not in runs:
            out = tmp_path_factory.mktemp(f'run_{router}_{memory}')
            run('train.py', *TINY, BYTES, f'--data_dir={bytes_dir}', f'--out_dir={out}',
                f'--router={router}', f'--memory={memory}', '--max_iters=8',
                '--eval_interval=4')
            runs[router, memory] = str(out)
        return runs[router, memory]
    return get


def needs_optional(item):
    """Whether the optional half runs item: it needs GPT-2's files or carries the mark."""
    return 'gpt2' in item.fixturenames or item.get_closest_marker('optional') is not None


def pytest_configure(config):
    # popped: a test running pytest in a copy of its own (tests/test_handout.py) is no half
    config.stash[HALF] = os.environ.pop('LIME_TESTS', None)
    config.addinivalue_line('markers', 'optional: skips or checks other things without an '
                            "optional package (run in .ci/run's optional half too)")


def pytest_collection_modifyitems(config, items):
    optional = {item.nodeid for item in items if needs_optional(item)}
    config.stash[OPTIONAL] = optional
    if config.stash[HALF] == 'optional':
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in optional])
        items[:] = [item for item in items if item.nodeid in optional]


def pytest_sessionfinish(session):
    """In a half of .ci/run, a skip that leaves its test run in neither half fails the run."""
    half = session.config.stash[HALF]
    reporter = session.config.pluginmanager.get_plugin('terminalreporter')
    if half not in ('bare', 'optional') or reporter is None:
        return
    optional = session.config.stash.get(OPTIONAL, set())
    lost = [report.nodeid for report in reporter.stats.get('skipped', [])
            if half == 'optional' or report.nodeid not in optional]
    if not lost:
        return
    reporter.write_line('')  # past the progress line
    for nodeid in lost:
        reporter.write_line(f"{nodeid} skipped in the {half} half: a test the bare half skips "
                            "must ask for gpt2 or carry the mark optional, and the optional "
                            "half, with every package, skips none")
    session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    """After the run, one line per reason some tests skipped, with how many: why, at a glance."""
    reasons = collections.Counter()
    for report in terminalreporter.stats.get('skipped', []):
        reasons[report.longrepr[2].removeprefix('Skipped: ')] += 1
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count} skipped: {reason}")
