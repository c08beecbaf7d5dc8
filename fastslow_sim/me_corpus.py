"""The master-equation corpus (DESIGN 3.5): a language whose Bayes floor is computable.

Tokens are the states `0..n-1` of a fast birth-death chain whose generator `Q(y_k)` depends on a
slow variable that changes once per block of `P` tokens. Block `k`'s tokens are a path of the
chain with the exact per-token propagator `K_k = expm(H Q(y_k))` (the multirate map of DESIGN
3.3 with `eps = 1/P`: a token spans slow time `H/P`, so the chain moves by `H/(P eps) = H`), and
after the block the slow law is applied to the block's token histogram (causal block-mean
pooling of sampled fast states):

    y_{k+1} = y_k + H (y_mid + feedback (c . hist_k - 1/2) - y_k),     c_i = i/(n-1).

With the default `feedback = -1` the slow variable is a resource that occupancy depletes
(negative feedback), so `y` keeps moving instead of settling in one well. Nothing but the tokens
drives `y`: `y_k` is a function of the past tokens, and two slow states that saw the same tokens
approach each other by the factor `1 - H` per block, so a window forgets what came before it
within `log(1e-3)/log(1 - H)` blocks (10 at the default `H = 0.5`).

Three reference losses, on the same validation targets (windows of `T + 1` tokens starting at
block boundaries, exactly what the network sees):
- `oracle_loss`: `y` known, `-log K_k[tok_{t-1}, tok_t]`;
- `bayes_floor_loss`: the best predictor from the window's past tokens only, an exact filter
  over the unknown slow state at the window's start (a grid of particles with the prior
  `p(y_0 | first token)` from the training split, each moved by the slow law with the observed
  histograms and weighted by the likelihood of the observed transitions);
- `ignore_y_loss`: a first-order baseline that does not track `y`: one fixed transition matrix
  (a bigram, add-one smoothed) fitted on the training split.
`oracle <= floor <= ignore-y`; the floor is what a model can attain, the oracle is not (the
first blocks of a window cannot know `y`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from .errors import InputError
from .generators import readout_vector
from .validation import as_int, count_text, no_underscore, plain_int

__all__ = ["MECorpusConfig", "largest_rate", "me_corpus", "me_reference_losses", "parse_me_spec"]

# y-table of the propagators: linear interpolation, error < 1e-7 at the tested points of the
# default beta 8; it grows as beta^2 (largest absolute error over 2,000 random y, measured: 1.6e-7
# at beta 8, 1e-6 at 20, 6e-6 at 50, 2e-5 at 100, 1.7e-3 at 1000)
_GRID = 8193
_PARTICLES = 128  # particles for the slow state at a window's start
_BURN_IN_BLOCKS = 64  # dropped, so the corpus starts in the stationary regime
# tokens of one corpus, at most: building it holds about 160 bytes per token at its peak (the
# tokens, their uniforms and log-probabilities, each block's generator for p_st; 1.4 GB at 8M
# tokens, measured) and takes about 12 us per token on a 2-core machine, so this bound is
# about 16 GB and 20 minutes
MAX_TOKENS = 100_000_000
# bytes per n_states^2 that building a corpus holds at its peak, per propagator-table row (its
# `_GRID` rows of n x n float64, about 8 copies of them while `_propagators` works) and per
# block (each block's generator and its p_st work, about 2 copies). Measured peak resident
# memory (numpy, 2 cores): 0.64 GB at n_states=32 and 2.2 GB at 64 (20k tokens: the table),
# 1.2 GB at 16 with 2M tokens (the blocks); n_states=300 was killed at about 24 GB. Time grows
# as n_states^3 (27 s at 32, about 60 s at 64, over 5 minutes at 128), but memory is what a
# machine cannot give: `_check_memory` refuses what would not fit in it
_TABLE_BYTES = 8 * 8
_BLOCK_BYTES = 2 * 8


@dataclass(frozen=True)
class MECorpusConfig:
    """Defaults: `ignore_y - bayes_floor` is about 0.2 nats/token at `T = 256`, and the chain
    mixes within a block (`rate H P` is large), so the next-token distribution late in a block
    is close to `p_st(y_k)`."""

    tokens: int = 1_200_000
    P: int = 8
    n_states: int = 8
    beta: float = 8.0  # up rate rate*exp(beta (y - 1/2)), down rate `rate`
    rate: float = 6.0
    H: float = 0.5  # slow time per block; the chain moves by H per token
    feedback: float = -1.0  # slope of the slow law's target in the block's mean state
    y0: float = 0.5
    seed: int = 0
    context: int = 256  # window length T of the reference losses: the training context

    def __post_init__(self):
        for name in ("tokens", "P", "n_states", "seed", "context"):  # np.int64(8) -> 8
            object.__setattr__(self, name, plain_int(getattr(self, name)))

        def positive_int(name, low=1, why=""):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise InputError(f"the me corpus needs an integer {name} >= {low}{why}; got {v!r}.")

        positive_int("P")
        positive_int("n_states", 2)
        positive_int("context")
        positive_int("seed", 0)
        blocks = max(1, -(-self.context // self.P))  # the context in whole blocks of P tokens
        # two validation windows (a standard error across them), in the last tenth
        val = blocks + -(-(self.context + 1) // self.P)  # `me_corpus`'s split and windows
        positive_int("tokens", 10 * self.P * val,
                     f" (two validation windows of the context {self.context} in its last tenth, "
                     f"{val} blocks of P={self.P})")
        if self.tokens > MAX_TOKENS:
            raise InputError(
                f"the me corpus holds at most {MAX_TOKENS:,} tokens (about 160 bytes of memory "
                f"each while it is built); got tokens={count_text(self.tokens)}."
            )
        self._check_memory()
        for name in ("beta", "rate", "H", "feedback", "y0"):
            if not math.isfinite(float(getattr(self, name))):
                raise InputError(
                    f"the me corpus needs a finite {name}; got {getattr(self, name)!r}."
                )
        if not 0 < self.H <= 1:
            raise InputError(
                f"the me corpus needs 0 < H <= 1 (slow time per block); got H={self.H}."
            )
        if self.rate <= 0:
            raise InputError(f"the me corpus needs a positive chain rate; got rate={self.rate}.")
        lo, hi = _rate_range(self.n_states, self.beta, self.rate)
        if not lo <= 0 < 1 <= hi:
            where = f"for y in [{lo:g}, {hi:g}] only" if lo <= hi else "for no y"
            room = self.n_states * (abs(self.beta) + 1)  # a Python float: inf, no warning
            room = f"{room:g}" if math.isfinite(room) else f"{self.n_states} x {abs(self.beta) + 1:g}"
            most = largest_rate(self.n_states, self.beta)
            expected = (f"rate <= {most!r}, the largest that keeps them finite on all of [0, 1] "
                        f"at beta={self.beta:g}" if most is not None else
                        f"|beta| below {2 * math.log(np.finfo(np.float64).max):.6g}, where "
                        f"exp(|beta|/2) is finite")  # fmt: skip
            raise InputError(
                f"the me corpus's chain rates overflow float64: its up rate rate*exp(beta (y - "
                f"1/2)) and down rate rate, and the sums of n (|beta| + 1) = {room} of them in "
                f"its Jacobian, must be "
                f"finite for every y in [0, 1], and rate={self.rate!r} with beta={self.beta:g} "
                f"keeps them finite {where}; expected {expected}."
            )
        if abs(self.feedback) > 1:
            raise InputError(
                f"the me corpus needs |feedback| <= 1 (so y stays in [0, 1]); got {self.feedback}."
            )
        if not 0 <= self.y0 <= 1:
            raise InputError(f"the me corpus needs y0 in [0, 1]; got y0={self.y0}.")

    def memory_bytes(self, n_states: int | None = None) -> int:
        """Bytes that building the corpus holds at its peak (measured: `_TABLE_BYTES`)."""
        n = self.n_states if n_states is None else n_states
        blocks = self.tokens // self.P + _BURN_IN_BLOCKS
        return n * n * (_TABLE_BYTES * _GRID + _BLOCK_BYTES * blocks)

    def _check_memory(self) -> None:
        """`InputError` where building the corpus would need more than this machine's memory
        (its propagator table and per-block arrays grow as n_states^2)."""
        from .integrators import physical_memory
        from .wording import bytes_text, int_text

        need, have = self.memory_bytes(), physical_memory()
        if need <= have:
            return
        per = self.memory_bytes(1)
        most = math.isqrt(int(have // per)) if math.isfinite(have) else None
        expected = (f"n_states <= {most:,} here (or fewer tokens)" if most and most >= 2
                    else "fewer tokens")  # fmt: skip
        raise InputError(
            f"the me corpus with n_states={int_text(self.n_states)} and "
            f"tokens={count_text(self.tokens)} needs about {bytes_text(need)} of memory while it "
            f"is built (measured: {bytes_text(per)} per n_states^2 for its {_GRID:,}-row "
            f"propagator table and its per-block arrays), more than this machine's "
            f"{bytes_text(have)}; "
            f"expected {expected}."
        )

    def generator(self, rate: float | None = None):
        """The chain's birth-death generator (`rate`: another rate constant than the corpus's,
        e.g. 1 for `Q / rate`)."""
        from .generators import BirthDeath

        rate = self.rate if rate is None else rate
        return BirthDeath(n=self.n_states, up=rate, down=rate, beta=self.beta, y_mid=0.5)

    def readout(self) -> np.ndarray:
        return readout_vector(self.n_states)

    def slow_update(self, y, mean_state):
        """`y_{k+1}` from `y_k` and the block's mean state `c . hist_k` (broadcasts)."""
        return y + self.H * (0.5 + self.feedback * (mean_state - 0.5) - y)

    def memory_blocks(self) -> int:
        """Blocks after which two slow states that saw the same tokens differ by 1e-3 of their
        initial difference."""
        return 1 if self.H == 1 else math.ceil(math.log(1e-3) / math.log(1 - self.H))


