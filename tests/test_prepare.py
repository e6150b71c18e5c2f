"""
Tests for prepare.py: the shard format, the val/train split, the sources and the error messages.
Offline and CPU only: python -m pytest -q tests/test_prepare.py
"""
import errno
import gzip
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import prepare

# GPT-2's tokenizer (conftest.py), loaded before the pool forks so that its workers need not load
# it again; every test that prepares GPT-2 tokens asks for it, and skips offline without its files.
needs_gpt2 = pytest.mark.usefixtures("gpt2")
PREPARE_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "prepare.py")


def make_texts(n):
    # Distinct, non-ASCII-heavy documents, so a mix-up or a bad decode shows in the round trip.
    return [f"Document {i}: naïve café — {i * 7919} 日本語 😀\n" + "the quick brown fox " * (i % 5 + 1)
            for i in range(n)]


def write_jsonl_gz(path, texts):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"text": text, "id": i}) + "\n")
    return str(path)


def run(out_dir, *args):
    """prepare.py with args into out_dir: the files it holds then."""
    prepare.main([*args, "--out_dir", str(out_dir), "--workers", "2"])
    return sorted(os.listdir(out_dir))


def split_documents(tokens):
    """Token stream -> list of documents, each starting with its <|endoftext|>."""
    return [list(doc) for doc in np.split(tokens, np.flatnonzero(tokens == prepare.EOT))[1:]]


def read_documents(path):
    return split_documents(prepare.read_shard(path))


def expected_tokens(text):
    return [prepare.EOT] + prepare.gpt2_encoding().encode_ordinary(text)


# -----------------------------------------------------------------------------
# end to end


@needs_gpt2
def test_local_jsonl_gz_round_trips_through_val_and_train_shards(tmp_path):
    texts = make_texts(40)
    path = write_jsonl_gz(tmp_path / "docs.jsonl.gz", texts)
    out = tmp_path / "out"
    assert run(out, "--input", path, "--val_every", "5") == ["local_train_000001.bin", "local_val_000000.bin"]

    for name in ["local_val_000000.bin", "local_train_000001.bin"]:
        header = np.fromfile(out / name, dtype="<i4", count=256)
        assert header[0] == 20240520 and header[1] == 1
        assert os.path.getsize(out / name) == 256 * 4 + 2 * header[2]
    val = read_documents(out / "local_val_000000.bin")
    train = read_documents(out / "local_train_000001.bin")
    val_texts = [t for i, t in enumerate(texts) if i % 5 == 0]
    train_texts = [t for i, t in enumerate(texts) if i % 5 != 0]
    assert val == [expected_tokens(t) for t in val_texts]
    assert train == [expected_tokens(t) for t in train_texts]
    assert [prepare.gpt2_encoding().decode(doc[1:]) for doc in val + train] == val_texts + train_texts


@needs_gpt2
def test_default_source_writes_nonempty_val_and_train_shards_from_pydoc(tmp_path):
    out = tmp_path / "out"
    assert run(out) == ["pydoc_train_000001.bin", "pydoc_val_000000.bin"]
    val = prepare.read_shard(out / "pydoc_val_000000.bin")
    train = prepare.read_shard(out / "pydoc_train_000001.bin")
    assert len(val) > 0 and len(train) > 0
    # The 5% split is only representative if it is made of many documents and holds about 5% of the tokens.
    assert (val == prepare.EOT).sum() >= 5
    assert 0.03 < len(val) / (len(val) + len(train)) < 0.1


@needs_gpt2
def test_max_tokens_stops_after_the_document_that_reaches_it(tmp_path):
    texts = make_texts(200)
    path = write_jsonl_gz(tmp_path / "docs.jsonl.gz", texts)
    out = tmp_path / "out"
    total = sum(len(prepare.read_shard(out / name))
                for name in run(out, "--input", path, "--max_tokens", "1K"))
    lengths = np.cumsum([len(expected_tokens(t)) for t in texts])
    assert total == lengths[np.searchsorted(lengths, 1000)]  # whole documents, the last one crossing 1K


@needs_gpt2
def test_training_shards_roll_over_at_shard_size(tmp_path):
    texts = make_texts(60)
    path = write_jsonl_gz(tmp_path / "docs.jsonl.gz", texts)
    out = tmp_path / "out"
    names = run(out, "--input", path, "--shard_size", "100")
    train_names = [n for n in names if "_train_" in n]
    assert train_names == [f"local_train_{i:06d}.bin" for i in range(1, len(train_names) + 1)]
    sizes = [len(prepare.read_shard(out / n)) for n in train_names]
    assert len(sizes) > 3 and all(s == 100 for s in sizes[:-1]) and 0 < sizes[-1] <= 100
    # Documents straddle shard boundaries, but the shards joined give back every training document whole.
    train = np.concatenate([prepare.read_shard(out / n) for n in train_names])
    assert split_documents(train) == [expected_tokens(t) for i, t in enumerate(texts) if i % 20 != 0]


