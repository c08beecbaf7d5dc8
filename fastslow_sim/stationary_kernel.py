"""Compiled GTH (numba) for numpy batches of generators on the CPU.

Why: the vectorised elimination (`stationary._gth_batch_last`) moves the batch to the last axis
and makes every rank-one update one pass over the whole chunk, a temporary included; for many
small chains that is memory traffic, and for one large chain (a batch of 1) each pass is a
stride-1 sweep of a single column, 0.08 GFLOP/s at 1,024 states. Here each generator is
eliminated in its own `(n, n)` copy, which stays in cache for small `n` and is swept row by row
(contiguous, vectorised by the compiler) for large `n`.

The arithmetic is `_gth_batch_last`'s, operation for operation and in the same order (sums
from the first index up; no fused multiply-add, as numba does not contract without fastmath),
so the two give bit-for-bit the same `p` and flags below `BLOCK_MIN` states;
`tests/test_stationary.py` checks it.

From `BLOCK_MIN` states on, one sweep of the whole leading block per eliminated state no
longer fits in cache (2 GFLOP/s at 4,096 states, counting 2n^3/3). There the states are
eliminated in panels of `PANEL` (`_censor_blocked`): within a panel as before, but the update
of the leading block by the panel's states, `a[:lo, :lo] += a[:lo, K] a[K, :lo]` (K the
panel), is delayed to the end of the panel and done as one matrix product (BLAS dgemm, in
place). It is the same sum of the same products in another order, and every term is
non-negative (GTH stays subtraction-free), so each entry keeps its relative accuracy: `p`
agrees with the unblocked elimination to a few units of rounding, and the screen's flags are
computed from the same quantities.
"""

from __future__ import annotations

import ctypes
import math

import numba
import numpy as np
from numba.extending import get_cython_function_address

__all__ = ["gth"]


TINY = float(np.finfo(np.float64).tiny)  # a p_k below it may have lost bits: redone
NO_EXPONENT = np.iinfo(np.int64).min // 4  # the exponent of a zero entry
BLOCK_MIN = 512  # states from which the elimination runs in panels (below: bit for bit unblocked)
PANEL = 64  # states per panel (fastest of 32-256 at 1,024-4,096 states; bench_stationary.py)

# scipy's BLAS dgemm (Fortran interface: every argument by pointer). Passed to the kernel as an
# argument, not captured as a global, so that numba can cache the compiled kernel.
_DGEMM = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)(
    get_cython_function_address("scipy.linalg.cython_blas", "dgemm")
)


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"nnan", "nsz"})
def _min_positive_row(a, k):
    """The smallest positive `a[k, j]`, j < k (inf if none). Fast-math lets the minimum run
    vectorised; a minimum is exact in any order, and NaN only reaches a chain that is flagged."""
    low = np.inf
    for j in range(k):
        v = a[k, j]
        low = min(low, v if v > 0.0 else np.inf)
    return low


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"nnan", "nsz"})
def _min_positive_column(a, k):
    """The smallest positive `a[i, k]`, i < k (inf if none)."""
    low = np.inf
    for i in range(k):
        v = a[i, k]
        low = min(low, v if v > 0.0 else np.inf)
    return low


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _pivot(a, k):
    """Make row `k` of the chain censored to `{0..k}` its jump probabilities into `{0..k-1}`,
    with the rate out, `s = sum_j a[k, j]`, on the diagonal; returns `(zero or non-finite s,
    the screen's risk, the smallest positive rate into k)`."""
    s = 0.0
    for j in range(k):
        s += a[k, j]
    low_prob = _min_positive_row(a, k) / s
    for j in range(k):
        a[k, j] /= s
    a[k, k] = s
    rate = _min_positive_column(a, k)
    return not s > 0.0, low_prob < TINY or rate * low_prob < TINY, rate


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _censor(a):
    """Eliminate states n-1, ..., 1 of `a (n, n)` in place (zero diagonal), as
    `stationary._censor_batch_last` does, flags and all: returns `(bad, risky, low_rate)`."""
    n = a.shape[0]
    flag = False
    risky = False
    low_rate = np.inf
    for k in range(n - 1, 0, -1):
        zero, risk, rate = _pivot(a, k)
        flag |= zero
        risky |= risk
        low_rate = min(low_rate, rate)
        for i in range(k):  # censor state k: i -> k -> j becomes i -> j
            aik = a[i, k]
            for j in range(k):
                a[i, j] += aik * a[k, j]
    return flag, risky, low_rate


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _censor_blocked(a, dgemm):
    """`_censor` in panels of `PANEL` states (the module's docstring): each panel `lo..hi` is
    eliminated with the updates of its own rows and columns, then the leading block takes all
    the panel's updates at once, `a[:lo, :lo] += a[:lo, lo:hi+1] @ a[lo:hi+1, :lo]`."""
    n = a.shape[0]
    flag = False
    risky = False
    low_rate = np.inf
    ints = np.empty(3, dtype=np.int32)  # dgemm's m (= n), k and leading dimension
    ones = np.ones(2)  # alpha = beta = 1
    no_transpose = np.full(1, ord("N"), dtype=np.uint8)
    base = a.ctypes.data
    hi = n - 1
    while hi >= 1:
        lo = max(1, hi - PANEL + 1)
        for k in range(hi, lo - 1, -1):
            zero, risk, rate = _pivot(a, k)
            flag |= zero
            risky |= risk
            low_rate = min(low_rate, rate)
            for i in range(lo):  # rows above the panel: the panel's columns now, the rest later
                aik = a[i, k]
                for j in range(lo, k):
                    a[i, j] += aik * a[k, j]
            for i in range(lo, k):  # the panel's rows: every column
                aik = a[i, k]
                for j in range(k):
                    a[i, j] += aik * a[k, j]
        # row-major a is column-major a^T: a11^T += a21^T a12^T, with a21 = a[lo:hi+1, :lo]
        # and a12 = a[:lo, lo:hi+1]; the three regions do not overlap
        ints[0] = lo
        ints[1] = hi - lo + 1
        ints[2] = n
        m_, k_, ld = ints.ctypes.data, ints[1:].ctypes.data, ints[2:].ctypes.data
        dgemm(no_transpose.ctypes.data, no_transpose.ctypes.data, m_, m_, k_, ones.ctypes.data,
              base + 8 * lo * n, ld, base + 8 * lo, ld, ones[1:].ctypes.data, base, ld)  # fmt: skip
        hi = lo - 1
    return flag, risky, low_rate


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _copy_zero_diagonal(q, b, a):
    n = a.shape[0]
    for i in range(n):
        for j in range(n):
            a[i, j] = q[b, i, j]
        a[i, i] = 0.0


