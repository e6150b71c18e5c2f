"""
Tokenize text with the GPT-2 BPE (or as bytes) into the binary shards that train.py reads. One
source per run:

    python prepare.py                                   # Python's bundled docs: no download
    python prepare.py --tokenizer=bytes                 # the same at byte level -> data/pydoc_bytes
    python prepare.py --input a.txt b.jsonl c.jsonl.gz  # local files (.jsonl: {"text": ...} a line)
    python prepare.py --source fineweb --max_tokens 1B  # FineWeb-Edu sample-10BT (needs datasets)

and then, e.g., `python train.py config/cpu_demo.py`. `python prepare.py -h` lists all options.

Each document becomes <|endoftext|> followed by its tokens, so the model is always told where a new
document starts, and documents are packed back to back. Every --val_every-th document goes to
validation until that split holds --val_tokens tokens; all others go to training. One document
alone (a single .txt file) is cut instead: its first 1/--val_every validates, the rest trains.
With --tokenizer=bytes each UTF-8 byte is a token and 256 starts a document (vocab_size 257):
bits per byte are then exact, and the data set's tokenizer.json says so to train.py and sample.py.

Shards use the llm.c / modded-nanogpt format: a header of 256 int32 (magic 20240520, version 1,
token count) followed by the tokens as little-endian uint16. Shard 0 holds validation,
`{prefix}_val_000000.bin`, and training follows in `{prefix}_train_000001.bin`,
`{prefix}_train_000002.bin`, ... As format and naming match, pre-tokenized GPT-2 FineWeb-Edu shards
can be dropped into a directory and used with train.py --data_dir as they are. The other scripts
find and read shards with shard_paths() and read_shard() from here, the format's one home.

A data set is whole or absent: prepare.py writes it into a new directory beside out_dir and
renames that to out_dir once every shard is written, so a reader finds no directory or the whole
set. Stopped or failed, it deletes its directory; two at once (two runs preparing the default
data) both end with the set, the first one's.
"""
import argparse
import glob
import gzip
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import zlib
from multiprocessing import Pool

import numpy as np
import tiktoken
from tqdm import tqdm


MAGIC, VERSION = 20240520, 1  # identify the llm.c / modded-nanogpt shard format
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
EOT = 50256  # GPT-2's <|endoftext|>; its largest id, so every GPT-2 token fits in a uint16
# The byte-level tokenizer (--tokenizer=bytes): each UTF-8 byte is a token, 0..255, and 256 starts a
# document, as <|endoftext|> does for GPT-2. A data set says which it holds in tokenizer.json.
BYTES_DOC = 256
BYTES_VOCAB = 257
PREFIXES = {"pydoc": "pydoc", "local": "local", "fineweb": "fineweb_edu"}  # source -> shard prefix

# -----------------------------------------------------------------------------
# shard files


def write_shard(path, tokens):
    """Write token ids as a shard (prepare writes them into a directory that is renamed whole)."""
    tokens = np.asarray(tokens)
    if tokens.size and not (tokens.min() >= 0 and tokens.max() < 2**16):
        raise ValueError(f"{path}: token ids must lie in [0, 65536) to be stored as uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, len(tokens)

    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def read_shard(path, vocab_size=None):
    """A shard's tokens as a read-only uint16 array mapped from disk (pages load only when used).
    Raises ValueError, naming the file, if it is not one whole shard, or, given vocab_size, if it
    holds an id the model has no embedding for (that check reads the shard whole)."""
    if not os.path.isfile(path):  # a directory of that name, say: open() would be a traceback
        raise ValueError(f"{path}: not a file, so not a token shard")
    try:  # unreadable (no permission), or gone since the check above: the OS says which
        size = os.path.getsize(path)
        if size < HEADER_BYTES:
            raise ValueError(f"{path}: {size} bytes is too short to hold the {HEADER_BYTES}-byte "
                             "shard header")
        magic, version, n = (int(x) for x in np.fromfile(path, dtype="<i4", count=3))
        if magic != MAGIC:
            raise ValueError(f"{path}: bad magic number {magic} (expected {MAGIC}): not a token "
                             "shard")
        if version != VERSION:
            raise ValueError(f"{path}: unsupported shard version {version} (expected {VERSION})")
        held = (size - HEADER_BYTES) // 2
        if size != HEADER_BYTES + 2 * n:
            problem = "truncated" if held < n else "size mismatch"
            raise ValueError(f"{path}: {problem}: header says {n} tokens, file holds {held}")
        tokens = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(n,))
    except OSError as e:
        raise ValueError(f"{path}: could not read it ({e.strerror})") from None
    if vocab_size is not None and n and (top := int(tokens.max())) >= vocab_size:
        raise ValueError(f"{path} holds token id {top}, but vocab_size is {vocab_size}")
    return tokens