@needs_gpt2
def test_validation_stops_taking_documents_once_it_holds_val_tokens(tmp_path):
    texts = make_texts(100)
    path = write_jsonl_gz(tmp_path / "docs.jsonl.gz", texts)
    out = tmp_path / "out"
    run(out, "--input", path, "--val_every", "2", "--val_tokens", "100")
    val = read_documents(out / "local_val_000000.bin")
    n_val = 0
    for i, doc in enumerate(val):  # every 2nd document, in order, until the 100 tokens are reached
        assert n_val < 100 and doc == expected_tokens(texts[2 * i])
        n_val += len(doc)
    assert n_val >= 100


@needs_gpt2
def test_one_text_file_is_split_its_first_part_validating_the_rest(tmp_path):
    text = " ".join(make_texts(40))
    path = tmp_path / "notes.txt"
    path.write_text(text)
    shards = run(tmp_path / "out", "--input", str(path))
    assert shards == ["local_train_000001.bin", "local_val_000000.bin"]
    val = prepare.read_shard(tmp_path / "out" / "local_val_000000.bin")
    train = prepare.read_shard(tmp_path / "out" / "local_train_000001.bin")
    assert list(val) + list(train) == expected_tokens(text)  # one document, cut once
    assert len(val) == len(expected_tokens(text)) // 20  # --val_every's share
    path.write_text("one")  # too short to split: still an error
    with pytest.raises(SystemExit, match="need at least 2"):
        run(tmp_path / "short", "--input", str(path))
    assert not list((tmp_path / "short").glob("*.bin"))


@needs_gpt2
def test_one_text_file_is_cut_into_training_shards_of_shard_size(tmp_path):
    text = " ".join(make_texts(40))
    path = tmp_path / "notes.txt"
    path.write_text(text)
    names = run(tmp_path / "out", "--input", str(path), "--shard_size", "100")
    train_names = [n for n in names if "_train_" in n]
    assert train_names == [f"local_train_{i:06d}.bin" for i in range(1, len(train_names) + 1)]
    sizes = [len(prepare.read_shard(tmp_path / "out" / n)) for n in train_names]
    assert len(sizes) > 3 and all(s == 100 for s in sizes[:-1]) and 0 < sizes[-1] <= 100, sizes
    shards = [prepare.read_shard(tmp_path / "out" / n) for n in ["local_val_000000.bin", *train_names]]
    assert list(np.concatenate(shards)) == expected_tokens(text)  # still one document, cut in order


@needs_gpt2
def test_rerun_keeps_a_finished_set_and_refuses_a_directory_of_other_files(tmp_path, capsys):
    path = write_jsonl_gz(tmp_path / "docs.jsonl.gz", make_texts(10))
    out = tmp_path / "out"
    run(out, "--input", path)
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")}
    run(out, "--input", path)
    assert "kept" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")} == before
    # A directory of other files is no data set of prepare.py's: refused, and left as it was
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("mine")
    with pytest.raises(SystemExit, match="notes holds other files: give another --out_dir"):
        run(tmp_path / "notes", "--input", path)
    assert os.listdir(tmp_path / "notes") == ["mine.txt"]


# -----------------------------------------------------------------------------
# sources


@needs_gpt2
def test_txt_file_is_one_document_kept_byte_for_byte(tmp_path):
    texts = ["first file\r\nwith Windows line ends\n", "second ☃ file\n\n\n"]
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"{i}.txt")
        paths[-1].write_bytes(text.encode("utf-8"))
    out = tmp_path / "out"
    run(out, "--input", *map(str, paths))
    docs = read_documents(out / "local_val_000000.bin") + read_documents(out / "local_train_000001.bin")
    assert [prepare.gpt2_encoding().decode(doc[1:]) for doc in docs] == texts


def test_pydoc_documents_are_small_pieces_that_rejoin_into_the_topics():
    from pydoc_data.topics import topics
    docs = list(prepare.pydoc_documents())
    assert len(docs) > 100 and max(map(len, docs)) < 10_000
    assert "\n\n".join(docs) == "\n\n".join(prepare.squeeze_spaces(topics[name]) for name in sorted(topics))
    assert "  " not in "".join(docs) and "\n " not in "".join(docs)


def test_fineweb_texts_takes_the_text_field_and_names_a_bad_record():
    records = [{"text": "a", "id": "x", "score": 3.1}, {"text": "b", "id": "y", "score": 2.7}]
    assert list(prepare.fineweb_texts(iter(records))) == ["a", "b"]
    with pytest.raises(prepare.InputError, match="fineweb-edu record 1"):
        list(prepare.fineweb_texts(iter([{"text": "a"}, {"body": "no text field"}])))


