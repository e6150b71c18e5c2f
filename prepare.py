"""
Tokenize text with the GPT-2 BPE (or as bytes) into the token shards that train.py reads:

    python prepare.py                                   # Python's bundled docs: no download
    python prepare.py --tokenizer=bytes                 # the same at byte level -> data/pydoc_bytes
    python prepare.py --input a.txt b.jsonl c.jsonl.gz  # local files (.jsonl: {"text": ...} a line)
    python prepare.py --source fineweb --max_tokens 1B  # FineWeb-Edu sample-10BT (needs datasets)

Each document is a start token (<|endoftext|>; 256 at byte level) then its tokens, packed back to
back. Every --val_every-th document validates until that split holds --val_tokens tokens; one
document alone (a .txt file) is cut instead. Shards are llm.c / modded-nanogpt's (a header of 256
int32, then uint16 tokens); shard 0 validates. A data set is written aside and renamed once whole.
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
import zlib
from multiprocessing import Pool

import numpy as np
import tiktoken
from tqdm import tqdm

MAGIC, VERSION = 20240520, 1  # identify the llm.c / modded-nanogpt shard format
HEADER_INTS = 256  # int32s: 1024 bytes
EOT = 50256  # GPT-2's <|endoftext|>; its largest id, so every GPT-2 token fits in a uint16
# The byte-level tokenizer (--tokenizer=bytes): each UTF-8 byte is a token, 0..255, and 256 starts a
# document, as <|endoftext|> does for GPT-2. A data set says which it holds in tokenizer.json.
BYTES_DOC = 256
BYTES_VOCAB = 257

# -----------------------------------------------------------------------------
# shard files
def write_shard(path, tokens):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def read_shard(path, vocab_size=None):
    """A shard's tokens, mapped; a ValueError if it is no whole shard, or has ids >= vocab_size."""
    header = np.fromfile(path, dtype="<i4", count=3)
    if len(header) < 3 or (header[0], header[1]) != (MAGIC, VERSION):
        raise ValueError(f"{path}: not a token shard (its header lacks magic {MAGIC}, version "
                         f"{VERSION})")
    n, size = int(header[2]), os.path.getsize(path)
    if size != HEADER_INTS * 4 + 2 * n:
        raise ValueError(f"{path}: its header says {n} tokens, but it holds {size} bytes")
    tokens = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_INTS * 4, shape=(n,))
    if vocab_size is not None and n and (top := int(tokens.max())) >= vocab_size:
        raise ValueError(f"{path} holds token id {top}, but vocab_size is {vocab_size}")
    return tokens


def shard_path(out_dir, prefix, split, index):
    return os.path.join(out_dir, f"{prefix}_{split}_{index:06d}.bin")


def shard_paths(data_dir, split):
    """The paths of data_dir's shards of split, 'train' or 'val', in order; a ValueError if none."""
    if not os.path.isdir(data_dir):
        raise ValueError(f"data_dir not found: {data_dir} (prepare.py writes data sets: "
                         "python prepare.py -h)")
    paths = sorted(glob.glob(os.path.join(data_dir, f"*_{split}_*.bin")))
    if not paths:
        raise ValueError(f"no *_{split}_*.bin shards in {data_dir}/: write some with prepare.py, "
                         "or point --data_dir at them")
    return paths


def token_bytes(vocab_size, data_dir):
    """(each token id's UTF-8 byte count, None), or (None, why) where unknown: for bits per byte."""
    tokenizer = data_tokenizer(data_dir)
    if tokenizer == "bytes":
        if vocab_size != BYTES_VOCAB:
            return None, f"byte-level data needs vocab_size {BYTES_VOCAB}, not {vocab_size}"
        return np.array([1] * 256 + [0]), None  # a document start is no text
    if tokenizer == "characters":  # lab/arith.py's data: a token id is a character's index
        task_path = os.path.join(data_dir, "task.json")
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
    except ValueError as e:
        return None, str(e)
    return np.array([len(enc.decode_single_token_bytes(i)) for i in range(EOT)] + [0]), None


