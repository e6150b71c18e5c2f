"""
Tests for sample.py: a checkpoint trained here, sampled from as a user does.

    python -m pytest -q tests/test_sample.py
"""
from test_train import assert_clean_error, data_dir, run, train  # noqa: F401  data_dir is a fixture


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


def test_a_byte_level_model_is_sampled_with_its_own_tokenizer(tmp_path):
    import prepare
    data = tmp_path / 'pydoc_bytes'
    prepare.main(['--out_dir', str(data), '--workers', '2', '--tokenizer', 'bytes'])
    # Byte-level data with GPT-2's vocabulary is refused before anything is built.
    assert_clean_error(train(data, tmp_path / 'wrong', check=False), '--vocab_size=257')
    out = tmp_path / 'out'
    train(data, out, '--vocab_size=257', '--max_iters=2', '--eval_interval=2')
    result = run('sample.py', f'--out_dir={out}', '--start=Café «lists»', '--num_samples=1',
                 '--max_new_tokens=20', '--device=cpu')
    text = result.stdout.split('---------------')[0]
    assert text.startswith('Café «lists»')  # decoded as bytes: GPT-2 BPE would fail or differ
    # The default prompt starts a document: the sample is the model's own text.
    result = run('sample.py', f'--out_dir={out}', '--num_samples=2', '--max_new_tokens=10',
                 '--device=cpu')
    assert result.stdout.count('---------------') == 2
