"""
A user's mistakes. configurator.py's checks are tested here in-process; then, for each script
where the scripts differ (train.py, sample.py, prepare.py), one named case per kind of mistake,
run as a user runs it: each must exit non-zero with one `error:` line and no traceback.
    python -m pytest -q tests/test_errors.py
"""
import gzip
import json
import re
import subprocess

import pytest
import torch

import configurator
import prepare
from conftest import TINY, command, run

DEFAULTS = {'n_layer': 2, 'learning_rate': 3e-4, 'router': 'static', 'compile': True,
            'dtype': 'bfloat16', 'device': 'cpu', 'seeds': '1,2', 'out_dir': 'out'}
KINDS = {'positive': ['n_layer', 'learning_rate'], ('static', 'dynamic'): ['router'],
         'device': ['device'], 'path': ['out_dir']}


def configure(*argv):
    return configurator.configure(dict(DEFAULTS), KINDS, list(argv))


def refusal(call, *args):
    """The line that call(*args) stops with."""
    with pytest.raises(SystemExit) as stop:
        call(*args)
    return stop.value.code


def test_overrides_keep_their_types_and_a_cpu_defaults_to_float32_uncompiled():
    config, given, _ = configure('--n_layer=4', '--learning_rate=1', '--router=dynamic',
                                 '--seeds=1', '--compile=true')
    assert type(config['learning_rate']) is float and config['n_layer'] == 4
    assert (config['router'], config['seeds']) == ('dynamic', '1')  # a text key takes the text
    assert config['compile'] is True and config['dtype'] == 'float32'  # given, and not given
    assert given == {'n_layer', 'learning_rate', 'router', 'seeds', 'compile'}


@pytest.mark.parametrize('arg, message', [
    ('--n_layrs=4', "--n_layrs: unknown key 'n_layrs' (did you mean n_layer?)"),
    ('--n_layer=4.5', '--n_layer: n_layer must be int (like 2), got 4.5'),
    ('--n_layer=0', 'n_layer must be > 0, got 0'),
    ('--router=statc', "router must be one of 'static', 'dynamic', got 'statc'"),
    ('--out_dir= ', "out_dir must be a non-empty path, got ' '"),
    ('--device=mps', "device must be 'cpu', 'cuda' or 'cuda:N', got 'mps'"),
    ('--n_layer', "expected --key=value, got '--n_layer'"),
])
def test_a_mistaken_override_stops_in_one_line(arg, message):
    assert refusal(configure, arg) == f"error: {message}"


@pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has a CUDA GPU')
def test_a_gpu_that_torch_does_not_see_is_one_line():
    assert refusal(configure, '--device=cuda') == (f"error: device 'cuda': torch "
                                                  f"{torch.__version__} sees 0 CUDA GPU(s) here "
                                                  "(use --device=cpu)")


@pytest.mark.parametrize('kind, good, bad', [
    ('positive', 1e-9, 0), ('non-negative', 0, -1), ('seed', 0, -1),
    ('below one', 0.0, 1.0), ('path', 'out', ''), ('device', 'cpu', 'gpu'), ((1, 2), 2, 3)])
def test_check_value_lets_each_kind_s_values_through_and_stops_others(kind, good, bad):
    configurator.check_value('key', good, kind)
    assert refusal(configurator.check_value, 'key', bad, kind).startswith("error: key must be ")


def test_a_config_file_sets_keys_and_its_mistakes_name_the_file(tmp_path):
    path = tmp_path / 'preset.py'
    path.write_text('"""A preset."""\nn_layer = 6  # deeper\nrouter = "dynamic"\n')
    config, given, _ = configure(str(path), '--n_layer=8')
    assert (config['n_layer'], config['router'], given) == (8, 'dynamic', {'n_layer', 'router'})
    for text, message in [('n_layer = (\n', f"{path}:1: not a config file of `key = value` lines"),
                          ('n_layer = 2 * 3\n', f"{path}:1: config files hold `key = value`"),
                          ('n_layr = 6\n', f"{path}:1: unknown key 'n_layr'"),
                          ('# café\n'.encode('latin-1'), f"config file {path}: could not read")]:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        assert refusal(configure, str(path)).startswith(f"error: {message}")
    assert refusal(configure, 'n_layer=6') == (
        "error: config file not found: n_layer=6 (overrides are written --key=value)")


def test_or_fail_makes_errors_one_line_which_under_torchrun_only_rank_0_says(monkeypatch):
    assert refusal(configurator.or_fail, int, 'x') == (
        "error: invalid literal for int() with base 10: 'x'")
    assert refusal(configurator.or_fail, open, '/nowhere/x') == (
        'error: /nowhere/x: No such file or directory')
    monkeypatch.setenv('RANK', '1')  # torchrun's second process: it exits, saying nothing
    monkeypatch.setattr(configurator.time, 'sleep', lambda seconds: None)
    assert refusal(configurator.fail, 'a mistake') == 1