def nats_and_bytes(losses, targets, byte_counts):
    """(nats, bytes) for bits per byte, nats / (ln 2 * bytes): the losses summed over the targets
    that are text, and their UTF-8 bytes; <|endoftext|> is none, so that tokenizers compare."""
    counts = byte_counts[targets]
    return float((losses * (counts > 0)).sum()), float(counts.sum())


class Batches:
    """(x, y) int64 arrays of B sequences of T tokens, y being x shifted by one, read in order
    through data_dir's training shards, round and round. A micro-step takes span = B*T*world_size
    tokens and process `rank` its slice, so any number of processes see the same tokens."""

    def __init__(self, data_dir, B, T, rank=0, world_size=1, vocab_size=None, log=print):
        self.files = shard_paths(data_dir, "train")
        self.data_dir, self.B, self.T, self.rank, self.span = data_dir, B, T, rank, B*T*world_size
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
            shard, self.pos = next((i for i in self.usable if i > shard), self.usable[0]), 0
        self.shard = shard
        self.tokens = np.array(read_shard(self.files[shard]))  # into memory (checked in __init__)

    def next(self):
        if self.pos + self.span + 1 > len(self.tokens):  # not enough left: on to the next shard
            self.restore({"shard": (self.shard + 1) % len(self.files), "pos": 0})
        start = self.pos + self.rank * self.B * self.T
        buf = self.tokens[start:start + self.B * self.T + 1].astype(np.int64)
        self.pos += self.span
        return buf[:-1].reshape(self.B, self.T), buf[1:].reshape(self.B, self.T)


# -----------------------------------------------------------------------------
# sources: each yields documents as strings
def pydoc_documents(max_chars=3000):
    """Python's bundled documentation (~465K characters) in pieces of about max_chars: a topic of
    up to 62K characters, cut at paragraphs, lands in both splits."""
    from pydoc_data.topics import topics  # not at the top, so importing prepare.py stays cheap
    for name in sorted(topics):
        # The docs indent heavily, and GPT-2 spends a token per space: unsqueezed, one token in six
        # is a space. Each line loses its indentation, and runs of spaces become one.
        text = "\n".join(" ".join(line.split()) for line in topics[name].split("\n"))
        parts, chars = [], 0
        for paragraph in text.split("\n\n"):
            if parts and chars + len(paragraph) > max_chars:
                yield "\n\n".join(parts)
                parts, chars = [], 0
            parts.append(paragraph)
            chars += len(paragraph) + 2
        yield "\n\n".join(parts)


def file_documents(path):
    """A .txt file is one document; a .jsonl or .jsonl.gz file holds one JSON record per line."""
    try:
        if path.endswith(".txt"):
            with open(path, encoding="utf-8", newline="") as f:  # its line ends as they are
                yield f.read()
            return
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:  # not JSON (bad UTF-8 bytes too), or no object
                    text = json.loads(line)["text"]
                except (ValueError, LookupError, TypeError):
                    text = None
                if not isinstance(text, str):
                    raise ValueError(f"{path}:{lineno}: not a JSON object with a string 'text'")
                yield text
    # Unreadable, not UTF-8, or, for .gz, cut short (EOFError) or not gzip (an OSError): this runs
    # in the pool's feeder thread, so left alone it would surface as a multiprocessing traceback.
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: could not read it ({e})")


def local_documents(paths):
    """Documents from local files, all checked up front rather than halfway through a long run."""
    for path in paths:
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no such file")
        if not path.endswith((".txt", ".jsonl", ".jsonl.gz")):
            raise ValueError(f"{path}: unknown file type; expected .txt, .jsonl or .jsonl.gz")
    return itertools.chain.from_iterable(file_documents(path) for path in paths)


