"""
Tests for prepare.py: the shard format, the val/train split, the sources, Batches, and the data set
written whole, on small files each test writes (never the network):
    python -m pytest -q tests/test_prepare.py
"""
import gzip
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import prepare
from conftest import ROOT

# Distinct documents, not ASCII: a mix-up or a bad decode shows
TEXTS = [f"Document {i}: naïve café — {i * 7919} 日本語 😀\n" + "the fox " * (i % 5 + 1)
         for i in range(60)]


def write_jsonl_gz(path, texts=TEXTS):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": text, "id": i}) + "\n" for i, text in enumerate(texts))
    return str(path)


def prepare_into(out_dir, *args, tokenizer="bytes"):
    """prepare.py's main with args into out_dir: the names of the files it holds then."""
    prepare.main([*args, "--out_dir", str(out_dir), "--workers", "2", "--tokenizer", tokenizer])
    return sorted(os.listdir(out_dir))


def documents(out_dir, split):
    """The texts of out_dir's byte-level documents of split, in order."""
    tokens = np.concatenate([prepare.read_shard(p) for p in prepare.shard_paths(out_dir, split)])
    return prepare.decode_bytes(tokens).split("\n\n")


def test_a_shard_round_trips_and_a_damaged_one_is_named_with_its_problem(tmp_path):
    path = tmp_path / "x_train_000001.bin"
    prepare.write_shard(path, np.arange(1000))
    assert os.path.getsize(path) == 1024 + 2 * 1000
    assert np.fromfile(path, dtype="<i4", count=3).tolist() == [20240520, 1, 1000]
    assert prepare.read_shard(path).tolist() == list(range(1000))
    with pytest.raises(ValueError, match="x_train_000001.bin holds token id 999, but vocab_size"):
        prepare.read_shard(path, vocab_size=999)
    data = path.read_bytes()
    for damaged, problem in [(data[:-10], "its header says 1000 tokens, but it holds 3014 bytes"),
                             (b"\0" * 4 + data[4:], "not a token shard"),
                             (data[:8], "not a token shard")]:
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match=f"^{path}: {problem}"):
            prepare.read_shard(path)


def test_shard_paths_finds_a_split_in_order_or_says_why_not(tmp_path):
    for split, index in [("train", 2), ("val", 0), ("train", 1)]:
        prepare.write_shard(prepare.shard_path(tmp_path, "x", split, index), [1, 2])
    assert prepare.shard_paths(str(tmp_path), "train") == [str(tmp_path / "x_train_000001.bin"),
                                                           str(tmp_path / "x_train_000002.bin")]
    with pytest.raises(ValueError, match="^data_dir not found: .*nowhere"):
        prepare.shard_paths(str(tmp_path / "nowhere"), "val")
    with pytest.raises(ValueError, match=r"^no \*_test_\*\.bin shards in"):
        prepare.shard_paths(str(tmp_path), "test")


def test_byte_level_documents_round_trip_split_every_nth_into_validation(tmp_path):
    out = tmp_path / "out"
    files = prepare_into(out, "--input", write_jsonl_gz(tmp_path / "docs.jsonl.gz"),
                         "--val_every", "5")
    assert files == ["local_train_000001.bin", "local_val_000000.bin", "tokenizer.json"]
    assert documents(out, "val") == TEXTS[::5]
    assert documents(out, "train") == [t for i, t in enumerate(TEXTS) if i % 5]
    assert prepare.data_tokenizer(str(out)) == "bytes"
    counts, why = prepare.token_bytes(prepare.BYTES_VOCAB, str(out))
    assert why is None and counts.tolist() == [1] * 256 + [0]
    assert prepare.token_bytes(50257, str(out))[0] is None
    (tmp_path / "task.json").write_text('{"vocab": "ab')  # lab/arith.py's, cut short
    why = prepare.token_bytes(2, str(tmp_path))[1]
    assert why.endswith("task.json does not give the 2 tokens' characters")


def test_gpt2_documents_are_their_tokens_after_endoftext(tmp_path, gpt2):
    out = tmp_path / "out"
    prepare_into(out, "--input", write_jsonl_gz(tmp_path / "d.jsonl.gz"), tokenizer="gpt2")
    assert prepare.data_tokenizer(str(out)) == "gpt2"
    tokens = np.concatenate([prepare.read_shard(prepare.shard_paths(out, split)[0])
                             for split in ("val", "train")])
    order = TEXTS[::20] + [t for i, t in enumerate(TEXTS) if i % 20]
    expected = [[prepare.EOT, *gpt2.encode_ordinary(text)] for text in order]
    assert tokens.tolist() == [token for document in expected for token in document]