def gth(q, tol, check):
    """GTH on each `q[b] (n, n)` (read only, the diagonal ignored): returns `p (count, n)`,
    `bad (count,)`, `risky (count,)` and `invalid`, as `_gth` says. The certificate that clears
    `risky` holds only where this thread keeps subnormal numbers (`gradual_underflow`)."""
    from .stationary import gradual_underflow

    return _gth(q, tol, check, _DGEMM, gradual_underflow())


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _gth(q, tol, check, dgemm, certify):
    """GTH on each `q[b] (n, n)` (read only, the diagonal ignored): returns `p (count, n)`,
    `bad (count,)` (a zero or non-finite pivot, or a `p_k` that is not finite or zero),
    `risky (count,)` (`stationary._censor_batch_last`'s screen) and `invalid` (with `check`:
    some row does not sum to zero within `tol (1 + |q_ii|)`, is not finite, or has a negative
    rate)."""
    count, n, _ = q.shape
    p = np.empty((count, n))
    bad = np.zeros(count, dtype=np.bool_)
    risky = np.zeros(count, dtype=np.bool_)
    a = np.empty((n, n))
    invalid = False
    for b in range(count):
        if check:
            for i in range(n):
                s = 0.0
                for j in range(n):
                    s += q[b, i, j]
                if not abs(s) <= tol * (abs(q[b, i, i]) + 1.0):  # also NaN
                    invalid = True
        _copy_zero_diagonal(q, b, a)
        if check:
            for i in range(n):
                for j in range(n):
                    if a[i, j] < 0.0:
                        invalid = True
        if n >= BLOCK_MIN:
            flag, risky[b], low_rate = _censor_blocked(a, dgemm)
        else:
            flag, risky[b], low_rate = _censor(a)
        p[b, 0] = 1.0
        for k in range(1, n):  # back-substitution, normalised at every step
            pk = 0.0
            for i in range(k):
                pk += p[b, i] * a[i, k]
            pk /= a[k, k]
            p[b, k] = pk
            d = 1.0 + pk
            for i in range(k + 1):
                p[b, i] /= d
        lost = False
        low_p = np.inf
        for i in range(n):
            if not p[b, i] >= TINY:
                lost = True
            low_p = min(low_p, p[b, i])
        if low_p * low_rate < TINY:
            lost = True  # maybe an inflow p_i a_ik below the normal range
        if lost and not flag:  # pivots fine, some entry out of the normal range: redo p
            lost = _wide(a, p[b])
        bad[b] = flag or lost
        if risky[b] and n > 1 and certify:
            risky[b] = not _underflow_is_harmless(a, p[b])
    return p, bad, risky, invalid


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _underflow_is_harmless(a, p):
    """`stationary._underflow_is_harmless` from the censored `a` and `p` of one chain."""
    n = a.shape[0]
    low = np.inf
    high = -np.inf
    for k in range(1, n):
        f = p[k] * a[k, k]
        if not f >= 0.0:  # NaN
            return False
        low = min(low, f)
        high = max(high, f)
    return (2.0 * TINY) * (n * n) * (0.5 + high) <= low


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _wide(a, out):
    """`stationary._wide_back_substitution` for one censored `a (n, n)`, operation for operation,
    into `out (n,)`; returns whether some entry's inflow is exactly zero or not finite."""
    n = a.shape[0]
    mant = np.zeros(n)
    expo = np.full(n, NO_EXPONENT, dtype=np.int64)
    mant[0] = 0.5
    expo[0] = 1
    for k in range(1, n):
        top = NO_EXPONENT
        for i in range(k):
            t = mant[i] * a[i, k]
            if t > 0.0:
                top = max(top, expo[i] + math.frexp(t)[1])
        s = 0.0
        for i in range(k):
            t = mant[i] * a[i, k]
            mt, et = math.frexp(t)
            tot = expo[i] + et if t > 0.0 else NO_EXPONENT
            s += math.ldexp(mt, max(tot - top, -2000))
        ms, es = math.frexp(a[k, k])
        mk, de = math.frexp(s / ms)
        mant[k] = mk
        expo[k] = top + de - es if mk > 0.0 else NO_EXPONENT
    zero = False
    emax = NO_EXPONENT
    for k in range(n):
        if not mant[k] > 0.0:
            zero = True
        emax = max(emax, expo[k])
    total = 0.0
    for k in range(n):
        out[k] = math.ldexp(mant[k], max(expo[k] - emax, -2000))
        total += out[k]
    for k in range(n):
        out[k] /= total
    return zero