def fineweb_documents():
    """FineWeb-Edu's 10B-token sample, streamed record by record from the Hugging Face hub."""
    try:
        import datasets  # optional: only this source needs it
    except ImportError:
        raise ValueError("--source fineweb needs Hugging Face's datasets: pip install datasets")
    records = datasets.load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT", split="train",
                                    streaming=True)
    return (record["text"] for record in records)


# -----------------------------------------------------------------------------
# tokenize and write
def gpt2_encoding():
    """GPT-2's BPE, which tiktoken downloads on first use and caches."""
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # requests' connection errors, mostly: many lines each
        raise ValueError(f"could not load the GPT-2 tokenizer ({type(e).__name__}): tiktoken "
                         "downloads it once; offline, point TIKTOKEN_CACHE_DIR at its cache")


def tokenize(text):
    """<|endoftext|> then the document's GPT-2 tokens. Runs in the pool's worker processes."""
    enc = tiktoken.get_encoding("gpt2")  # tiktoken caches it: each worker loads the BPE only once
    return np.array([EOT] + enc.encode_ordinary(text), dtype=np.uint16)


def tokenize_bytes(text):
    """The document-start token then the document's UTF-8 bytes. Half of a UTF-16 pair, which JSON
    can escape and UTF-8 cannot hold, becomes U+FFFD, as tiktoken makes it."""
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return np.array([BYTES_DOC] + list(text.encode("utf-8")), dtype=np.uint16)


def decode_bytes(ids):
    """Text from byte-level token ids; a document start becomes a blank line, and a byte sequence
    that is not UTF-8 (a sample can stop inside a character) the replacement character."""
    runs = itertools.groupby(ids, lambda i: i == BYTES_DOC)  # documents, and starts between them
    docs = (bytes(run).decode("utf-8", errors="replace") for start, run in runs if not start)
    return "\n\n".join(docs)