def _rate_range(n: int, beta: float, rate: float) -> tuple[float, float]:
    """The `y` where the chain of `n` states at `beta` and `rate` has finite rates and
    Jacobian sums (`BirthDeath.domain`); `(inf, -inf)` where there is none."""
    from .generators import BirthDeath

    try:
        return BirthDeath(n=n, up=rate, down=rate, beta=beta, y_mid=0.5).domain()
    except InputError:  # no y at all
        return math.inf, -math.inf


def largest_rate(n: int, beta: float) -> float | None:
    """The largest `rate` whose chain (`n` states, `beta`) is finite on all of `y in [0, 1]`:
    found with the check itself (`_rate_range`; about `M / (n (|beta| + 1) e^{|beta|/2})`, `M`
    float64's largest number), so that it passes and the next float64 above it does not.
    `None` where no positive rate passes (`e^{|beta|/2}` beyond float64)."""

    def ok(r):
        lo, hi = _rate_range(n, beta, r)
        return lo <= 0 and 1 <= hi

    low, high = math.log(np.finfo(np.float64).smallest_normal), math.log(np.finfo(np.float64).max)
    if not ok(math.exp(low)):
        return None
    for _ in range(200):  # bisection on log(rate)
        mid = 0.5 * (low + high)
        low, high = (mid, high) if ok(math.exp(mid)) else (low, mid)
    r = math.exp(low)
    while ok(math.nextafter(r, math.inf)):
        r = math.nextafter(r, math.inf)
    return r