def test_help_lists_each_key_with_a_config_file_s_value_and_its_comment():
    result = run('train.py', 'config/cpu_demo.py', '--help')
    assert re.search(r'^  --n_layer=6$', result.stdout, re.M), result.stdout  # cpu_demo's
    assert re.search(r'^  --grad_clip=1\.0 +0 disables clipping$', result.stdout, re.M)


def test_help_into_a_closed_pipe_ends_quietly():
    reader = subprocess.Popen([*command('sample.py'), '--help'], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    reader.stdout.close()  # as `| head` does, before the script writes a line
    assert reader.wait(timeout=300) == 0 and reader.stderr.read() == ''


CASES = [  # (name, script, args, the error line's text); {tmp}, {run}, {broken} are directories
    ('train-typo', 'train.py', ['--n_layers=2'], "unknown key 'n_layers' (did you mean n_layer"),
    ('train-wrong-type', 'train.py', ['--max_iters=1e3'], 'max_iters must be int'),
    ('train-bad-range', 'train.py', ['--learning_rate=-1e-3'], 'learning_rate must be > 0'),
    ('train-missing-file', 'train.py', ['config/cpu_dmeo.py'], 'config file not found'),
    ('train-broken-checkpoint', 'train.py', ['--out_dir={broken}', '--init_from=resume',
                                             '--device=cpu'], 'could not read checkpoint'),
    ('train-bad-data', 'train.py', [*TINY, '--data_dir={tmp}/short', '--out_dir={tmp}/out'],
     'no training shard in'),
    ('sample-bad-range', 'sample.py', ['--temperature=1e-300'], 'give --temperature=0'),
    ('sample-missing-file', 'sample.py', ['--start=FILE:{tmp}/nope.txt'], 'prompt file not found'),
    ('sample-broken-checkpoint', 'sample.py', ['--out_dir={broken}', '--device=cpu'],
     'could not read checkpoint'),
    ('sample-bad-prompt', 'sample.py', ['--out_dir={run}', '--start=', '--device=cpu'],
     'the prompt is empty'),
    ('prepare-typo', 'prepare.py', ['--out-dir', '{tmp}/p'], 'unrecognized arguments: --out-dir'),
    ('prepare-wrong-type', 'prepare.py', ['--val_every', 'often'], "invalid count value: 'often'"),
    ('prepare-bad-range', 'prepare.py', ['--shard_size', '3B'], 'at most 2**31 - 1 tokens'),
    ('prepare-missing-file', 'prepare.py', ['--input', '{tmp}/nope.jsonl'], 'no such file'),
    ('prepare-bad-data', 'prepare.py', ['--input', '{tmp}/cut.jsonl.gz', '--tokenizer=bytes'],
     'cut.jsonl.gz: could not read it'),
]


@pytest.mark.parametrize('name, script, args, message', CASES, ids=[c[0] for c in CASES])
def test_a_mistake_stops_the_script_with_one_error_line(name, script, args, message, tmp_path,
                                                          request, bytes_dir):
    places = {'tmp': tmp_path, 'broken': tmp_path / 'broken'}
    if '{run}' in ''.join(args):
        places['run'] = request.getfixturevalue('trained')()
    (tmp_path / 'broken').mkdir()
    (tmp_path / 'broken' / 'ckpt.pt').write_bytes(b'PK\x03\x04 a checkpoint cut short')
    (tmp_path / 'short').mkdir()  # every training shard shorter than one micro-step of TINY
    val = prepare.read_shard(prepare.shard_paths(bytes_dir, 'val')[0])
    prepare.write_shard(tmp_path / 'short' / 'x_val_000000.bin', val)
    prepare.write_shard(tmp_path / 'short' / 'x_train_000001.bin', val[:100])
    with gzip.open(tmp_path / 'cut.jsonl.gz', 'wt') as f:
        f.writelines(json.dumps({'text': f'document {i} ' * 50}) + '\n' for i in range(100))
    (tmp_path / 'cut.jsonl.gz').write_bytes((tmp_path / 'cut.jsonl.gz').read_bytes()[:200])
    result = run(script, *[arg.format(**places) for arg in args], check=False, cwd=tmp_path)
    assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()  # argparse's usage, or a progress bar, may lead
    errors = [line for line in lines if re.match(r'(prepare\.py: )?error: ', line)]
    assert errors == [lines[-1]] and message in errors[0], result.stderr