def data_tokenizer(data_dir):
    """'bytes', 'gpt2' or 'characters': the tokenizer of data_dir's shards, from its tokenizer.json;
    without one, lab/arith.py's characters where its task.json is, else GPT-2 BPE."""
    path = os.path.join(data_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return "characters" if os.path.isfile(os.path.join(data_dir, "task.json")) else "gpt2"
    try:
        with open(path, encoding="utf-8") as f:
            tokenizer = json.load(f)["tokenizer"]
    except (ValueError, OSError, LookupError, TypeError):  # cut short, or not an object
        tokenizer = None
    if tokenizer not in ("bytes", "gpt2"):
        raise ValueError(f"{path}: not prepare.py's tokenizer.json")
    return tokenizer


def prepare(documents, out_dir, prefix, args):
    """Tokenize documents in parallel into out_dir's validation and training shards."""
    encode = tokenize_bytes if args.tokenizer == "bytes" else tokenize
    if args.tokenizer == "gpt2":
        gpt2_encoding()  # loaded here, once, before the workers start: they find it cached
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:  # data_tokenizer reads it
        json.dump({"tokenizer": args.tokenizer}, f)
    val = []  # validation documents, written last as shard 0
    buf, fill = np.empty(args.shard_size, dtype=np.uint16), 0  # the training shard being filled
    n_docs = n_val = n_train = n_train_shards = 0
    # imap keeps documents in order, so a run is reproducible; chunks amortize inter-process
    # traffic. The workers ignore Ctrl-C: the main process gets it, and stops them all.
    with Pool(args.workers, signal.signal, (signal.SIGINT, signal.SIG_IGN)) as pool, \
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
        raise ValueError(f"got {n_docs} document(s); need at least 2, since the first goes to "
                         "validation")
    for part in (buf[i:fill][:args.shard_size] for i in range(0, fill, args.shard_size)):
        n_train_shards += 1  # several parts only from one document's tail, split off above
        write_shard(shard_path(out_dir, prefix, "train", n_train_shards), part)
    write_shard(shard_path(out_dir, prefix, "val", 0), np.concatenate(val))
    return n_train_shards + 1, n_docs, n_val, n_train


def count(text):
    """A positive count: '500K', '100M', '2.5B' or a plain integer (else argparse's one line)."""
    scale = {"K": 10**3, "M": 10**6, "B": 10**9}.get(text[-1:].upper(), 1)
    n = float(text[:-1] if scale > 1 else text) * scale
    if not 1 <= n < 2**63:  # nan and inf too
        raise ValueError(text)
    return round(n)


def main(argv=None):  # argv: the command line's words, sys.argv's by default
    parser = argparse.ArgumentParser(
        description="Tokenize text into token shards for train.py (GPT-2 BPE, or bytes).")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--input", nargs="+", metavar="PATH", help=".txt, .jsonl, .jsonl.gz files")
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

    name = "local" if args.input else args.source
    prefix = {"fineweb": "fineweb_edu"}.get(name, name)  # the shards' names
    out_dir = args.out_dir or os.path.join("data", prefix + "_bytes" * (args.tokenizer == "bytes"))
    aside = None
    try:
        if os.path.isdir(out_dir) and os.listdir(out_dir):  # a data set there is kept
            if not os.path.isfile(shard_path(out_dir, prefix, "val", 0)) or \
                    data_tokenizer(out_dir) != args.tokenizer:
                raise ValueError(f"{out_dir} holds other files than {args.tokenizer} shards of "
                                 f"{prefix}: give another --out_dir")
            print(f"{out_dir} already holds a data set: kept (delete it to prepare anew)")
            return
        aside = make_aside(out_dir)
        if args.input:
            documents = local_documents(args.input)
        else:  # a built-in source
            documents = {"pydoc": pydoc_documents, "fineweb": fineweb_documents}[args.source]()
        shards, n_docs, n_val, n_train = prepare(documents, aside, prefix, args)
        os.rename(aside, out_dir)  # over an empty directory, or none
    except ValueError as e:  # bad input: one line, no traceback
        sys.exit(f"prepare.py: error: {e}")
    except OSError as e:  # a full disk, say, or out_dir a file: the OS says which
        where = e.filename2 or e.filename  # None for a network error (fineweb offline)
        sys.exit(f"prepare.py: error: {f'{where}: {e.strerror}' if where else e}")
    finally:
        if aside:
            shutil.rmtree(aside, ignore_errors=True)  # renamed: gone already
    print(f"wrote {shards} shards to {out_dir} ({n_docs:,} documents): val {n_val:,} tokens, "
          f"train {n_train:,} tokens")
    if argv is None:  # run as a command: what to run next (train.py, calling main, runs it now)
        config = "cpu_demo" if args.tokenizer == "bytes" else "pydoc_bpe"
        run_dir = os.path.join("out", os.path.basename(os.path.normpath(out_dir)))  # its own
        print(f"next: python train.py config/{config}.py --data_dir={out_dir} --out_dir={run_dir}")


def make_aside(out_dir):
    """A new directory beside out_dir to write a data set in, with the user's umask (mkdtemp's
    0700 would keep a teacher from a class's data); renamed to out_dir in one step once whole."""
    parent, name = os.path.split(os.path.abspath(out_dir))
    aside = os.path.join(parent, f".{name}.{os.getpid()}")
    os.makedirs(aside)
    return aside


def prepare_if_default(data_dir):
    """train.py's first step on a fresh clone: data/pydoc or data/pydoc_bytes, missing, is made."""
    tokenizer = {"data/pydoc": "gpt2", "data/pydoc_bytes": "bytes"}.get(os.path.normpath(data_dir))
    if tokenizer and not os.path.isdir(data_dir):
        print(f"{data_dir} holds no data set: preparing Python's docs there", flush=True)
        main(["--out_dir", data_dir, "--tokenizer", tokenizer])


if __name__ == "__main__":
    main()