def parse_me_spec(spec: str, P: int = MECorpusConfig.P, context: int = MECorpusConfig.context,
                  seed: int = MECorpusConfig.seed) -> MECorpusConfig | None:  # fmt: skip
    """`"me"` or `"me:tokens=3M,beta=6,..."` -> a config with the model's `P` and `context` (the
    spec may not set them) and `seed` where the spec sets none; `None` for other corpora. The
    config is validated with these, not the defaults: `tokens=3k` is enough at context 16.
    `block=N` sets the corpus's block length apart from the model's `P` (a control whose
    pooling grid is not the corpus's block grid); windows still start on the corpus's blocks."""
    if spec != "me" and not spec.startswith("me:"):
        return None
    kwargs = {}
    types = {f.name: f.type for f in fields(MECorpusConfig)}
    types["block"] = "int"  # the corpus's P where it is not the model's
    for item in filter(None, spec[3:].split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in types:
            names = sorted(set(types) - {"P", "context"})  # those two are the command's options
            raise InputError(f"corpus option {item!r} is not NAME=VALUE with NAME one of {names}.")
        if key in kwargs:  # `tokens=1M,tokens=2M` had trained on the last one
            raise InputError(f"corpus option {key} is given twice in {spec!r}; expected it once.")
        if key in ("P", "context"):  # one source of truth: the model's own P and context
            block = " (or block=N for a corpus block length other than the model's P)" \
                if key == "P" else ""  # fmt: skip
            raise InputError(f"{key} is set with the command's --{key} option, not in the corpus "
                             f"spec ({spec}); expected --{key} {value.strip() or 'N'}{block}.")  # fmt: skip
        no_underscore(f"corpus option {key}", value)
        try:
            if types[key] in ("int", int):
                from .training import parse_tokens

                # integers as the command's integer options take them: 1e3 too (`as_int`)
                kwargs[key] = parse_tokens(value) if key == "tokens" else as_int(value)
            else:
                kwargs[key] = float(value)
        except OverflowError:  # 1e19 or more with an exponent: never expanded
            raise InputError(f"corpus option {key}={value!r} is 1e19 or more written with an "
                             f"exponent; expected it in digits.") from None  # fmt: skip
        except (ValueError, InputError):
            what = ("a positive count like 500k, 2M or 250000" if key == "tokens"
                    else "an integer" if types[key] in ("int", int) else "a number")  # fmt: skip
            raise InputError(f"corpus option {key}={value!r} is not {what}.") from None
    block = kwargs.pop("block", P)
    if block < 1:  # not "needs an integer P >= 1", which would name the model's option
        raise InputError(f"corpus option block={block} is not a block length; expected an "
                         f"integer >= 1 (tokens per slow step).")  # fmt: skip
    return MECorpusConfig(**{"seed": seed, **kwargs, "P": block, "context": context})


def _propagators(cfg: MECorpusConfig, ys) -> np.ndarray:
    """Per-token propagators `expm(H Q(y))`, `(..., n, n)`, every entry to a small *relative*
    error (about 1e-15 times the number of squarings, tested against mpmath at 60 digits up
    to beta 1000), at any beta and rate the config takes.

    Scaling and squaring without subtractions (the essentially non-negative case of Xue and
    Ye, Numer. Math. 110, 2008): with `t = H rate`, `Q = rate Q_1(y)` and `c` the largest
    exit rate of `Q_1`, `e^{t Q_1} = (e^{-c h} e^{h (Q_1 + c I)})^{2^k}`, `h = t / 2^k <=
    1 / (2 c)`. `Q_1 + c I >= 0`, so its Taylor series adds non-negative terms only, and the
    squarings multiply non-negative matrices: no cancellation anywhere, each entry keeps its
    relative accuracy however small it is. (The symmetrised eigen-decomposition used before,
    `D^{-1} V e^{H L} V^T D`, multiplies round-off by `d_j / d_i` up to `e^{(n - 1) beta /
    4}`: errors of 4e-5 at beta 20 and 0.97 at beta 50, NaN near 1000.) The rate enters only
    through `h`, so nothing overflows (the squarings keep rows stochastic: renormalised after
    each, which is a relative change of round-off size), and the squarings stop once a matrix
    no longer changes (every row `p_st(y)` to 1e-14 relative, a chain that mixes within a
    token): at most about 1,100 of them (`t c` near float64's largest number).
    """
    Q = cfg.generator(rate=1.0).rates(np.asarray(ys, dtype=np.float64))
    n = Q.shape[-1]
    batch = Q.shape[:-2]
    Q = Q.reshape(-1, n, n)
    diag = np.arange(n)
    c = -Q[:, diag, diag].min(axis=-1)  # the largest exit rate of each Q_1 (> 0: irreducible)
    t = cfg.H * cfg.rate
    # k with t c / 2^k <= 1/2, from logarithms (t c may overflow)
    k = np.maximum(np.ceil(math.log2(t) + np.log2(c) + 1.0), 0).astype(np.int64)
    h = np.ldexp(t, -k)
    B = Q * h[:, None, None]
    B[:, diag, diag] += (c * h)[:, None]
    B = np.maximum(B, 0.0)  # Q_1 + c I >= 0: the diagonal's round-off only
    term = np.broadcast_to(np.eye(n), B.shape).copy()
    K = term.copy()
    for m in range(1, 40):  # ||B||_inf <= 2 c h <= 1: 1/m! below 1e-17 relative by m = 20
        term = (term @ B) / m
        K += term
        if not np.any(term > 1e-17 * K):
            break
    K *= np.exp(-c * h)[:, None, None]
    K /= K.sum(axis=-1, keepdims=True)
    todo = np.flatnonzero(k > 0)
    left = k[todo]
    while todo.size:
        A = K[todo]
        A2 = A @ A
        A2 /= A2.sum(axis=-1, keepdims=True)
        K[todo] = A2
        left = left - 1
        settled = np.all(np.abs(A2 - A) <= 1e-14 * A2, axis=(-2, -1))
        keep = (left > 0) & ~settled
        todo, left = todo[keep], left[keep]
    return K.reshape(batch + (n, n))


@functools.lru_cache(maxsize=8)
def _propagator_table(cfg: MECorpusConfig) -> np.ndarray:
    """`expm(H Q(y))` on `_GRID` points of `[0, 1]` (the range of `y`), for interpolation."""
    return _propagators(cfg, np.linspace(0.0, 1.0, _GRID))


def _grid_position(y):
    """Table row `i` and fraction `f` with `y = (i + f) / (_GRID - 1)`, `y` clipped to [0, 1]."""
    s = np.clip(y, 0.0, 1.0) * (_GRID - 1)
    i = np.minimum(s.astype(np.int64), _GRID - 2)
    return i, s - i


def _interp_entry(table, y, prev, cur):
    """`K(y)[prev, cur]` by linear interpolation in `y`; `y (W, G)`, `prev, cur (W,)`."""
    i, f = _grid_position(y)
    a = table[i, prev[:, None], cur[:, None]]
    b = table[i + 1, prev[:, None], cur[:, None]]
    return np.maximum((1 - f) * a + f * b, 1e-300)


def _generate(cfg: MECorpusConfig, progress: bool = False):
    """Tokens `(N,)`, per-block `y` `(N/P,)` and per-token `log K_k[prev, tok]` `(N,)`.

    `K_k` is the tabulated propagator interpolated at `y_k` (within 1e-7 of `expm(H Q(y_k))`
    at the default beta; `_GRID`):
    the corpus is generated, and the oracle and the filter are scored, with the same `K`.
    `progress`: a bar over the blocks on a terminal (stderr), as training's.
    """
    from bisect import bisect_right
    from itertools import accumulate

    n, P = cfg.n_states, cfg.P
    c = cfg.readout()
    table = _propagator_table(cfg)
    nb = cfg.tokens // P + _BURN_IN_BLOCKS
    rng = np.random.default_rng(cfg.seed)
    u = rng.uniform(size=(nb, P)).tolist()
    toks = [0] * (nb * P)
    Kp = [0.0] * (nb * P)  # K_k[prev, tok] of every token, logged at the end
    ys = [0.0] * nb
    means = {}  # c . hist of each histogram met, by numpy's arithmetic (the same bits as before)
    y, tok = cfg.y0, n // 2
    t = 0
    # Per block, only the rows of K_k that its tokens leave from are built (one at P = 1), by
    # the arithmetic the whole matrix had: K = table[i] + f (table[i+1] - table[i]), cumulated
    # left to right, divided by the last entry. Building all n rows and the block's mean with
    # numpy calls of fixed overhead took about 75 us a block: over a minute for the default
    # corpus at P = 1 (1.2M blocks). The corpus is the same to the bit.
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=nb, desc=f"building {_spec_name(cfg)} (P = {P})", unit="block",
                   unit_scale=True, disable=None, leave=False)  # fmt: skip
    for k in range(nb):
        if bar is not None and k % 4096 == 4095:
            bar.update(4096)
        ys[k] = y
        s = y * (_GRID - 1)
        i = min(int(s), _GRID - 2)
        f = s - i
        built = {}
        hist = [0] * n
        uk = u[k]
        for j in range(P):
            row = built.get(tok)
            if row is None:
                lo, hi = table[i, tok].tolist(), table[i + 1, tok].tolist()
                K = [a + f * (b - a) for a, b in zip(lo, hi)]
                cdf = list(accumulate(K))
                last = cdf[-1]
                row = built[tok] = (K, [v / last for v in cdf])
            nxt = min(bisect_right(row[1], uk[j]), n - 1)
            Kp[t] = row[0][nxt]
            toks[t] = tok = nxt
            t += 1
            hist[nxt] += 1
        key = tuple(hist)
        mean = means.get(key)
        if mean is None:
            mean = float(c @ np.array(hist, dtype=np.int64)) / P
            if len(means) < 100_000:  # (a bound for long blocks, whose histograms rarely recur)
                means[key] = mean
        y = cfg.slow_update(y, mean)
    if bar is not None:
        bar.update(nb % 4096)
        bar.close()
    toks = np.array(toks, dtype=np.int64).reshape(nb, P)
    ys = np.array(ys)
    logp = np.log(np.maximum(np.array(Kp), 1e-300)).reshape(nb, P)
    b = _BURN_IN_BLOCKS
    return toks[b:].reshape(-1), ys[b:], logp[b:].reshape(-1)


