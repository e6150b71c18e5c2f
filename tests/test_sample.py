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