def test_lone_surrogates_become_u_fffd_at_byte_level_as_in_gpt2(tmp_path):
    # JSON can escape half of a UTF-16 pair, which UTF-8 cannot hold; a whole pair is its character
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "lone \ud800, pair \ud83d\ude00"}) + "\n"
                                      + json.dumps({"text": "two"}) + "\n")
    prepare_into(tmp_path / "out", "--input", str(tmp_path / "d.jsonl"))
    assert documents(tmp_path / "out", "val") == ["lone \ufffd, pair \U0001f600"]


def test_decode_bytes_separates_documents_and_survives_a_cut_character():
    ids = [prepare.BYTES_DOC, *"café".encode(), prepare.BYTES_DOC, *"日本".encode()[:-1]]
    assert prepare.decode_bytes(ids) == "café\n\n日\ufffd"


def test_max_tokens_stops_after_the_document_that_reaches_it(tmp_path):
    out = tmp_path / "out"
    prepare_into(out, "--input", write_jsonl_gz(tmp_path / "d.jsonl.gz"), "--max_tokens", "1K")
    lengths = np.cumsum([len(text.encode()) + 1 for text in TEXTS])
    held = sum(len(prepare.read_shard(path)) for split in ("val", "train")
               for path in prepare.shard_paths(out, split))
    assert held == lengths[np.searchsorted(lengths, 1000)]


def test_training_shards_roll_over_and_validation_stops_at_val_tokens(tmp_path):
    out = tmp_path / "out"
    names = prepare_into(out, "--input", write_jsonl_gz(tmp_path / "d.jsonl.gz"),
                         "--shard_size", "500", "--val_every", "2", "--val_tokens", "300")
    sizes = [len(prepare.read_shard(out / name)) for name in names if "_train_" in name]
    assert len(sizes) > 3 and set(sizes[:-1]) == {500} and 0 < sizes[-1] <= 500
    val = documents(out, "val")  # every 2nd document until 300 tokens are held
    assert val == TEXTS[:2 * len(val):2]
    assert sum(len(t.encode()) + 1 for t in val[:-1]) < 300 <= sum(len(t.encode()) + 1 for t in val)
    assert documents(out, "train") == [t for t in TEXTS if t not in val]  # whole across shards


def test_one_text_file_is_cut_its_line_ends_kept_and_too_short_refused(tmp_path):
    text = "".join(TEXTS).replace("\n", "\r\n")
    (tmp_path / "notes.txt").write_bytes(text.encode())
    out = tmp_path / "out"
    prepare_into(out, "--input", str(tmp_path / "notes.txt"), "--shard_size", "2000")
    val = prepare.read_shard(prepare.shard_paths(out, "val")[0])
    assert len(val) == (len(text.encode()) + 1) // 20  # --val_every's share
    assert len(prepare.shard_paths(out, "train")) > 1
    tokens = np.concatenate([prepare.read_shard(p) for s in ("val", "train")
                             for p in prepare.shard_paths(out, s)])
    assert prepare.decode_bytes(tokens) == text
    (tmp_path / "notes.txt").write_text("a")
    with pytest.raises(SystemExit, match="got 1 document"):
        prepare_into(tmp_path / "short", "--input", str(tmp_path / "notes.txt"))


def test_a_set_that_fails_midway_leaves_nothing_and_a_whole_one_keeps_the_umask(tmp_path):
    docs = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": text}) + "\n" for text in TEXTS]
    docs.write_text("".join(lines) + '{"text": 5}\n')  # found after shards are written
    with pytest.raises(SystemExit, match="docs.jsonl:61: not a JSON object with a string 'text'"):
        prepare_into(tmp_path / "data", "--input", str(docs), "--shard_size", "500")
    assert os.listdir(tmp_path) == ["docs.jsonl"]  # no data/, and nothing beside it
    docs.write_text("".join(lines))
    umask = os.umask(0o022)
    try:
        prepare_into(tmp_path / "data", "--input", str(docs))
    finally:
        os.umask(umask)
    assert sorted(os.listdir(tmp_path)) == ["data", "docs.jsonl"]
    paths = [tmp_path / "data", *(tmp_path / "data").iterdir()]
    modes = {path.name: path.stat().st_mode & 0o777 for path in paths}
    assert set(modes.values()) == {0o755, 0o644} and modes["data"] == 0o755, modes


