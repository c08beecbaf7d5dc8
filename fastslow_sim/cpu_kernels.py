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
without pivoting for the column diagonally dominant `s I - Q^T / eps` (see `linalg`). That
elimination loses mass at stiff, lopsided rates (a stage's chain sum off by 1e-3 of its scale
on the birth-death chain at eps 1e-12 on the slow manifold, by all of it at random states): for a master equation's Jacobian
(`linalg.ArrowTridiagonal.chain_state` given) `chain_arrow_factor` / `chain_arrow_solve` solve
in the partial sums of the chain's unknowns instead (`chain_solve`, the compiled march's solve;
see `rosenbrock.compiled._factor`), which keeps it to the round-off of the entries.

All arrays are batch last (`(n, B)` chain rows, `(B,)` per trajectory), as numpy views of the
solver's torch tensors. Compiled on first use and cached on disk by numba. `error_model="numpy"`:
a division by zero gives inf or NaN as in torch (the solver's status per trajectory then says
`non_finite`), not an exception, and lets the loops vectorise.
"""

from __future__ import annotations

import numba
import numpy as np

_MAX = float(np.finfo(np.float64).max)

__all__ = [
    "arrow_factor",
    "arrow_solve",
    "arrow_solve_stage",
    "chain_arrow_factor",
    "chain_arrow_solve",
    "chain_arrow_solve_stage",
    "heaviest",
    "chain_factor",
    "chain_border",
    "chain_solve",
    "combine",
    "error_norm",
]


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


# The mass-keeping solve of a master equation's `s I - J` (the chain block and the border column
# with zero column sums), one implementation for the compiled march (`rosenbrock.compiled`) and
# for the torch march's `chain_arrow_*` kernels: up rates `up_i = J[i+1, i]`, down rates `dr_i =
# J[i, i+1]` (`i < n-1`), the chain's heaviest state `piv`; see `chain_solve` and the docstring
# of `rosenbrock.compiled._factor` for the arithmetic.


@numba.njit(cache=True, nogil=True, error_model="numpy")
def heaviest(x, n, piv, top):
    """`piv[b]` = the first index of the largest of `x[0, b] .. x[n-1, b]` (`top (B,)` scratch)."""
    B = piv.shape[0]
    for b in range(B):
        piv[b] = 0
        top[b] = x[0, b]
    for i in range(1, n):
        for b in range(B):
            heavier = x[i, b] > top[b]
            top[b] = x[i, b] if heavier else top[b]
            piv[b] = i if heavier else piv[b]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def chain_factor(n, s, up, dr, inv, pm, g, rho):
    """The pivots of the partial-sum system, from the top: `den_j = e_j + dr_j`, `e_j = s +
    up_j e_{j-1} / den_{j-1}` (sums of positive terms for positive rates); `inv = 1/den`, `pm =
    up/den`, `g = dr/den` (rows `j < n-1`), `inv[n-1] = 1/s` (`rho (B,)` scratch)."""
    B = s.shape[0]
    m = n - 1
    for b in range(B):
        rho[b] = 1.0  # e_{-1} / den_{-1}
    for i in range(m):
        for b in range(B):
            ei = s[b] + up[i, b] * rho[b]
            inv[i, b] = 1.0 / (ei + dr[i, b])
            pm[i, b] = up[i, b] * inv[i, b]
            g[i, b] = dr[i, b] * inv[i, b]
            rho[b] = ei * inv[i, b]
    for b in range(B):
        inv[m, b] = 1.0 / s[b]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def chain_border(n, inv, pm, g, wv):
    """The border column in partial sums: `wv[:n-1]` holds the partial sums `U_j` of `u` (the
    same from either end: `u` sums to zero) on entry, its `V` (`(s I - T)^{-1} u` in partial sums)
    on return; `wv[n-1] = 0`."""
    B = wv.shape[1]
    m = n - 1
    for i in range(m):
        for b in range(B):
            wv[i, b] = wv[i, b] * inv[i, b]
            if i > 0:
                wv[i, b] += pm[i, b] * wv[i - 1, b]
    for i in range(m - 2, -1, -1):
        for b in range(B):
            wv[i, b] += g[i, b] * wv[i + 1, b]
    for b in range(B):
        wv[m, b] = 0.0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def chain_sigma(n, s, d, vv, wv, inv_sigma):
    """`inv_sigma = 1 / (s - d - sum_j (vv_j - vv_{j+1}) wv_j)`: the Schur complement of the
    border, `v.w` summed by parts (`vv` the border row `v`)."""
    B = s.shape[0]
    for b in range(B):
        inv_sigma[b] = s[b] - d[b]
    for i in range(n - 1):
        for b in range(B):
            inv_sigma[b] -= (vv[i, b] - vv[i + 1, b]) * wv[i, b]
    for b in range(B):
        inv_sigma[b] = 1.0 / inv_sigma[b]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def chain_solve(n, inv, pm, g, wv, vv, inv_sigma, piv, tmp, x):
    """`x (n+1, B) <- (s I - J)^{-1} x` in place, in partial sums (`chain_factor`,
    `chain_border`, `chain_sigma`; `tmp (>= 2, B)` scratch): the partial sums of the right-hand
    side from either end of the chain towards its heaviest state `p`, then `T = sum_i k_i` (the
    right-hand side's sum over `s`), the partial sums `V` of the unknowns (`k_0 + .. + k_j` for
    `j < p`, `-(k_{j+1} + .. + k_{n-1})` for `j >= p`), the border unknown, and `k_i = V_i -
    V_{i-1} + T [i = p]`."""
    L = tmp.shape[1]
    m = n - 1
    xn, tt = tmp[0], tmp[1]
    for q in range(L):
        xn[q] = x[n, q]
    for i in range(1, n):  # R_i below the heaviest state
        for q in range(L):
            x[i, q] += x[i - 1, q] if i < piv[q] else 0.0
    for i in range(n - 2, 0, -1):  # R'_i above it
        for q in range(L):
            x[i, q] += x[i + 1, q] if i > piv[q] else 0.0
    for q in range(L):  # T = (R_{p-1} + r_p + R'_{p+1}) / s
        p = piv[q]
        tt[q] = x[p, q]
        if p > 0:
            tt[q] += x[p - 1, q]
        if p < m:
            tt[q] += x[p + 1, q]
        tt[q] *= inv[m, q]
    # the elimination from the top; row j >= p has -R'_{j+1}, and the terms in T, + down_{p-1}
    # T in row p-1 and - up_p T in row p, enter divided by their pivots, as g_{p-1} T and
    # -pm_p T (at most T in size: rate * T could overflow where the answer is finite)
    for j in range(m):
        for q in range(L):
            p = piv[q]
            rhs = -x[j + 1, q] if j >= p else x[j, q]
            ct = g[j, q] if j == p - 1 else (-pm[j, q] if j == p else 0.0)
            x[j, q] = rhs * inv[j, q] + ct * tt[q] + (pm[j, q] * x[j - 1, q] if j > 0 else 0.0)
    for j in range(m - 2, -1, -1):  # V_j = a_j + g_j V_{j+1} (V_{n-1} = 0)
        for q in range(L):
            x[j, q] += g[j, q] * x[j + 1, q]
    for q in range(L):  # k_n = (r_n + sum_j (vv_j - vv_{j+1}) V_j + vv_p T) / sigma
        xn[q] += vv[piv[q], q] * tt[q]
    for j in range(m):
        for q in range(L):
            xn[q] += (vv[j, q] - vv[j + 1, q]) * x[j, q]
    for q in range(L):
        xn[q] *= inv_sigma[q]
        x[n, q] = xn[q]
    for j in range(m):
        for q in range(L):
            x[j, q] += wv[j, q] * xn[q]
    for q in range(L):  # k_i = V_i - V_{i-1} + T [i = p]
        x[m, q] = -x[m - 1, q]
    for i in range(m - 1, 0, -1):
        for q in range(L):
            x[i, q] -= x[i - 1, q]
    for q in range(L):
        x[piv[q], q] += tt[q]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def chain_arrow_factor(x, up, dr, u, v, d, s, piv, inv, pm, g, w, inv_sigma, tmp):
    """Factor a master equation's `s I - J` (`linalg.ArrowTridiagonal` with `chain_state`) for
    `chain_solve`: `x (n, B)` the chain's state (its heaviest state the pivot `piv (B,)`),
    `up`, `dr` `(n-1, B)` the rates, `u`, `v` `(n, B)` and `d (B,)` the border; fills `piv`,
    `inv`, `pm`, `g`, `w` `(n, B)` and `inv_sigma (B,)` (`tmp (>= 2, B)` scratch)."""
    n, B = u.shape
    m = n - 1
    heaviest(x, n, piv, tmp[0])
    chain_factor(n, s, up, dr, inv, pm, g, tmp[0])
    # U_j: the partial sums of u from the nearer end, u_0 + .. + u_j below the heaviest state,
    # -(u_{j+1} + .. + u_{n-1}) from it on
    for b in range(B):
        tmp[0, b] = 0.0
        tmp[1, b] = 0.0
    for i in range(m):
        for b in range(B):
            tmp[0, b] += u[i, b]
            if i < piv[b]:
                w[i, b] = tmp[0, b]
    for i in range(m, 0, -1):
        for b in range(B):
            tmp[1, b] += u[i, b]
            if i - 1 >= piv[b]:
                w[i - 1, b] = -tmp[1, b]
    chain_border(n, inv, pm, g, w)
    chain_sigma(n, s, d, v, w, inv_sigma)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def chain_arrow_solve(inv, pm, g, w, v, inv_sigma, piv, tmp, x):
    """`x (n+1, B) <- (s I - J)^{-1} x` in place from `chain_arrow_factor`'s output, keeping the
    mass."""
    chain_solve(x.shape[0] - 1, inv, pm, g, w, v, inv_sigma, piv, tmp, x)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _stage_rhs(f, K, c, inv_h, x):
    """`x <- f + inv_h sum_j c_j K_j`, a Rosenbrock stage's right-hand side."""
    N, B = f.shape
    for r in range(N):
        for b in range(B):
            x[r, b] = 0.0
        _add_rows(K, c, r, x)
        for b in range(B):
            x[r, b] = f[r, b] + inv_h[b] * x[r, b]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def chain_arrow_solve_stage(inv, pm, g, w, v, inv_sigma, piv, tmp, f, K, c, inv_h, x):
    """`arrow_solve_stage` for `chain_arrow_factor`'s output."""
    _stage_rhs(f, K, c, inv_h, x)
    chain_solve(f.shape[0] - 1, inv, pm, g, w, v, inv_sigma, piv, tmp, x)


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
    _stage_rhs(f, K, c, inv_h, x)
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
