"""
Tests for sample.py, sampling from the shared trained run as a user does (its refusals of bad
input are in test_errors.py):
    python -m pytest -q tests/test_sample.py
"""
import subprocess

import pytest

import lime
from conftest import command, run

SEPARATOR = '---------------\n'


def test_each_sample_continues_the_prompt_file_decoded_as_bytes(trained, tmp_path):
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('Café «lists»')  # GPT-2's tokenizer would fail here, or differ
    result = run('sample.py', f'--out_dir={trained()}', f'--start=FILE:{prompt}',
                 '--num_samples=2', '--max_new_tokens=20', '--device=cpu')
    samples = result.stdout.split(SEPARATOR)
    assert len(samples) == 3 and samples[2] == '', result.stdout
    for sample in samples[:2]:
        assert sample.startswith('Café «lists»') and len(sample) > len('Café «lists»\n')


def test_greedy_samples_of_the_default_prompt_are_the_model_s_own_text(trained):
    outputs = [run('sample.py', f'--out_dir={trained()}', '--temperature=0', f'--seed={seed}',
                   '--num_samples=1', '--max_new_tokens=30', '--device=cpu').stdout
               for seed in (1, 2)]
    assert outputs[0] == outputs[1] and outputs[0].endswith(SEPARATOR)  # greedy: no chance
    assert len(outputs[0]) > len(SEPARATOR) + 10


@pytest.mark.parametrize('tokenizer', ['bytes', pytest.param('gpt2', marks=pytest.mark.optional)])
def test_a_prompt_that_is_not_utf8_is_read_as_its_bytes(tmp_path, tokenizer, request):
    if tokenizer == 'gpt2':
        request.getfixturevalue('gpt2')  # its files, or a skip saying why
    vocab_size = {'bytes': 257, 'gpt2': 50257}[tokenizer]
    model = lime.GPT(lime.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16,
                                    vocab_size=vocab_size))
    lime.save_checkpoint(tmp_path / 'ckpt.pt', model, step=1, best_val_loss=1.0,
                         config={'tokenizer': tokenizer})
    # café as a Latin-1 terminal sends it: é is the one byte 0xe9, not UTF-8
    result = subprocess.run([*command('sample.py'), f'--out_dir={tmp_path}', b'--start=caf\xe9',
                             '--num_samples=1', '--max_new_tokens=3', '--device=cpu'],
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr.decode().splitlines()[0].startswith('loaded ')
    assert len(result.stderr.decode().splitlines()) == 1  # no note, no traceback
    sample = result.stdout.decode()
    if tokenizer == 'bytes':  # the byte 0xe9 is a token as it is
        assert sample.startswith('caf')
    else:  # GPT-2's tokenizer reads it as U+FFFD
        assert sample.startswith('caf\ufffd')