def me_corpus(config: MECorpusConfig | None = None, progress: bool = False):
    """The master-equation corpus (module docstring): split on a block boundary (about 90/10),
    with every block's `y_k` and `p_st(y_k)` and the three reference losses at `config.context`;
    `progress`: a bar over its blocks on a terminal."""
    from .corpora import Corpus
    from .stationary import stationary_distribution

    cfg = config or MECorpusConfig()
    toks, ys, logp = _generate(cfg, progress)
    P, n = cfg.P, cfg.n_states
    n_blocks = len(ys)
    val_blocks = max(n_blocks // 10, -(-(cfg.context + 1) // P) + 1)
    n_train = (n_blocks - val_blocks) * P
    p_st = stationary_distribution(cfg.generator().rates(ys))
    corpus = Corpus(
        _spec_name(cfg),
        n,
        toks[:n_train],
        toks[n_train:],
        {},
        {"y": ys, "p_st": p_st, "log_oracle": logp},
        block_len=P,
    )
    corpus.stats = {
        "P": P,
        **me_reference_losses(corpus, cfg, cfg.context),
        "uniform_loss": math.log(n),
        "y_mean": float(ys.mean()),
        "y_std": float(ys.std()),
        "y_p05": float(np.percentile(ys, 5)),
        "y_p95": float(np.percentile(ys, 95)),
        "y_memory_blocks": cfg.memory_blocks(),
        "config": asdict(cfg),
    }
    if cfg.tokens % P:  # the chain moves y once per block: only whole blocks are generated
        corpus.stats["note"] = (
            f"tokens={cfg.tokens:,} is not a whole number of blocks of P = {P}: the corpus "
            f"holds {cfg.tokens // P:,} blocks, {cfg.tokens // P * P:,} tokens"
        )
    return corpus


def _spec_name(cfg: MECorpusConfig) -> str:
    """The spec that makes `cfg` at its `P` and context (which are not spec options: they are
    set with --P and --context)."""
    default = MECorpusConfig()
    diff = [f"{k}={v}" for k, v in asdict(cfg).items()
            if k not in ("P", "context") and getattr(default, k) != v]  # fmt: skip
    return "me:" + ",".join(diff) if diff else "me"


def me_reference_losses(corpus, cfg: MECorpusConfig, T: int, split: str = "val",
                        per_window: bool = False) -> dict:  # fmt: skip
    """Oracle, Bayes floor and ignore-y losses (nats/token) on the aligned windows of `split`.

    With `per_window`, also the `(W, T)` per-target losses of each predictor (for tests).
    """
    n = cfg.n_states
    win, starts = corpus.windows(split, T)  # (W, T+1), global starts (W,)
    if len(starts) == 0:
        raise InputError(f"the {split} split holds no window of {T + 1} tokens.")
    prev, cur = win[:, :-1], win[:, 1:]
    gl = starts[:, None] + np.arange(1, T + 1)  # global index of every target
    oracle = -corpus.blocks["log_oracle"][gl]
    train = np.asarray(corpus.train, dtype=np.int64)
    counts = np.ones((n, n))
    np.add.at(counts, (train[:-1], train[1:]), 1.0)
    fixed = counts / counts.sum(1, keepdims=True)
    ignore = -np.log(fixed[prev, cur])
    floor = bayes_filter(win, cfg, _start_prior(corpus, cfg))["loss"]
    out = {
        "oracle_loss": float(oracle.mean()),
        "bayes_floor_loss": float(floor.mean()),
        "ignore_y_loss": float(ignore.mean()),
        "loss_gap": float(ignore.mean() - floor.mean()),
        "reference_context": T,
        "reference_windows": int(len(starts)),
        "reference_split": split,
    }
    if per_window:
        out["per_target"] = {"oracle": oracle, "bayes_floor": floor, "ignore_y": ignore}
    return out


def _start_prior(corpus, cfg: MECorpusConfig) -> np.ndarray:
    """`p(y bin, first token of the block)` `(G, n)` from the training split's blocks."""
    P = cfg.P
    train = np.asarray(corpus.train)
    nb = len(train) // P
    ys = corpus.blocks["y"][:nb]
    first = train[: nb * P : P]
    bins = np.minimum((np.clip(ys, 0, 1) * _PARTICLES).astype(np.int64), _PARTICLES - 1)
    counts = np.zeros((_PARTICLES, cfg.n_states))
    np.add.at(counts, (bins, first), 1.0)
    counts += 1e-3  # keep every particle alive: a zero prior could never recover
    return counts / counts.sum()


def bayes_filter(win: np.ndarray, cfg: MECorpusConfig, prior: np.ndarray,
                 predictive: bool = False) -> dict:  # fmt: skip
    """The exact filter over the slow state from a window's tokens `win (W, T+1)`.

    Particles start at the bin centres of `prior (G, n)` with weights `prior[:, first token]`;
    all of them are moved by the slow law with the window's observed block histograms (the law
    is deterministic given the tokens) and weighted by the interpolated `K(y)[prev, cur]`.
    Returns `loss (W, T)` (`-log p(tok_t | tokens before t)`), and with `predictive` also the
    next-token distributions `next (W, T, n)` (row `t-1` predicts token `t`) and the posterior
    mean of `p_st(y_b)` at the start of every block `pst (W, B, n)`.
    """
    from .stationary import stationary_distribution

    P, n = cfg.P, cfg.n_states
    c = cfg.readout()
    table = _propagator_table(cfg)
    W, T = win.shape[0], win.shape[1] - 1
    G = prior.shape[0]
    grid = (np.arange(G) + 0.5) / G
    y = np.broadcast_to(grid, (W, G)).copy()
    logw = np.log(prior[:, win[:, 0]].T)  # (W, G)
    logw -= _logsumexp(logw)
    out = {"loss": np.empty((W, T))}
    if predictive:
        out["next"] = np.empty((W, T, n))
        out["pst"] = np.empty((W, -(-T // P), n))

    def block_pst(b):  # posterior mean of p_st(y_b) given the tokens before block b
        if predictive and b < out["pst"].shape[1]:
            pst = stationary_distribution(cfg.generator().rates(y.reshape(-1))).reshape(W, G, n)
            out["pst"][:, b] = np.einsum("wg,wgn->wn", np.exp(logw), pst)

    block_pst(0)
    for j in range(1, T + 1):
        if j % P == 0:  # block j/P starts: move every particle by the slow law
            hist = (win[:, j - P : j, None] == np.arange(n)).mean(axis=1)  # (W, n)
            y = cfg.slow_update(y, (hist @ c)[:, None])
            block_pst(j // P)
        if predictive:
            i, f = _grid_position(y)
            f = f[..., None]
            prev = win[:, j - 1][:, None]
            rows = (1 - f) * table[i, prev] + f * table[i + 1, prev]  # (W, G, n)
            out["next"][:, j - 1] = np.einsum("wg,wgn->wn", np.exp(logw), rows)
        lik = _interp_entry(table, y, win[:, j - 1], win[:, j])  # (W, G)
        log_joint = logw + np.log(lik)
        norm = _logsumexp(log_joint)
        out["loss"][:, j - 1] = -norm[:, 0]
        logw = log_joint - norm
    return out


def _logsumexp(a):
    m = a.max(axis=1, keepdims=True)
    return m + np.log(np.exp(a - m).sum(axis=1, keepdims=True))
