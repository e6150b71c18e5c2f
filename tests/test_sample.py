"""
Tests for sample.py: a checkpoint trained here, sampled from as a user does.

    python -m pytest -q tests/test_sample.py
"""
import os
import subprocess
import sys

import pytest

import lime
from test_train import ROOT, assert_clean_error, run, train
from test_train import bytes_dir, data_dir  # noqa: F401 (fixtures)


def test_sample_reads_a_prompt_file_and_refuses_a_foreign_vocabulary(data_dir, tmp_path):
    out = tmp_path / 'out'
    train(data_dir, out, '--max_iters=2', '--eval_interval=2')
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('Lists are mutable')
    result = run('sample.py', f'--out_dir={out}', f'--start=FILE:{prompt}', '--num_samples=1',
                 '--max_new_tokens=5', '--device=cpu')
    assert result.stdout.startswith('Lists are mutable')
    assert_clean_error(run('sample.py', f'--out_dir={out}', '--start=FILE:nope.txt', check=False), 'nope.txt')
    # Data with ids past the model's vocabulary is refused before training, naming the shard.
    assert_clean_error(train(data_dir, tmp_path / 'small', '--vocab_size=1000', check=False),
                       '_train_', 'vocab_size is 1000')


def test_a_byte_level_model_is_sampled_with_its_own_tokenizer(bytes_dir, tmp_path):
    # Byte-level data with GPT-2's vocabulary is refused before anything is built.
    assert_clean_error(train(bytes_dir, tmp_path / 'wrong', check=False), '--vocab_size=257')
    out = tmp_path / 'out'
    train(bytes_dir, out, '--vocab_size=257', '--max_iters=2', '--eval_interval=2')
    result = run('sample.py', f'--out_dir={out}', '--start=Café «lists»', '--num_samples=1',
                 '--max_new_tokens=20', '--device=cpu')
    text = result.stdout.split('---------------')[0]
    assert text.startswith('Café «lists»')  # decoded as bytes: GPT-2 BPE would fail or differ
    # The default prompt starts a document: the sample is the model's own text.
    result = run('sample.py', f'--out_dir={out}', '--num_samples=2', '--max_new_tokens=10',
                 '--device=cpu')
    assert result.stdout.count('---------------') == 2


@pytest.mark.parametrize('tokenizer', ['bytes',
                                       pytest.param('gpt2', marks=pytest.mark.optional)])
def test_a_prompt_that_is_not_utf8_is_read_as_its_bytes(tmp_path, tokenizer, request):
    if tokenizer == 'gpt2':
        request.getfixturevalue('gpt2')  # its files, or a skip saying why
    vocab_size = {'bytes': 257, 'gpt2': 50257}[tokenizer]
    model = lime.GPT(lime.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16,
                                    vocab_size=vocab_size))
    lime.save_checkpoint(tmp_path / 'ckpt.pt', model, step=1, best_val_loss=1.0,
                         config={'tokenizer': tokenizer})
    # café as a Latin-1 terminal sends it: é is the one byte 0xe9, not UTF-8
    result = subprocess.run([sys.executable, os.path.join(ROOT, 'sample.py'),
                             f'--out_dir={tmp_path}', b'--start=caf\xe9', '--num_samples=1',
                             '--max_new_tokens=3', '--device=cpu'],
                            capture_output=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    loaded, *notes = result.stderr.decode().splitlines()
    assert loaded.startswith('loaded ') and 'Traceback' not in result.stderr.decode()
    sample = result.stdout.decode()
    assert notes == []
    if tokenizer == 'bytes':  # the byte 0xe9 is a token as it is
        assert sample.startswith('caf')
    else:  # GPT-2's tokenizer reads it as U+FFFD
        assert sample.startswith('caf\ufffd')
