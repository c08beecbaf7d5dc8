"""Token corpora for the network: real text, the master-equation corpus, and random tokens.

- `text:PATH`: any file as byte-level tokens (`V = 256`), memory-mapped, contiguous split
  (first 90% train, last 10% validation). Bytes that are not UTF-8 are fine: every byte is a token.
- `me`: the master-equation corpus of DESIGN 3.5 (`fastslow_sim.me_corpus`): tokens are the
  states of a fast chain whose generator depends on a slow variable driven by the past tokens'
  block histograms; its oracle, Bayes-floor and ignore-y losses are computed exactly. Its
  windows start at block boundaries (`Corpus.block_len`), in training and in evaluation.
- `random`: uniform tokens (`V = 256`): the leak detector, whose floor is `ln V`.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError
from .wording import plural

__all__ = [
    "Corpus",
    "load_corpus",
    "text_corpus",
    "random_corpus",
    "corpus_fingerprint",
    "same_text_corpus",
]

VAL_FRACTION = 0.1


@dataclass
class Corpus:
    """Token ids split into train and validation, with the corpus's own statistics."""

    name: str
    vocab_size: int
    train: np.ndarray  # 1-D integer array (may be a memmap)
    val: np.ndarray
    stats: dict = field(default_factory=dict)
    blocks: dict | None = None  # me corpus: per-block y_k, p_st(y_k), per-token oracle log-prob
    block_len: int | None = None  # me corpus: windows start at multiples of this (its P)

    @property
    def tokens(self) -> int:
        return int(len(self.train) + len(self.val))

    def check_fits(self, block_size: int, batch_size: int) -> None:
        """Raise `InputError` unless both splits hold at least one sequence of `block_size + 1`."""
        need = block_size + 1
        for split, data in (("training", self.train), ("validation", self.val)):
            if len(data) < need:
                raise InputError(
                    f"the {split} split of corpus {self.name!r} has {plural(len(data), 'token')}, "
                    f"fewer than one sequence of {need}; expected a longer corpus or a shorter context."
                )

    def window_starts(self, split: str, T: int) -> np.ndarray:
        """Starts of the non-overlapping evaluation windows of `T + 1` tokens in `split`, at
        multiples of `block_len` (consecutive windows share one token: each target once)."""
        data = self.val if split == "val" else self.train
        align = self.block_len or 1
        stride = -(-T // align) * align
        return np.arange(0, len(data) - T, stride, dtype=np.int64)

    def windows(self, split: str, T: int, limit: int | None = None) -> tuple:
        """`(tokens (W, T+1) int64, global start of each window (W,))` of those windows."""
        data = np.asarray(self.val if split == "val" else self.train, dtype=np.int64)
        starts = self.window_starts(split, T)[:limit]
        offset = len(self.train) if split == "val" else 0
        return data[starts[:, None] + np.arange(T + 1)], offset + starts

    def summary(self) -> dict:
        return {"corpus": self.name, "vocab_size": self.vocab_size, "tokens": self.tokens,
                "train_tokens": int(len(self.train)), "val_tokens": int(len(self.val)), **self.stats}  # fmt: skip


def _split(tokens):
    n_val = max(int(len(tokens) * VAL_FRACTION), 1)
    return tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]


def text_corpus(path) -> Corpus:
    """Byte-level tokens of the file at `path`, memory-mapped."""
    if str(path) == "":  # Path("") is ".", a folder
        raise InputError("the corpus path after 'text:' is empty; expected text:PATH, a file.")
    p = Path(path)
    if not p.exists():
        raise InputError(f"corpus file {str(p)!r} does not exist.")
    if not p.is_file():
        raise InputError(f"corpus path {str(p)!r} is not a file.")
    size = p.stat().st_size
    if size == 0:
        raise InputError(f"corpus file {str(p)!r} is empty.")
    data = np.memmap(p, dtype=np.uint8, mode="r")
    utf8 = True
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(p, "rb") as f:  # check and hash the text in chunks, without holding it all
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            if utf8:
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError:
                    utf8 = False
    if utf8:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            utf8 = False
    train, val = _split(data)
    # sha256: the contents a run was made on (`corpus_fingerprint`), read each time it is loaded
    stats = {"bytes": int(size), "utf8": utf8, "path": str(p), "sha256": digest.hexdigest()}
    if not utf8:
        stats["note"] = (
            "the file is not valid UTF-8; byte-level tokens accept any bytes, so it is used as is"
        )
    return Corpus(f"text:{p}", 256, train, val, stats)