def shard_path(out_dir, prefix, split, index):
    """Where a shard goes: out_dir/{prefix}_{split}_{index:06d}.bin (validation is shard 0)."""
    return os.path.join(out_dir, f"{prefix}_{split}_{index:06d}.bin")


def shard_paths(data_dir, split):
    """The paths of data_dir's shards of split ('train' or 'val'), in order. Raises ValueError,
    saying why, if there are none."""
    if not os.path.isdir(data_dir):
        raise ValueError(f"data_dir not found: {data_dir} (prepare.py writes shards: `--source "
                         "fineweb` for data/fineweb_edu; to start small, `--tokenizer=bytes` for "
                         "config/cpu_demo.py)")
    paths = sorted(glob.glob(os.path.join(data_dir, f"*_{split}_*.bin")))
    if not paths:
        raise ValueError(f"no *_{split}_*.bin shards in {data_dir}/: write some with prepare.py, "
                         "or point --data_dir at them")
    return paths


def token_bytes(vocab_size, data_dir):
    """(the UTF-8 byte count of each token id's text, None), or (None, why) where unknown: for
    bits per byte. <|endoftext|> is a document boundary, not text: 0 bytes."""
    if data_tokenizer(data_dir) == "bytes":
        if vocab_size != BYTES_VOCAB:
            return None, f"byte-level data needs vocab_size {BYTES_VOCAB}, not {vocab_size}"
        return np.array([1] * 256 + [0]), None  # a byte is a byte; the document start is none
    task_path = os.path.join(data_dir, "task.json")
    if os.path.isfile(task_path):  # lab/arith.py's data: a token id is a character's index
        try:
            with open(task_path, encoding="utf-8") as f:
                vocab = json.load(f).get("vocab")
        except (ValueError, OSError, AttributeError):  # cut short, or not an object: no vocab
            vocab = None
        if isinstance(vocab, str) and len(vocab) == vocab_size:
            return np.array([len(c.encode("utf-8")) for c in vocab]), None
        return None, f"{task_path} does not give the {vocab_size} tokens' characters"
    if vocab_size != EOT + 1:
        return None, f"the bytes of a vocabulary of {vocab_size} tokens (not GPT-2's) are unknown"
    try:
        enc = gpt2_encoding()
    except InputError as e:
        return None, str(e)
    return np.array([len(enc.decode_single_token_bytes(i)) for i in range(EOT)] + [0]), None


def nats_and_bytes(losses, targets, byte_counts):
    """(nats, bytes) for bits per byte = nats / (ln 2 * bytes): the loss summed over the targets
    that are text, and the UTF-8 bytes of that text. losses: each target's cross-entropy in nats;
    byte_counts: token_bytes's counts as a tensor. <|endoftext|> counts 0 bytes and its loss is
    left out: it is a document boundary, not text, and a tokenizer that marks boundaries otherwise
    (or not at all) must still compare."""
    counts = byte_counts[targets]
    return float((losses * (counts > 0)).sum()), float(counts.sum())


