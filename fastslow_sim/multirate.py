"""The discrete multirate map that the network instantiates (DESIGN 3.3).

Tokens `t = 0, 1, ...`, blocks of `P` tokens, block `k` spanning slow time `[kH, (k+1)H)`:

    x_{t+1} = expm(tau Q(y_k)^T) x_t,     tau = H / (P eps)       (every token, exact)
    y_{k+1} = y_k + H g(mean_k x, y_k)                              (once per block)

where `mean_k x` is the mean of the `P` token states of block `k` (causal block-mean pooling).
The fast propagation is exact with `y` frozen over the block, so the map's error at fixed `H`
does not grow as `eps -> 0`, and its cost per unit slow time (`P/H` tokens, one matrix
exponential per block) does not depend on `eps`. As `H -> 0` it converges to the ODE at first
order in `H` (the slow update is an Euler step with a block-averaged fast state).

`P` defaults to the system's own `P = 1/eps` (then `tau = H`: the fast chain moves by `H` per
token). Probability is conserved to round-off at every `eps`: the one-token propagator is a
stochastic matrix (its columns are renormalised to sum to one, negative round-off clipped) and
every token state is renormalised, so `|1^T x - 1|` stays at a few ulps however many tokens run.
Long blocks (`P` up to 1e12 at `eps = 1e-12`) are not walked token by token: the block's end
state `E^P x` and its mean `(1/P) sum_{j=1..P} E^j x` come from `log2 P` doublings of `(E^m,
sum_{j<=m} E^j)`, and only the block ends are kept.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import expm

from .errors import InputError
from .generators import domain_text, into_domain
from .validation import positive, positive_int
from .wording import plural

__all__ = ["multirate_map", "block_tokens", "MapLeftDomainError", "MAX_TOKENS", "MAX_P"]

MAX_P = 2**63 - 1  # tokens per block: a 64-bit integer in the dataset (`P`, `tokens_per_block`)
MAX_TOKENS = 1_000_000  # per-token states are kept up to this many tokens
_ULP = float(np.finfo(np.float64).eps)
_WALK = 64  # blocks of at most this many tokens are walked token by token


class MapLeftDomainError(InputError):
    """The map's slow step took `y` out of the generator's domain (or to rates that are not
    finite) at the end of block `block`: the sentence, the `reason` clause of it for a status
    message, and the valid rows `x_blocks`, `y_blocks` before it (`integrate` keeps those and
    leaves the rest NaN)."""

    def __init__(self, message, reason, block, x_blocks, y_blocks, P):
        super().__init__(message)
        self.reason, self.block, self.P = reason, block, P
        self.x_blocks, self.y_blocks = x_blocks, y_blocks


def _stochastic(E):
    """`E` with negative round-off clipped and every column summing to one."""
    E = np.maximum(E, 0.0)
    return E / E.sum(axis=0, keepdims=True)


def _propagator(Q, tau):
    """`expm(tau Q^T)` as a stochastic matrix, for any `tau >= 0`. Where `tau |Q|` is large
    (`tau = H / (P eps)` reaches 1e300 at `eps = 1e-300`, `P = 1`, and `expm`'s scaling and
    squaring overflows), `expm((tau / 2^k) Q^T)` is squared `k` times, each square renormalised:
    the scaling by `2^k` is exact, and the powers converge to `p_st 1^T`."""
    norm = float(np.max(np.abs(np.diagonal(Q)))) * tau
    k = max(0, math.ceil(math.log2(norm / 1e3))) if norm > 1e3 else 0
    E = _stochastic(expm(math.ldexp(tau, -k) * Q.T))
    for _ in range(k):
        F = _stochastic(E @ E)
        if np.array_equal(F, E):  # converged: E is p_st 1^T to round-off
            break
        E = F
    return E


def _normalised(x):
    return x / x.sum()


def _block_by_doubling(E, P, x):
    """`(E^P x, (1/P) sum_{j=1..P} E^j x)` with `O(log P)` matrix products."""
    n = E.shape[0]
    # binary powering over P: (F, S) = (E^m, sum_{j=1..m} E^j) for the bits read so far
    F, S = np.eye(n), np.zeros((n, n))
    Ep, Sp = E, E.copy()  # (E^(2^i), sum_{j=1..2^i} E^j)
    m = P
    while m:
        if m & 1:  # 2^i more tokens after the m so far: S += E^m Sp, F = E^(m + 2^i)
            S = S + F @ Sp
            F = _stochastic(F @ Ep)
        m >>= 1
        if m:
            Sp = Sp + Ep @ Sp
            Ep = _stochastic(Ep @ Ep)
    # S / P is an average of stochastic matrices: stochastic too
    return _normalised(F @ x), _normalised(_stochastic(S / P) @ x)


def block_tokens(eps: float, P=None) -> int:
    """The map's tokens per block: `P`, or the `P = 1/eps` of `eps` (within round-off,
    `systems.resolve_eps`), or `InputError` unless it is an integer from 1 to `MAX_P`, the
    largest a 64-bit integer holds (a dataset stores `P` as one: `P = 1e20` at `eps = 1e-20`
    ran, then failed writing the dataset)."""
    from .systems import resolve_eps

    if P is None:
        P = resolve_eps(eps=eps)[1]
        if P is None:
            raise InputError(
                f"the multirate map takes P = 1/eps tokens per block, but 1/eps = "
                f"{1 / eps:.6g} (eps = {eps:g}) is not an integer; pass P explicitly."
            )
    if isinstance(P, (int, np.integer)) and not isinstance(P, bool) and P > MAX_P:
        raise InputError(
            f"P = {float(P):.3g} tokens per block (eps = {eps:g}) is more than 2**63 - 1 = "
            f"{MAX_P}, the largest token count a 64-bit integer holds; expected eps > 2**-63 = "
            f"{2.0**-63:.17g} (P < 2**63)."
        )
    return positive_int("P (tokens per block)", P)


def multirate_map(system, H: float, n_blocks: int, P: int | None = None, x0=None, y0=None,
                  *, tokens: bool | None = None) -> dict:  # fmt: skip
    """Run the map for `n_blocks` blocks of `P` tokens (default: the system's `P = 1/eps`).

    Returns `{"x_blocks": (n_blocks + 1, n)` (the fast state at each block end),
    `"y_blocks": (n_blocks + 1, m)`, `"t_blocks": (n_blocks + 1,)`, `"block_mean": (n_blocks, n)`,
    `"P": P}` and, when per-token states are kept, `"x_tokens": (n_blocks*P + 1, n)` and
    `"t_tokens": (n_blocks*P + 1,)`. `tokens=None` keeps them up to `MAX_TOKENS` tokens,
    `True` requires them (an `InputError` beyond), `False` never keeps them. `x0` and `y0`
    (default: the system's) are checked as `integrate` checks them: `x0` a probability vector
    of the system's size, `y0` finite and inside the generator's domain. A slow step that
    leaves the domain, `y_{k+1} = y_k + H g(mean_k x, y_k)` outside `generator.domain()` (where
    `Q(y)` has a negative rate or one beyond float64, and `expm` no stochastic matrix), stops
    the map with `MapLeftDomainError` (an `InputError` naming the block and the `y`).
    """
    if not hasattr(system, "generator"):
        raise InputError(f"the multirate map needs a master-equation system; got {system.name!r}.")
    H = positive("H (slow time per block)", H)
    n_blocks = positive_int("n_blocks", n_blocks)
    P = block_tokens(system.eps, P)
    n_tok = n_blocks * P
    if tokens and n_tok > MAX_TOKENS:
        raise InputError(
            f"{plural(n_blocks, 'block')} of P = {plural(P, 'token')} are {n_tok:.3g} tokens, "
            f"more than the {MAX_TOKENS:,} whose states can be kept; expected fewer (or tokens=False)."
        )
    keep = n_tok <= MAX_TOKENS if tokens is None else bool(tokens)
    walk = keep or P <= _WALK
    from .integrators import _initial_state  # integrate's check of x0 and y0, shared

    n, m = system.n_fast, system.n_slow
    x, y = _initial_state(system, system.x0 if x0 is None else x0,
                          system.y0 if y0 is None else y0)  # fmt: skip
    tau = H / (P * system.eps)
    x_blocks = np.empty((n_blocks + 1, n))
    y_blocks = np.empty((n_blocks + 1, m))
    means = np.empty((n_blocks, n))
    x_tokens = np.empty((n_tok + 1, n)) if keep else None
    x_blocks[0], y_blocks[0] = x, y
    if keep:
        x_tokens[0] = x
    lo, hi = system.generator.domain()
    for k in range(n_blocks):
        Q = system.generator.rates(y)
        if not np.all(np.isfinite(Q)):
            reason = f"the generator's rates at y = {y.tolist()} (block {k}) are not finite"
            raise MapLeftDomainError(
                f"{reason}; expected a slow variable inside the range where they are defined.",
                reason, k, x_blocks[:k].copy(), y_blocks[:k].copy(), P,
            )  # fmt: skip
        E = _propagator(Q, tau)  # exact one-token propagator, y frozen
        if walk:
            block = np.empty((P, n))
            for j in range(P):
                x = _normalised(E @ x)
                block[j] = x
            if keep:
                x_tokens[k * P + 1 : (k + 1) * P + 1] = block
            means[k] = _normalised(block.mean(axis=0))
        else:
            x, means[k] = _block_by_doubling(E, P, x)
        x_blocks[k + 1] = x
        step = H * system.g(means[k][None], y[None])[0]
        # within the step's round-off of an end is at the end (integrate's `into_domain`)
        y_next = into_domain(system.generator, y + step, 4 * _ULP * (np.abs(y) + np.abs(step)))
        if not (np.all(np.isfinite(y_next)) and np.all(y_next >= lo) and np.all(y_next <= hi)):
            # (Q(y) there is no generator: a negative rate, or one beyond float64)
            reason = (f"block {k}'s slow step y + H g(mean x, y) took y from {y.tolist()} to "
                      f"{y_next.tolist()}, outside {domain_text(system.generator)}")  # fmt: skip
            raise MapLeftDomainError(
                f"{reason}; expected a smaller H than {H:g}, which keeps y inside.",
                reason, k, x_blocks[: k + 1].copy(), y_blocks[: k + 1].copy(), P,
            )  # fmt: skip
        y = y_blocks[k + 1] = y_next
    out = {
        "x_blocks": x_blocks,
        "y_blocks": y_blocks,
        "t_blocks": H * np.arange(n_blocks + 1),
        "block_mean": means,
        "P": P,
    }
    if keep:
        out["x_tokens"] = x_tokens
        out["t_tokens"] = H / P * np.arange(n_tok + 1)
    return out
