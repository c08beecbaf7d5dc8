"""Compiled GTH (numba) for numpy batches of generators on the CPU.

Why: the vectorised elimination (`stationary._gth_batch_last`) moves the batch to the last axis
and makes every rank-one update one pass over the whole chunk, a temporary included; for many
small chains that is memory traffic, and for one large chain (a batch of 1) each pass is a
stride-1 sweep of a single column, 0.08 GFLOP/s at 1,024 states. Here each generator is
eliminated in its own `(n, n)` copy, which stays in cache for small `n` and is swept row by row
(contiguous, vectorised by the compiler) for large `n`.

The arithmetic is `_gth_batch_last`'s, operation for operation and in the same order (sums
from the first index up; no fused multiply-add, as numba does not contract without fastmath),
so the two give bit-for-bit the same `p` and flags; `tests/test_stationary.py` checks it.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["gth"]


TINY = float(np.finfo(np.float64).tiny)  # a p_k below it may have lost bits: redone
NO_EXPONENT = np.iinfo(np.int64).min // 4  # the exponent of a zero entry


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
def _censor(a):
    """Eliminate states n-1, ..., 1 of `a (n, n)` in place (zero diagonal), as
    `stationary._censor_batch_last` does, flags and all: returns `(bad, risky, low_rate)`."""
    n = a.shape[0]
    flag = False
    risky = False
    low_rate = np.inf
    for k in range(n - 1, 0, -1):
        s = 0.0
        for j in range(k):
            s += a[k, j]
        if not s > 0.0:
            flag = True
        low_prob = _min_positive_row(a, k) / s
        for j in range(k):
            a[k, j] /= s
        a[k, k] = s
        rate = _min_positive_column(a, k)
        low_rate = min(low_rate, rate)
        if low_prob < TINY or rate * low_prob < TINY:
            risky = True
        for i in range(k):  # censor state k: i -> k -> j becomes i -> j
            aik = a[i, k]
            for j in range(k):
                a[i, j] += aik * a[k, j]
    return flag, risky, low_rate


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _copy_zero_diagonal(q, b, a):
    n = a.shape[0]
    for i in range(n):
        for j in range(n):
            a[i, j] = q[b, i, j]
        a[i, i] = 0.0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def gth(q, tol, check):
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
    return p, bad, risky, invalid


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
