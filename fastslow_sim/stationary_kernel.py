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

import numba
import numpy as np

__all__ = ["gth"]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def gth(q, tol, check):
    """GTH on each `q[b] (n, n)` (read only, the diagonal ignored): returns `p (count, n)`,
    `bad (count,)` (a zero or non-finite pivot or `p_k`) and `invalid` (with `check`: some row
    does not sum to zero within `tol (1 + |q_ii|)`, is not finite, or has a negative rate)."""
    count, n, _ = q.shape
    p = np.empty((count, n))
    bad = np.zeros(count, dtype=np.bool_)
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
        for i in range(n):
            for j in range(n):
                a[i, j] = q[b, i, j]
            a[i, i] = 0.0
        if check:
            for i in range(n):
                for j in range(n):
                    if a[i, j] < 0.0:
                        invalid = True
        flag = False
        for k in range(n - 1, 0, -1):
            s = 0.0
            for j in range(k):
                s += a[k, j]
            if not s > 0.0:
                flag = True
            for i in range(k):
                a[i, k] /= s
            for i in range(k):  # censor state k: i -> k -> j becomes i -> j
                aik = a[i, k]
                for j in range(k):
                    a[i, j] += aik * a[k, j]
        p[b, 0] = 1.0
        for k in range(1, n):  # back-substitution, normalised at every step
            pk = 0.0
            for i in range(k):
                pk += p[b, i] * a[i, k]
            p[b, k] = pk
            d = 1.0 + pk
            for i in range(k + 1):
                p[b, i] /= d
        for i in range(n):
            if not p[b, i] > 0.0:
                flag = True
        bad[b] = flag
    return p, bad, invalid
