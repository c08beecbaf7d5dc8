"""Compiled CPU kernels (numba) for the hot loops of the batched Rosenbrock solver.

Why: on the CPU a step of a small system in tensor operations is a few hundred calls, each
costing a microsecond or two of dispatch whatever the batch, and each a pass through memory
over the whole batch. The arrow-tridiagonal solve (`linalg._ArrowSolver`) alone is about 20
calls, and a step makes one factorisation and six solves. Here each of these is one call, and a
stage's right-hand side, its state, and the step's error norm are one pass each. Loops run over
the batch innermost (contiguous rows); a version that ran all passes on blocks of 32
trajectories (to stay in the L1 cache) was 2-3x slower here. The torch versions stay for CUDA,
for autograd and for torch.compile (`linalg.compiled_kernels` decides).

Arrow solve: the arithmetic is the one-sided elimination of `linalg._thomas_factor` / `_thomas_solve` for
`(s I - T)`, `b_i x_i - p_i x_{i-1} - q_i x_{i+1} = r_i` with `b = s - diag`, `p = sub`,
`q = sup`: `den_i = b_i - p_i g_{i-1}`, `g_i = q_i / den_i`; forward `y_i = r_i / den_i +
(p_i / den_i) y_{i-1}`, back `x_i = y_i + g_i x_{i+1}`. The border `J = [[T, u], [v^T, d]]` by
its Schur complement: `w = (s I - T)^{-1} u`, `sigma = s - d - v.w`, and for a right-hand side
`r`: `a = (s I - T)^{-1} r[:n]`, `x_n = (r_n + v.a) / sigma`, `x[:n] = a + w x_n`. Stable
without pivoting for the column diagonally dominant `s I - Q^T / eps` (see `linalg`).

All arrays are batch last (`(n, B)` chain rows, `(B,)` per trajectory), as numpy views of the
solver's torch tensors. Compiled on first use and cached on disk by numba. `error_model="numpy"`:
a division by zero gives inf or NaN as in torch (the solver's status per trajectory then says
`non_finite`), not an exception, and lets the loops vectorise.
"""

from __future__ import annotations

import numba
import numpy as np

_MAX = float(np.finfo(np.float64).max)