def random_corpus(tokens: int = 1_000_000, vocab_size: int = 256, seed: int = 0) -> Corpus:
    """Uniform random tokens: any model that beats `ln V` on them is leaking the future."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, vocab_size, tokens, dtype=np.int64).astype(
        np.uint8 if vocab_size <= 256 else np.int64
    )
    train, val = _split(data)
    return Corpus(
        "random", vocab_size, train, val, {"floor_loss": math.log(vocab_size), "seed": seed}
    )


def corpus_fingerprint(spec: str) -> str | None:
    """The sha256 of a `text:PATH` corpus's bytes, read now (never cached: a run made on other
    contents must not pass for this one), or None: for `me` and `random`, which their spec
    determines, and for a file that cannot be read (loading it says why)."""
    if not isinstance(spec, str) or not spec.startswith("text:"):
        return None
    digest = hashlib.sha256()
    try:
        with open(spec[5:], "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def same_text_corpus(held_spec, held_sha256, spec, sha256: str | None = None) -> bool:
    """Whether a run recorded as made on the corpus `held_spec`, whose contents had the sha256
    `held_sha256`, was made on the `text:` corpus `spec`, however each spells its path
    (`text:corpus.txt`, `text:./corpus.txt`, the absolute path, a copy of the file): both are
    `text:` specs and `held_sha256` is the sha256 of the contents `spec`'s file has now
    (`sha256` where already read, else read now). False where the run recorded none (one made
    before fastslow-sim recorded it: the spelling is then all that is known of its file)."""
    if not all(isinstance(s, str) and s.startswith("text:") for s in (held_spec, spec)):
        return False
    if not held_sha256:
        return False
    return held_sha256 == (sha256 if sha256 is not None else corpus_fingerprint(spec))


_ME_CACHE: dict = {}  # config -> Corpus, the 4 most recently used


def _cached_me_corpus(config, progress: bool = False) -> Corpus:
    """An me corpus is deterministic in its config: build it once per process, whether or not
    a bar was asked for (`progress` shows one only while it is built)."""
    from .me_corpus import me_corpus

    corpus = _ME_CACHE.pop(config, None)
    if corpus is None:
        corpus = me_corpus(config, progress)
    _ME_CACHE[config] = corpus  # most recent last
    while len(_ME_CACHE) > 4:
        del _ME_CACHE[next(iter(_ME_CACHE))]
    return corpus


def load_corpus(spec: str, P: int = 8, seed: int = 0, context: int = 256,
                progress: bool = False) -> Corpus:  # fmt: skip
    """`"me"` (or `"me:tokens=3M,beta=6,seed=1,..."`), `"random"` or `"text:PATH"`. The corpus
    seed (`seed=` in the spec, else `seed`) is separate from a training seed: every run on `"me"`
    with the same `P` sees the same corpus; `P` is the model's, and `context` is the window
    length of the me corpus's reference losses; `progress`: a bar while an me corpus is built
    (on a terminal)."""
    from .me_corpus import parse_me_spec

    me = parse_me_spec(spec, P=P, context=context, seed=seed)
    if me is not None:
        corpus = _cached_me_corpus(me, progress)
        if me.P != P:  # `block=N`: the name says so, as P is otherwise the model's
            name = corpus.name + ("," if ":" in corpus.name else ":") + f"block={me.P}"
            corpus = dataclasses.replace(corpus, name=name)
        return corpus
    if spec == "random":
        return random_corpus(seed=seed)
    if spec.startswith("text:"):
        return text_corpus(spec[5:])
    raise InputError(
        f"unknown corpus {spec!r}; expected 'me', 'me:NAME=VALUE,...', 'random' or 'text:PATH'."
    )