class Batches:
    """Training batches from data_dir's shards: (x, y) int64 arrays of B sequences of T tokens, y
    being x shifted by one, read in order through the shards, round and round. A micro-step takes a
    stretch of span = B*T*world_size tokens and process `rank` its slice, so a run sees the same
    tokens for any number of processes. Every shard is checked here, before step 0, not first when
    a run reaches it; one too short for a micro-step (like the last one prepare.py writes) is
    skipped, with a note to log. A shard opened is copied into memory. Raises ValueError, saying
    why, where data can't serve."""

    def __init__(self, data_dir, B, T, rank=0, world_size=1, vocab_size=None, log=print):
        self.files = shard_paths(data_dir, "train")
        self.data_dir, self.B, self.T, self.rank, self.span = data_dir, B, T, rank, B*T*world_size
        self.vocab_size = vocab_size
        lengths = [len(read_shard(path, vocab_size)) for path in self.files]
        self.names = [[os.path.basename(path), n] for path, n in zip(self.files, lengths)]
        self.usable = [i for i, n in enumerate(lengths) if n > self.span]  # the +1: the last target
        for path, n in zip(self.files, lengths):
            if n <= self.span:
                log(f"note: skipping {path}: its {n:,} tokens are fewer than a micro-step's "
                    f"{self.span + 1:,}")
        if not self.usable:
            raise ValueError(f"no training shard in {data_dir}/ holds one micro-step of batch_size "
                             f"* block_size * processes + 1 = {self.span+1:,} tokens (the longest "
                             f"holds {max(lengths):,}): lower them, as config/cpu_demo.py does")
        self.restore({"shard": self.usable[0], "pos": 0})

    def state(self):  # the position indexes all shards, usable or not, so it means one file
        return {"shard": self.shard, "pos": self.pos, "data_dir": os.path.realpath(self.data_dir),
                "shards": self.names}  # each training shard's name and length: which data it is

    def restore(self, state):
        shard, self.pos = state["shard"], state["pos"]
        if shard >= len(self.files) or state.get("shards", self.names) != self.names:
            raise ValueError(f"{self.data_dir}/ changed since the checkpoint: its training shards "
                             "are not those the run read (restore them, or resume on a copy)")
        if shard not in self.usable:  # too short for this run's micro-steps: on to the next
            shard, self.pos = self.following(shard), 0
        self.shard, self.tokens = shard, self.open(shard)

    def open(self, shard):
        return np.array(read_shard(self.files[shard], self.vocab_size))  # copied into memory

    def following(self, shard):
        return next((i for i in self.usable if i > shard), self.usable[0])

    def next(self):
        if self.pos + self.span + 1 > len(self.tokens):  # not enough left: on to the next shard
            self.restore({"shard": self.following(self.shard), "pos": 0})
        start = self.pos + self.rank * self.B * self.T
        buf = self.tokens[start:start + self.B * self.T + 1].astype(np.int64)
        self.pos += self.span
        return buf[:-1].reshape(self.B, self.T), buf[1:].reshape(self.B, self.T)


# -----------------------------------------------------------------------------
# sources: each yields documents as strings


class InputError(ValueError):
    """Bad input: main() (or another script, with configurator.or_fail) reports it in one line."""


def squeeze_spaces(text):
    """Each line without its indentation and with runs of spaces made one. The docs indent heavily,
    and GPT-2 spends a token per space: unsqueezed, one token in six is a space, and a small model
    learns mostly to write whitespace."""
    return "\n".join(" ".join(line.split()) for line in text.split("\n"))


def pydoc_documents(max_chars=3000):
    """Python's bundled documentation (pydoc_data, ~465K characters), its spaces squeezed, in pieces
    of about max_chars. Its topics run from 200 to 62K characters; cutting long ones at paragraph
    breaks keeps a single big topic from landing whole in (or out of) the 5% validation split."""
    from pydoc_data.topics import topics  # not at the top, so importing prepare.py stays cheap
    for name in sorted(topics):
        parts, chars = [], 0
        for paragraph in squeeze_spaces(topics[name]).split("\n\n"):
            if parts and chars + len(paragraph) > max_chars:
                yield "\n\n".join(parts)
                parts, chars = [], 0
            parts.append(paragraph)
            chars += len(paragraph) + 2
        yield "\n\n".join(parts)


def record_text(record, where):
    """The string field `text` of one record; `where` says which record, for the error message."""
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise InputError(f"{where}: expected a JSON object with a string field 'text'")
    return record["text"]


def file_documents(path):
    """A .txt file is one document; a .jsonl or .jsonl.gz file holds one JSON record per line."""
    try:
        if path.endswith(".txt"):
            with open(path, "rb") as f:
                data = f.read()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}: not UTF-8 text ({e})")
            yield text
            return
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)  # json also reports bad UTF-8 bytes as a ValueError
                except ValueError as e:
                    raise InputError(f"{path}:{lineno}: not valid JSON ({e})")
                yield record_text(record, f"{path}:{lineno}")
    # Unreadable, or, for .gz, cut short (EOFError) or not gzip (BadGzipFile, an OSError): this runs
    # in the pool's feeder thread, so left alone it would surface as a multiprocessing traceback.
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{path}: could not read it ({e})")