__all__ = ["arrow_factor", "arrow_solve", "arrow_solve_stage", "combine", "error_norm"]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _tridiagonal_solve(inv, pm, g, r, x):  # x[:n] <- (s I - T)^{-1} r[:n]; x may be r
    n, B = inv.shape
    for b in range(B):
        x[0, b] = r[0, b] * inv[0, b]
    for i in range(1, n):
        for b in range(B):
            x[i, b] = r[i, b] * inv[i, b] + pm[i, b] * x[i - 1, b]
    for i in range(n - 2, -1, -1):
        for b in range(B):
            x[i, b] += g[i, b] * x[i + 1, b]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def arrow_factor(sub, diag, sup, u, v, d, s, inv, pm, g, w, inv_sigma):
    """Factor `s I - J`: fills `inv = 1/den`, `pm = p/den`, `g = q/den` (`(n, B)`), the border
    column `w = (s I - T)^{-1} u` (`(n, B)`) and `inv_sigma = 1/sigma` (`(B,)`)."""
    n, B = diag.shape
    for b in range(B):
        inv[0, b] = 1.0 / (s[b] - diag[0, b])
        g[0, b] = sup[0, b] * inv[0, b]
        pm[0, b] = 0.0
    for i in range(1, n):
        for b in range(B):
            inv[i, b] = 1.0 / (s[b] - diag[i, b] - sub[i, b] * g[i - 1, b])
            g[i, b] = sup[i, b] * inv[i, b]
            pm[i, b] = sub[i, b] * inv[i, b]
    _tridiagonal_solve(inv, pm, g, u, w)
    for b in range(B):
        inv_sigma[b] = s[b] - d[b]
    for i in range(n):
        for b in range(B):
            inv_sigma[b] -= v[i, b] * w[i, b]
    for b in range(B):
        inv_sigma[b] = 1.0 / inv_sigma[b]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def arrow_solve(inv, pm, g, w, v, inv_sigma, r, x):
    """`x (n+1, B) <- (s I - J)^{-1} r (n+1, B)` from `arrow_factor`'s output; `x` may be `r`."""
    n, B = inv.shape
    for b in range(B):  # x_n collects r_n + v.a (r_n read before x may overwrite it)
        x[n, b] = r[n, b]
    _tridiagonal_solve(inv, pm, g, r, x)  # a = (s I - T)^{-1} r[:n]
    for i in range(n):
        for b in range(B):
            x[n, b] += v[i, b] * x[i, b]
    for b in range(B):
        x[n, b] *= inv_sigma[b]
    for i in range(n):  # x[:n] = a + w x_n
        for b in range(B):
            x[i, b] += w[i, b] * x[n, b]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _add_rows(K, a, r, out):
    """`out[r] += sum_j a_j K[j, r]`, one `j` at a time over the row, which stays in the L1
    cache (a sum over `j` inside the loop over the batch was 4x slower)."""
    for j in range(a.shape[0]):
        aj = a[j]
        for b in range(out.shape[1]):
            out[r, b] += aj * K[j, r, b]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def arrow_solve_stage(inv, pm, g, w, v, inv_sigma, f, K, c, inv_h, x):
    """A Rosenbrock stage's solve, `x <- (s I - J)^{-1} (f + inv_h sum_j c_j K_j)`, the
    right-hand side formed in `x` (`K (i, n+1, B)`, `c (i,)`, `inv_h (B,)`), then solved in place."""
    N, B = f.shape
    for r in range(N):
        for b in range(B):
            x[r, b] = 0.0
        _add_rows(K, c, r, x)
        for b in range(B):
            x[r, b] = f[r, b] + inv_h[b] * x[r, b]
    arrow_solve(inv, pm, g, w, v, inv_sigma, x, x)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def combine(y, K, a, out):
    """A Rosenbrock stage's state, `out = y + sum_j a_j K_j` (`K (i, N, B)`, `a (i,)`)."""
    N, B = y.shape
    for r in range(N):
        for b in range(B):
            out[r, b] = y[r, b]
        _add_rows(K, a, r, out)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def error_norm(e, y0, y1, rtol, atol, out):
    """The step's error per trajectory, `out_b = sqrt(mean_i (e_ib / (atol + rtol
    max(|y0_ib|, |y1_ib|)))^2)` (`(N, B)` arrays; NaN in `e` or `y1` gives NaN). Where a square
    overflows (a scaled entry beyond 1e154) the column is summed again scaled by its largest
    entry, `control.rms`: finite for finite entries, inf for an inf one."""
    N, B = e.shape
    for b in range(B):
        out[b] = 0.0
    for r in range(N):
        for b in range(B):
            q = e[r, b] / _error_scale(y0[r, b], y1[r, b], rtol, atol)
            out[b] += q * q
    for b in range(B):
        if out[b] == np.inf:  # a square overflowed: again, in units of the largest entry
            m = 0.0
            for r in range(N):
                m = max(m, abs(e[r, b] / _error_scale(y0[r, b], y1[r, b], rtol, atol)))
            m = min(m, _MAX)
            out[b] = 0.0
            for r in range(N):
                q = e[r, b] / _error_scale(y0[r, b], y1[r, b], rtol, atol) / m
                out[b] += q * q
            out[b] = (out[b] / N) ** 0.5 * m
        else:
            out[b] = (out[b] / N) ** 0.5


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _error_scale(y0, y1, rtol, atol):
    """`atol + rtol max(|y0|, |y1|)`, the unit of one entry of the error."""
    a0, a1 = abs(y0), abs(y1)
    return atol + rtol * (a0 if a0 >= a1 else a1)