def test_a_set_already_there_is_kept_before_tokenizing_and_other_files_refused(tmp_path, capsys):
    out = tmp_path / "out"
    prepare_into(out, "--input", write_jsonl_gz(tmp_path / "d.jsonl.gz"))
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    prepare_into(out, "--input", str(tmp_path / "missing.jsonl"))  # not read: the set is there
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"{out} already holds a data set: kept (delete it to prepare anew)")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    with pytest.raises(SystemExit, match="holds other files than gpt2 shards of local"):
        prepare_into(out, "--input", str(tmp_path / "d.jsonl.gz"), tokenizer="gpt2")


def test_pydoc_documents_are_small_pieces_of_the_topics_with_spaces_squeezed():
    from pydoc_data.topics import topics
    docs = list(prepare.pydoc_documents())
    assert len(docs) > 100 and max(map(len, docs)) < 10_000
    assert "  " not in "".join(docs) and "\n " not in "".join(docs)
    text = "".join(topics[name] for name in sorted(topics))
    assert "".join("".join(docs).split()) == "".join(text.split())  # all but spaces, in order


def test_fineweb_streams_sample_10bt_or_asks_for_datasets(tmp_path, monkeypatch):
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return iter({"text": text, "id": str(i)} for i, text in enumerate(TEXTS))

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    names = prepare_into(tmp_path / "out", "--source", "fineweb")
    assert calls == [(("HuggingFaceFW/fineweb-edu",),
                      dict(name="sample-10BT", split="train", streaming=True))]
    assert names[:2] == ["fineweb_edu_train_000001.bin", "fineweb_edu_val_000000.bin"]
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(SystemExit, match="pip install datasets"):
        prepare_into(tmp_path / "out2", "--source", "fineweb")

    def offline(*args, **kwargs):  # as requests raises it without a network
        raise ConnectionError("Name or service not known while requesting huggingface.co")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(SystemExit, match=r"^prepare.py: error: Name or service not known while"):
        prepare_into(tmp_path / "out3", "--source", "fineweb")


def test_count_takes_k_m_b_suffixes():
    assert [prepare.count(s) for s in ["500K", "100M", "2.5B", "123", "1m"]] == [
        500_000, 100_000_000, 2_500_000_000, 123, 1_000_000]
    for bad in ["", "abc", "0", "-5", "1X", "nan", "1e999"]:
        with pytest.raises(ValueError):
            prepare.count(bad)


def test_the_command_ends_with_the_train_command_for_its_own_run_directory(tmp_path):
    (tmp_path / "my.txt").write_text("A text of my own, said again and again. " * 100)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "prepare.py"), "--input", "my.txt",
                             "--tokenizer=bytes"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == (
        "next: python train.py config/cpu_demo.py --data_dir=data/local_bytes "
        "--out_dir=out/local_bytes")


def test_batches_give_each_process_its_slice_and_resume_where_they_stopped(tmp_path):
    for index in (0, 1, 2):
        prepare.write_shard(prepare.shard_path(tmp_path, "x", "train", index + 1),
                            np.arange(100 * index, 100 * index + (5 if index == 1 else 100)))
    notes = []
    whole = prepare.Batches(str(tmp_path), 2, 4, log=notes.append)  # micro-steps of 8 (+1)
    assert notes == [f"note: skipping {tmp_path}/x_train_000002.bin: its 5 tokens are fewer "
                     "than a micro-step's 9"]
    halves = [prepare.Batches(str(tmp_path), 1, 4, rank, 2, log=notes.append) for rank in (0, 1)]
    for _ in range(30):  # round and round the shards, the short one skipped
        x, y = whole.next()
        assert (y == x + 1).all() and not (x // 100 == 1).any()
        assert np.array_equal(x, np.concatenate([half.next()[0] for half in halves]))
    state, expected = whole.state(), [whole.next() for _ in range(3)]
    again = prepare.Batches(str(tmp_path), 2, 4)
    again.restore(state)
    for x, y in expected:
        assert np.array_equal(again.next()[0], x)
    prepare.write_shard(prepare.shard_path(tmp_path, "x", "train", 3), np.arange(50))
    with pytest.raises(ValueError, match="changed since the checkpoint"):
        prepare.Batches(str(tmp_path), 2, 4).restore(state)
