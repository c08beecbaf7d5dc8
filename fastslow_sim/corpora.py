"""Token corpora for the network: real text, the master-equation corpus, and random tokens.

- `text:PATH`: any file as byte-level tokens (`V = 256`), memory-mapped, contiguous split
  (first 90% train, last 10% validation). Bytes that are not UTF-8 are fine: every byte is a token.
- `me`: the master-equation corpus of DESIGN 3.5. Tokens are the states of a fast chain; within
  block `k` (`P` tokens) each token follows the previous one with the exact per-token propagator
  `K_k = expm(H Q(y_k))` (the multirate map of DESIGN 3.3 with `eps = 1/P`: a token spans slow
  time `H/P`, the fast chain moves by `H/(P eps) = H`), and after the block
  `y_{k+1} = y_k + H (c . hist_k - y_k) + sigma sqrt(H) xi_k + H A sin(2 pi k / period)`,
  `hist_k` the block's token histogram (causal block-mean pooling), `xi_k` standard normal.
  Saved with every block's `y_k` and `p_st(y_k)`. Two reference losses: the oracle with `y`
  known (`-log K_k[tok_{t-1}, tok_t]`, a floor no model can beat; with `sigma > 0`, `y` is not
  a function of past tokens, so it is a strict floor), and the best predictor that ignores `y`
  (one fixed transition matrix, fitted on the training split, scored on validation).
- `random`: uniform tokens (`V = 256`): the leak detector, whose floor is `ln V`.
"""

from __future__ import annotations

import codecs
import functools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError

__all__ = ["Corpus", "MECorpusConfig", "load_corpus", "me_corpus", "text_corpus", "random_corpus"]

VAL_FRACTION = 0.1


@dataclass
class Corpus:
    """Token ids split into train and validation, with the corpus's own statistics."""

    name: str
    vocab_size: int
    train: np.ndarray  # 1-D integer array (may be a memmap)
    val: np.ndarray
    stats: dict = field(default_factory=dict)
    blocks: dict | None = None  # me corpus: per-block y_k and p_st(y_k)

    @property
    def tokens(self) -> int:
        return int(len(self.train) + len(self.val))

    def check_fits(self, block_size: int, batch_size: int) -> None:
        """Raise `InputError` unless both splits hold at least one sequence of `block_size + 1`."""
        need = block_size + 1
        for split, data in (("training", self.train), ("validation", self.val)):
            if len(data) < need:
                raise InputError(
                    f"the {split} split of corpus {self.name!r} has {len(data)} tokens, fewer than "
                    f"one sequence of {need}; expected a longer corpus or a shorter context."
                )

    def summary(self) -> dict:
        return {"corpus": self.name, "vocab_size": self.vocab_size, "tokens": self.tokens,
                "train_tokens": int(len(self.train)), "val_tokens": int(len(self.val)), **self.stats}  # fmt: skip


def _split(tokens):
    n_val = max(int(len(tokens) * VAL_FRACTION), 1)
    return tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]


def text_corpus(path) -> Corpus:
    """Byte-level tokens of the file at `path`, memory-mapped."""
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
    with open(p, "rb") as f:  # check the text in chunks, without holding it all
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            while chunk := f.read(1 << 20):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            utf8 = False
    train, val = _split(data)
    stats = {"bytes": int(size), "utf8": utf8, "path": str(p)}
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


@dataclass
class MECorpusConfig:
    """Defaults make `y` wander over a range where `p_st(y)` changes a lot (oracle and
    ignore-y losses differ by about 0.09 nats per token)."""

    tokens: int = 600_000
    P: int = 8
    n_states: int = 8
    beta: float = 4.0  # birth-death up rate exp(beta (y - 1/2)), down rate 1
    H: float = 0.5  # slow time per block
    sigma: float = 0.5  # exogenous noise on y
    forcing: float = 0.0  # amplitude A of a periodic forcing
    period: float = 200.0  # in blocks
    y0: float = 0.5
    seed: int = 0


def me_corpus(config: MECorpusConfig | None = None) -> Corpus:
    """The master-equation corpus (module docstring); tokens are states `0..n-1`."""
    from scipy.linalg import expm

    from .generators import BirthDeath
    from .stationary import stationary_distribution

    cfg = config or MECorpusConfig()
    if cfg.tokens < 2 * cfg.P:
        raise InputError(f"the me corpus needs at least {2 * cfg.P} tokens; got {cfg.tokens}.")
    gen = BirthDeath(n=cfg.n_states, beta=cfg.beta)
    n, P = gen.n_states, cfg.P
    c = np.arange(n) / (n - 1)
    nblocks = cfg.tokens // P
    rng = np.random.default_rng(cfg.seed)
    u = rng.uniform(size=nblocks * P)
    xi = rng.normal(size=nblocks)
    toks = np.empty(nblocks * P, dtype=np.int64)
    ys = np.empty(nblocks)
    logp = np.empty(nblocks * P)
    y, tok = cfg.y0, 0
    for k in range(nblocks):
        ys[k] = y
        K = expm(cfg.H * gen.rates(y))  # exact per-token propagator, y frozen over the block
        cdf = np.cumsum(K, axis=1)
        for j in range(P):
            t = k * P + j
            nxt = min(int(np.searchsorted(cdf[tok], u[t] * cdf[tok, -1])), n - 1)
            logp[t] = math.log(K[tok, nxt])
            tok = toks[t] = nxt
        hist = np.bincount(toks[k * P : (k + 1) * P], minlength=n) / P
        y = (y + cfg.H * (c @ hist - y) + cfg.sigma * math.sqrt(cfg.H) * xi[k]
             + cfg.H * cfg.forcing * math.sin(2 * math.pi * k / cfg.period))  # fmt: skip
    p_st = stationary_distribution(gen.rates(ys))
    train, val = _split(toks)
    n_train = len(train)
    # ignore-y: one fixed transition matrix, maximum likelihood on train (add-one), scored on val
    counts = np.ones((n, n))
    np.add.at(counts, (train[:-1], train[1:]), 1.0)
    fixed = counts / counts.sum(1, keepdims=True)
    ignore_y = float(-np.mean(np.log(fixed[val[:-1], val[1:]])))
    oracle = float(-np.mean(logp[n_train + 1 :]))  # the same validation transitions
    stats = {
        "P": P,
        "oracle_loss": oracle,
        "ignore_y_loss": ignore_y,
        "loss_gap": ignore_y - oracle,
        "uniform_loss": math.log(n),
        "y_mean": float(ys.mean()),
        "y_p05": float(np.percentile(ys, 5)),
        "y_p95": float(np.percentile(ys, 95)),
        "config": asdict(cfg),
    }
    blocks = {"y": ys, "p_st": p_st}
    return Corpus("me", n, train, val, stats, blocks)


@functools.lru_cache(maxsize=4)
def _cached_me_corpus(P: int, seed: int) -> Corpus:
    """The default me corpus is deterministic: build it once per process (about 10 s)."""
    return me_corpus(MECorpusConfig(P=P, seed=seed))


def load_corpus(spec: str, P: int = 8, seed: int = 0) -> Corpus:
    """`"me"`, `"random"` or `"text:PATH"`. The corpus seed is separate from a training seed:
    every training run on `"me"` with the same `P` sees the same corpus."""
    if spec == "me":
        return _cached_me_corpus(P, seed)
    if spec == "random":
        return random_corpus(seed=seed)
    if spec.startswith("text:"):
        return text_corpus(spec[5:])
    raise InputError(f"unknown corpus {spec!r}; expected 'me', 'random' or 'text:PATH'.")