def local_documents(paths):
    """Documents from local files, all checked up front rather than halfway through a long run."""
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"{path}: no such file")
        if not path.endswith((".txt", ".jsonl", ".jsonl.gz")):
            raise InputError(f"{path}: unknown file type; expected .txt, .jsonl or .jsonl.gz")
    return itertools.chain.from_iterable(file_documents(path) for path in paths)


def fineweb_texts(records):
    """The text of each FineWeb-Edu record (a dict with `text`, `id`, `url`, `score`, ...)."""
    return (record_text(record, f"fineweb-edu record {i}") for i, record in enumerate(records))


def fineweb_documents():
    """FineWeb-Edu's 10B-token sample, streamed record by record from the Hugging Face hub."""
    try:
        import datasets  # optional: only this source needs it
    except ImportError:
        raise InputError("--source fineweb needs the Hugging Face datasets package: "
                         "pip install datasets")
    records = datasets.load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT", split="train",
                                    streaming=True)
    return fineweb_texts(records)


# -----------------------------------------------------------------------------
# tokenize and write


def gpt2_encoding():
    """GPT-2's BPE. tiktoken downloads its two files (1.5 MB) on first use and caches them on disk;
    offline it needs a copy of that cache, named by TIKTOKEN_CACHE_DIR."""
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # requests' connection errors, mostly: many lines each
        raise InputError(f"could not load the GPT-2 tokenizer ({type(e).__name__}): tiktoken "
                         "downloads it on first use; offline, set TIKTOKEN_CACHE_DIR to a "
                         "directory holding its cached files")


def tokenize(text):
    """<|endoftext|> then the document's GPT-2 tokens. Runs in the pool's worker processes."""
    enc = tiktoken.get_encoding("gpt2")  # tiktoken caches it: each worker loads the BPE only once
    return np.array([EOT] + enc.encode_ordinary(text), dtype=np.uint16)


def tokenize_bytes(text):
    """The document-start token then the document's UTF-8 bytes. Half of a UTF-16 pair, which JSON
    can escape and UTF-8 cannot hold, becomes U+FFFD, as tiktoken makes it."""
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return np.array([BYTES_DOC] + list(text.encode("utf-8")), dtype=np.uint16)