@needs_gpt2
def test_fineweb_source_streams_sample_10bt_into_fineweb_edu_shards(tmp_path, monkeypatch):
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return iter({"text": t, "id": str(i)} for i, t in enumerate(make_texts(30)))

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    names = run(tmp_path / "out", "--source", "fineweb")
    expected_call = (("HuggingFaceFW/fineweb-edu",), dict(name="sample-10BT", split="train", streaming=True))
    assert calls == [expected_call]
    assert names == ["fineweb_edu_train_000001.bin", "fineweb_edu_val_000000.bin"]


def test_fineweb_without_datasets_package_says_pip_install_datasets(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(SystemExit, match="pip install datasets"):
        run(tmp_path / "out", "--source", "fineweb")


def test_next_line_trains_into_a_run_directory_of_its_own(tmp_path):
    # A newcomer after the quick start (its run is in out/cpu_demo) prepares a text of their own:
    # the command prepare.py suggests must not train into out/cpu_demo, which train.py refuses.
    text = tmp_path / "my.txt"
    text.write_text("A text of my own, said again and again. " * 1000)
    result = subprocess.run([sys.executable, PREPARE_PY, "--input", str(text), "--tokenizer=bytes"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == (
        "next: python train.py config/cpu_demo.py --data_dir=data/local_bytes "
        "--out_dir=out/local_bytes")


# -----------------------------------------------------------------------------
# errors a user sees


def test_bad_json_line_exits_nonzero_with_file_and_line_in_one_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": oops}\n')
    command = [sys.executable, PREPARE_PY, "--input", str(path), "--out_dir", str(tmp_path / "out"),
               "--tokenizer", "bytes"]  # the input is read the same way for either tokenizer
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("prepare.py: error: ") and f"{path}:3: not valid JSON" in last_line


@pytest.mark.parametrize("line, problem", [('{"id": 1}', "string field 'text'"),
                                           ('{"text": 42}', "string field 'text'"),
                                           (b'{"text": "\xff"}', "not valid JSON")])
def test_bad_record_is_reported_with_file_and_line(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    good = b'{"text": "fine"}\n'
    path.write_bytes(good + (line if isinstance(line, bytes) else line.encode()) + b"\n" + good)
    with pytest.raises(SystemExit, match=f"{path}:2: .*{problem}"):
        run(tmp_path / "out", "--input", str(path), "--tokenizer", "bytes")


@pytest.mark.parametrize("name, problem", [("missing.jsonl", "no such file"),
                                           ("notes.md", "unknown file type")])
def test_missing_or_unknown_input_file_is_named_in_the_error(tmp_path, name, problem):
    (tmp_path / "notes.md").write_text("# not a supported type")
    with pytest.raises(SystemExit, match=f"{tmp_path / name}: {problem}"):
        run(tmp_path / "out", "--input", str(tmp_path / name))


def test_count_accepts_k_m_b_suffixes_and_plain_integers():
    assert [prepare.count(s) for s in ["500K", "100M", "2.5B", "123", "1m"]] == [
        500_000, 100_000_000, 2_500_000_000, 123, 1_000_000]
    for bad in ["", "abc", "0", "-5", "1X", "nan"]:
        with pytest.raises(Exception, match="positive count"):
            prepare.count(bad)


# -----------------------------------------------------------------------------
# the shard format


def test_write_shard_then_read_shard_round_trips_tokens(tmp_path):
    tokens = np.array([0, 1, prepare.EOT, 65535], dtype=np.uint16)
    prepare.write_shard(tmp_path / "x.bin", tokens)
    assert os.path.getsize(tmp_path / "x.bin") == 1024 + 2 * len(tokens)
    assert np.array_equal(prepare.read_shard(tmp_path / "x.bin"), tokens)
    with pytest.raises(ValueError, match="uint16"):
        prepare.write_shard(tmp_path / "y.bin", [1, 65536])


def damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "truncated":
        return bytes(data[:-10])
    if how == "bad magic":
        return b"\x00\x00\x00\x00" + bytes(data[4:])
    if how == "bad version":
        return bytes(data[:4]) + np.int32(2).tobytes() + bytes(data[8:])
    if how == "shorter than the header":
        return bytes(data[:100])
    return bytes(data) + b"\x00\x00"  # extra tokens the header does not count


@pytest.mark.parametrize("how, message", [
    ("truncated", "truncated: header says 1000 tokens, file holds 995"),
    ("bad magic", "bad magic number 0"),
    ("bad version", "unsupported shard version 2"),
    ("shorter than the header", "too short"),
    ("too long", "size mismatch: header says 1000 tokens, file holds 1001"),
])
def test_read_shard_rejects_a_damaged_file_naming_it_and_the_problem(tmp_path, how, message):
    path = tmp_path / "data_train_000001.bin"
    prepare.write_shard(path, np.arange(1000))
    path.write_bytes(damage(path, how))
    with pytest.raises(ValueError) as error:
        prepare.read_shard(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_other_scripts_find_shards_in_order_and_get_one_clear_error(tmp_path):
    # shard_paths / read_shard are how train.py, evaluate.py, analyze.py and arith.py find and read data.
    for split, index in [("train", 2), ("val", 0), ("train", 1)]:
        prepare.write_shard(prepare.shard_path(str(tmp_path), "x", split, index), [5, 1, 2])
    assert prepare.shard_paths(str(tmp_path), "train") == [str(tmp_path / "x_train_000001.bin"),
                                                           str(tmp_path / "x_train_000002.bin")]
    assert list(prepare.read_shard(prepare.shard_paths(str(tmp_path), "val")[0], vocab_size=6)) == [5, 1, 2]
    with pytest.raises(ValueError, match=r"x_val_000000.bin holds token id 5, but vocab_size is 5"):
        prepare.read_shard(str(tmp_path / "x_val_000000.bin"), vocab_size=5)
    with pytest.raises(ValueError, match=r"^data_dir not found: .*nowhere \(prepare.py writes shards"):
        prepare.shard_paths(str(tmp_path / "nowhere"), "val")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no \*_train_\*\.bin shards in .*empty/: write some with prepare.py"):
        prepare.shard_paths(str(tmp_path / "empty"), "train")


# -----------------------------------------------------------------------------
# the byte-level tokenizer


def test_byte_shards_round_trip_text_exactly_and_say_their_tokenizer(tmp_path):
    texts = make_texts(30)
    out = tmp_path / "bytes"
    files = run(out, "--input", write_jsonl_gz(tmp_path / "docs.jsonl.gz", texts),
                "--tokenizer", "bytes")
    assert files == ["local_train_000001.bin", "local_val_000000.bin", "tokenizer.json"]
    assert prepare.data_tokenizer(str(out)) == "bytes"
    docs = []
    for name in ("local_val_000000.bin", "local_train_000001.bin"):
        tokens = prepare.read_shard(str(out / name), prepare.BYTES_VOCAB)
        assert tokens.max() <= prepare.BYTES_DOC and tokens[0] == prepare.BYTES_DOC
        docs += prepare.decode_bytes(tokens).split("\n\n")
    # every document, non-ASCII included, byte for byte (a text may itself hold blank lines:
    # these hold none)
    assert sorted(docs) == sorted(texts)
    counts, why = prepare.token_bytes(prepare.BYTES_VOCAB, str(out))
    assert why is None and counts[:256].tolist() == [1] * 256 and counts[256] == 0
    assert prepare.token_bytes(50257, str(out))[0] is None


def test_lone_surrogates_become_u_fffd_in_both_tokenizers(tmp_path, gpt2):
    # JSON can escape half of a UTF-16 pair ("\\ud800"), which is no character and has no UTF-8
    # bytes: GPT-2's tokenizer writes U+FFFD for it, and the byte-level one must do the same (it
    # failed in a tokenizer process). A whole escaped pair is its one character.
    texts = ["lone \ud800 here", "two \udc00\ud800 and a pair \ud83d\ude00"] * 3
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    read = {}
    for tokenizer in ("bytes", "gpt2"):
        out = tmp_path / tokenizer
        run(out, "--input", str(docs), "--tokenizer", tokenizer, "--val_every", "2")
        tokens = np.concatenate([prepare.read_shard(path) for split in ("val", "train")
                                 for path in prepare.shard_paths(str(out), split)])
        read[tokenizer] = (prepare.decode_bytes(tokens).split("\n\n") if tokenizer == "bytes" else
                           [gpt2.decode(doc[1:]) for doc in split_documents(tokens)])
    assert sorted(read["bytes"]) == sorted(read["gpt2"]) == \
        sorted(["lone \ufffd here", "two \ufffd\ufffd and a pair \U0001f600"] * 3)


def test_decode_bytes_separates_documents_and_survives_a_cut_character():
    ids = [prepare.BYTES_DOC, *"café".encode("utf-8"), prepare.BYTES_DOC, *"日本".encode()[:-1]]
    assert prepare.decode_bytes(ids) == "café\n\n日\ufffd"


def test_a_gpt2_set_prepared_over_a_byte_level_one_is_refused_or_relabelled(tmp_path):
    out = tmp_path / "set"
    path = write_jsonl_gz(tmp_path / "docs.jsonl.gz", make_texts(10))
    run(out, "--input", path, "--tokenizer", "bytes")
    with pytest.raises(SystemExit, match="holds bytes shards: give another --out_dir"):
        run(out, "--input", path)  # GPT-2 over a finished byte-level set
    (out / "tokenizer.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not prepare.py's tokenizer.json"):
        prepare.data_tokenizer(str(out))
