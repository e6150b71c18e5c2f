"""
Tests for where the scripts write (safe_files.py and its users): no file is written through a
symbolic link that the script did not make, and lab.handout writes no copy into the repo through
one. Runs of train.py are real processes on a tiny model.

    python -m pytest -q tests/test_safe_files.py
"""
import os
import subprocess
import sys

import pytest

import prepare
import safe_files
from test_train import ROOT, TINY, saved, train
from test_train import data_dir  # noqa: F401 (a fixture)

# -----------------------------------------------------------------------------
# no write through a link the script did not make

# Runs train.py, planting a link after optimizer step AT where the next checkpoint's temporary
# file would be if its name were known beforehand (ckpt.pt.<pid>.tmp), leading to VICTIM
PLANTING = '''
import os, runpy, sys
from torch.optim.optimizer import register_optimizer_step_post_hook
OUT, AT, VICTIM = {out!r}, {at}, {victim!r}
steps = 0

def plant(optimizer, args, kwargs):
    global steps
    steps += 1
    if steps == AT:
        os.symlink(VICTIM, os.path.join(OUT, f'ckpt.pt.{{os.getpid()}}.tmp'))

register_optimizer_step_post_hook(plant)
sys.argv[0] = {train_py!r}
runpy.run_path(sys.argv[0], run_name='__main__')
'''


def test_a_link_planted_where_a_checkpoint_is_written_is_not_written_through(data_dir, tmp_path):
    out, victim = tmp_path / 'run', tmp_path / 'victim.txt'
    victim.write_text('not a checkpoint\n')
    hook = PLANTING.format(out=str(out), at=1, victim=str(victim),
                           train_py=os.path.join(ROOT, 'train.py'))
    result = subprocess.run([sys.executable, '-c', hook, *TINY, f'--data_dir={data_dir}',
                             f'--out_dir={out}', '--max_iters=2', '--eval_interval=2'],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, 'PYTHONPATH': ROOT})
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == 'not a checkpoint\n'
    assert not (out / 'ckpt.pt').is_symlink() and saved(out)['step'] == 2


def test_every_file_written_whole_takes_a_new_name_and_writes_through_no_link(tmp_path):
    # A link at each name a second party could know beforehand: path with this process's id
    victim = tmp_path / 'victim.txt'
    victim.write_text('kept\n')
    writes = {'x.json': lambda path: safe_files.write_json(path, {'a': 1}),
              'x.bin': lambda path: prepare.write_shard(path, [1, 2, 3])}
    for name, write in writes.items():
        path = tmp_path / name
        os.symlink(victim, f'{path}.{os.getpid()}.tmp')
        write(path)
        assert victim.read_text() == 'kept\n', name
        assert path.is_file() and not path.is_symlink(), name
    assert safe_files.data_record(tmp_path, 'x.json') == {'a': 1}
    assert list(prepare.read_shard(tmp_path / 'x.bin')) == [1, 2, 3]


def test_a_lock_file_that_is_a_link_is_refused_in_one_line(data_dir, tmp_path):
    made = tmp_path / 'elsewhere' / 'made'
    (tmp_path / 'elsewhere').mkdir()
    for directory in ('run', 'data'):
        (tmp_path / directory).mkdir()
        os.symlink(made, tmp_path / directory / '.lock')
    result = train(data_dir, tmp_path / 'run', '--max_iters=2', check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: {tmp_path}/run/.lock is a symbolic link, which a "
                                     "lock file never is: not followed (remove it)")
    with pytest.raises(SystemExit) as refused:
        prepare.main(['--out_dir', str(tmp_path / 'data'), '--tokenizer', 'bytes'])
    assert str(refused.value) == (f"prepare.py: error: {tmp_path}/data/.lock is a symbolic link, "
                                  "which a lock file never is: not followed (remove it)")
    assert not made.exists()