def ignore_ctrl_c():
    """The pool's workers leave Ctrl-C to the main process, which stops them all."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def decode_bytes(ids):
    """Text from byte-level token ids; a document start becomes a blank line, and a byte sequence
    that is not UTF-8 (a sample can stop inside a character) the replacement character."""
    docs = [[]]
    for i in ids:
        if i == BYTES_DOC:
            docs.append([])
        else:
            docs[-1].append(i)
    return "\n\n".join(bytes(doc).decode("utf-8", errors="replace") for doc in docs if doc)


def data_tokenizer(data_dir):
    """'bytes', 'gpt2' or 'characters': the tokenizer of data_dir's shards, from its tokenizer.json;
    without one, lab/arith.py's characters where its task.json is, else GPT-2 BPE."""
    path = os.path.join(data_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return "characters" if os.path.isfile(os.path.join(data_dir, "task.json")) else "gpt2"
    try:
        with open(path, encoding="utf-8") as f:
            tokenizer = json.load(f).get("tokenizer")
    except (ValueError, OSError, AttributeError) as e:
        raise ValueError(f"{path}: not prepare.py's tokenizer.json ({e})") from None
    if tokenizer not in ("bytes", "gpt2"):
        raise ValueError(f"{path}: unknown tokenizer {tokenizer!r} (prepare.py writes 'bytes')")
    return tokenizer


def prepare(documents, out_dir, prefix, args):
    """Tokenize documents in parallel, split them into validation and training, write the shards.
    Returns their number, the documents and the tokens of each split."""
    encode = tokenize_bytes if args.tokenizer == "bytes" else tokenize
    if args.tokenizer == "bytes":  # train.py and sample.py read it
        with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
            json.dump({"tokenizer": "bytes", "vocab_size": BYTES_VOCAB}, f)
    else:
        gpt2_encoding()  # loaded here, once, before the workers start: they find it cached
    val = []  # validation documents, written last as shard 0
    buf, fill = np.empty(args.shard_size, dtype=np.uint16), 0  # the training shard being filled
    n_docs = n_val = n_train = n_train_shards = 0
    # imap keeps documents in order, so a run is reproducible; chunks amortize inter-process traffic
    with Pool(args.workers, ignore_ctrl_c) as pool, \
            tqdm(total=args.max_tokens, unit="tok", unit_scale=True) as bar:
        for tokens in pool.imap(encode, documents, chunksize=16):
            bar.update(len(tokens))
            if n_docs % args.val_every == 0 and n_val < args.val_tokens:
                val.append(tokens)
                n_val += len(tokens)
            else:
                n_train += len(tokens)
                while len(tokens):  # a document may straddle two shards (or, if long, span several)
                    take = min(len(tokens), args.shard_size - fill)
                    buf[fill:fill + take] = tokens[:take]
                    fill, tokens = fill + take, tokens[take:]
                    if fill == args.shard_size:
                        n_train_shards += 1
                        write_shard(shard_path(out_dir, prefix, "train", n_train_shards), buf)
                        fill = 0
            n_docs += 1
            if args.max_tokens and n_val + n_train >= args.max_tokens:
                break
    if n_train == 0 and n_docs == 1 and len(val[0]) > 2:  # one document (one .txt): split it
        doc, cut = val[0], min(max(1, len(val[0]) // args.val_every), args.val_tokens)
        val, n_val, n_train, buf, fill = [doc[:cut]], cut, len(doc) - cut, doc[cut:], len(doc) - cut
    if n_train == 0:
        raise InputError(f"got {n_docs} document(s); need at least 2, since the first goes to "
                         "validation")
    for part in (buf[i:fill][:args.shard_size] for i in range(0, fill, args.shard_size)):
        n_train_shards += 1  # several parts only from one document's tail, split off above
        write_shard(shard_path(out_dir, prefix, "train", n_train_shards), part)
    write_shard(shard_path(out_dir, prefix, "val", 0), np.concatenate(val))
    return {"shards": n_train_shards + 1, "documents": n_docs, "val_tokens": n_val,
            "train_tokens": n_train}


def count(text):
    """A positive count: '500K', '100M', '2.5B' or a plain integer."""
    scale = {"K": 10**3, "M": 10**6, "B": 10**9}.get(text[-1:].upper(), 1)
    try:
        n = round(float(text[:-1] if scale > 1 else text) * scale)
    except (ValueError, OverflowError):
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive count like 500K, 100M, 2.5B or "
                                         f"1000: {text!r}")
    return n


def main(argv=None):
    """prepare.py's command line (argv: its words, default sys.argv's)."""
    parser = argparse.ArgumentParser(
        description="Tokenize text into token shards for train.py (GPT-2 BPE, or bytes).")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--input", nargs="+", metavar="PATH",
                        help=".txt, .jsonl or .jsonl.gz files")
    source.add_argument("--source", choices=["pydoc", "fineweb"], default="pydoc",
                        help="built-in source, when no --input is given (default: pydoc)")
    parser.add_argument("--out_dir", help="where the shards go (default: data/pydoc, data/local or "
                        "data/fineweb_edu)")
    parser.add_argument("--max_tokens", type=count, metavar="N", help="stop after about N tokens, "
                        "in whole documents (default: use everything)")
    parser.add_argument("--shard_size", type=count, default=10**8, metavar="N", help="tokens per "
                        "training shard (default 100M: 200 MB, small enough to load whole)")
    parser.add_argument("--val_every", type=count, default=20, metavar="N",
                        help="every N-th document goes to validation... (default 20, i.e. 5%%)")
    parser.add_argument("--val_tokens", type=count, default=10**7, metavar="N", help="...until it "
                        "holds N tokens (default 10M, plenty for a low-noise val loss)")
    parser.add_argument("--tokenizer", choices=["gpt2", "bytes"], default="gpt2",
                        help="GPT-2 BPE (default), or bytes: each UTF-8 byte a token (vocab 257)")
    parser.add_argument("--workers", type=count, default=os.cpu_count(), metavar="N",
                        help="tokenizer processes (default: one per CPU core)")
    args = parser.parse_args(argv)
    if args.shard_size >= 2**31:  # the header counts a shard's tokens in an int32
        parser.error(f"argument --shard_size: at most 2**31 - 1 tokens, got {args.shard_size:,}")
    if args.workers > 4 * (os.cpu_count() or 1):  # each is a process: 10**9 would fork for ever
        parser.error(f"argument --workers: at most 4 per CPU core ({os.cpu_count()} here), "
                     f"got {args.workers:,}")

    name = "local" if args.input else args.source
    prefix = PREFIXES[name]
    suffix = "_bytes" if args.tokenizer == "bytes" else ""
    out_dir = args.out_dir or os.path.join("data", prefix + suffix)
    if kept(out_dir, prefix, args.tokenizer):
        return
    try:
        aside = make_aside(out_dir)
    except OSError as e:
        sys.exit(f"prepare.py: error: cannot write beside {out_dir}: {e.strerror}")
    try:
        if name == "local":
            documents = local_documents(args.input)
        elif name == "fineweb":
            documents = fineweb_documents()
        else:
            documents = pydoc_documents()
        summary = prepare(documents, aside, prefix, args)
        os.rename(aside, out_dir)  # over an empty directory, or none
    except InputError as e:
        sys.exit(f"prepare.py: error: {e}")
    except OSError as e:  # a full disk, say; or out_dir made meanwhile (by a second prepare.py)
        if kept(out_dir, prefix, args.tokenizer):
            return
        where = e.filename2 or e.filename  # a rename's: out_dir
        sys.exit(f"prepare.py: error: {where}: {e.strerror}" if where else
                 f"prepare.py: error: {e}")
    finally:
        shutil.rmtree(aside, ignore_errors=True)  # renamed: gone already
    print(f"wrote {summary['shards']} shards to {out_dir} ({summary['documents']:,} documents): "
          f"val {summary['val_tokens']:,} tokens, train {summary['train_tokens']:,} tokens")
    if argv is None:  # run as a command: what to run next (train.py, calling main, runs it now)
        print(f"next: {next_command(out_dir, prefix, args.tokenizer)}")


def make_aside(out_dir):
    """A new directory beside out_dir (on its filesystem, so that renaming it to out_dir is one
    step), where a data set is written until it is whole."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out_dir)}.")


def next_command(out_dir, prefix, tokenizer):
    """The train.py command for a set just written to out_dir: the preset for its tokenizer and
    source, and a run directory named for the data, so that it never lands in a run the preset's
    own out_dir already holds (the quick start's out/cpu_demo, say), which train.py would refuse."""
    if tokenizer == "bytes":
        config = "config/cpu_demo.py"
    elif prefix == PREFIXES["fineweb"]:
        config = "config/gpt2.py"
    else:
        config = "config/pydoc_bpe.py"
    run_dir = os.path.join("out", os.path.basename(os.path.normpath(out_dir)))
    return f"python train.py {config} --data_dir={out_dir} --out_dir={run_dir}"


def kept(out_dir, prefix, tokenizer):
    """Whether out_dir holds a set of prefix's shards, which is kept, saying so; stops in one
    line where it holds other files, or shards of another tokenizer."""
    if not os.path.isdir(out_dir) or not os.listdir(out_dir):
        return False
    shards = glob.glob(os.path.join(out_dir, f"{prefix}_*.bin"))
    if not os.path.exists(shard_path(out_dir, prefix, "val", 0)):
        sys.exit(f"prepare.py: error: {out_dir} holds other files: give another --out_dir")
    try:
        held = data_tokenizer(out_dir)
    except ValueError as e:
        sys.exit(f"prepare.py: error: {e}")
    if held != tokenizer:
        sys.exit(f"prepare.py: error: {out_dir} holds {held} shards: give another --out_dir")
    print(f"{out_dir} already holds {len(shards)} shards: kept (delete them to prepare anew)")
    return True


def prepare_if_default(data_dir):
    """train.py's first step on a fresh clone: when data_dir is where `python prepare.py` puts the
    embedded data set (data/pydoc, or data/pydoc_bytes with --tokenizer=bytes) and is missing,
    make it."""
    pydoc = PREFIXES["pydoc"]
    tokenizers = {os.path.join("data", pydoc): "gpt2",
                  os.path.join("data", pydoc + "_bytes"): "bytes"}
    tokenizer = tokenizers.get(os.path.normpath(data_dir))
    if tokenizer is None or os.path.isdir(data_dir):
        return
    print(f"{data_dir} holds no data set: preparing Python's docs there (as `python prepare.py"
          f"{' --tokenizer=bytes' if tokenizer == 'bytes' else ''}`)", flush=True)
    main(["--out_dir", data_dir, "--tokenizer", tokenizer])


if __name__ == "__main__":
    main()
