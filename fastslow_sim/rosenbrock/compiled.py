"""The compiled CPU march: the whole Rosenbrock solve of one neighbour-chain trajectory in one
numba function, all trajectories in parallel (`prange`).

Why: the torch march (`march.solve`) spends microseconds of dispatch on every one of a step's
few hundred batched operations; a step of the 17-unknown arrow system is only about two thousand
floating-point operations. Here a trajectory's state, stages and factorisation live in a few
short arrays and a step is straight loops over them.

One implementation of the numerics: the kernel takes the tableau's arrays (`A`, `C`, `M`, `E`,
`gamma`, `D`, `order`, and its `from_previous`, `stiffly_accurate`, `plain_error` shortcuts) and
the `StepControl` constants as arguments, and makes the decisions of `march.solve` in the same
order (`tests/test_compiled_march.py` holds the two to 1e-10, statuses and statistics equal):

- stage `i`: `(I/(h gamma) - J) k_i = f(y + sum_j A_ij k_j) + sum_j C_ij k_j / h` (`step.py`);
- accept when `sqrt(mean_i (e_i / (atol + rtol max(|y0_i|, |y1_i|)))^2) <= 1`
  (`cpu_kernels.error_norm`, without overflow); next step
  `h * clamp(safety max(err, err_floor)^(-1/order), fac_min, fac_max)`, `nonfinite_factor` for a
  NaN error (`control.py`); a step shortened to land on its target keeps the longer step proposed
  before it; too small once `h <= underflow_ulps * eps_mach |t| + tiny`;
- output times inside an accepted step from `y(t0 + s h) = (1-s) y0 + s (y1 + (1-s) (D_0.k +
  s D_1.k))` (`dense.py`), or (`dense_output=False`) steps shortened to land on them;
- the first step is `control.initial_step` itself, on the compiled right-hand side.

The physics comes from the system as numbers (`MasterEquationSystem.chain_arrays`): up rates
`k_i e^{beta y} + l_i y`, down rates `down_i` (times `1/eps`), and the slow law `g = w.x + b -
a y + kappa y (c.x)`. The Jacobian is arrow-tridiagonal; `s I - J` is solved for the partial
sums of the chain's unknowns (`_factor`), which keeps the mass of every stage to the round-off
of its entries, the border by its Schur complement. The arithmetic of that solve is
`cpu_kernels`' (`chain_factor`, `chain_border`, `chain_sigma`, `chain_solve`), which the torch
march's solve of a master equation's Jacobian (`linalg.ArrowTridiagonal.chain_state`) runs too.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ..cpu_kernels import chain_border, chain_factor, chain_sigma, chain_solve, error_norm, heaviest
from ..errors import InputError
from ..wording import plural

__all__ = ["march_chain", "CHAIN_KEYS"]

CHAIN_KEYS = ("k", "beta", "l", "down", "w", "c", "b", "a", "kappa")

_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}

# Trajectories march in lanes: a block holds up to `_LANES` of them side by side, every array
# `(..., lanes)`, so that the loops over a chain's states (the eliminations are recurrences
# along the chain) run over independent lanes and vectorise (a run-time lane count: with a
# constant one LLVM unrolls the lanes into scalar code; 32 lanes were 1.3-2x faster than 8 at
# 8-64 states here). Each lane makes its own decisions;
# a lane whose trajectory ends takes the next one of its block's share at once.
_LANES = 32


@numba.njit(**_JIT)
def _rates(y, kr, beta, lr, up, dup, e, derivative):
    """`up_i = kr_i e^{beta y} + lr_i y` (rates scaled by `1/eps`), `dup_i = d up_i / dy`."""
    L = e.shape[0]
    for q in range(L):
        e[q] = np.exp(beta * y[q])
    for i in range(kr.shape[0]):
        for q in range(L):
            up[i, q] = kr[i, q] * e[q] + lr[i, q] * y[q]
    if derivative:
        for i in range(kr.shape[0]):
            for q in range(L):
                dup[i, q] = beta * kr[i, q] * e[q] + lr[i, q]


@numba.njit(**_JIT)
def _rhs(z, n, kr, beta, lr, dr, w, c, b, a, kappa, up, dup, tmp, out):
    """`out = [Q(y)^T x / eps, g(x, y)]`: `dx_i/dt = flux_{i-1} - flux_i`, `flux_i = up_i x_i
    - down_i x_{i+1}` with `up_i = kr_i e^{beta y} + lr_i y`; `g = w.x + b - a y + kappa y
    (c.x)` (`c.x` only where `kappa != 0`)."""
    L = tmp.shape[1]
    y = z[n]
    e, prev, wx, cx = tmp[0], tmp[1], tmp[2], tmp[3]
    for q in range(L):
        e[q] = np.exp(beta * y[q])
        prev[q] = 0.0
        wx[q] = 0.0
        cx[q] = 0.0
    for i in range(n - 1):
        for q in range(L):
            flux = (kr[i, q] * e[q] + lr[i, q] * y[q]) * z[i, q] - dr[i, q] * z[i + 1, q]
            out[i, q] = prev[q] - flux
            prev[q] = flux
    for q in range(L):
        out[n - 1, q] = prev[q]
    for i in range(n):
        for q in range(L):
            wx[q] += w[i] * z[i, q]
    if kappa != 0.0:
        for i in range(n):
            for q in range(L):
                cx[q] += c[i] * z[i, q]
    for q in range(L):
        out[n, q] = wx[q] + b - a * y[q] + kappa * y[q] * cx[q]


@numba.njit(**_JIT)
def _factor(z, n, s, kr, beta, lr, dr, w, c, a, kappa, up, dup, tmp, inv, pm, g, wv, vv,
            inv_sigma, piv):  # fmt: skip
    """Factor `s I - J` at `z` in the cumulative (flux) form that keeps the mass.

    Let `p` be the chain's heaviest state at `z` (`piv`), `T` the sum of the chain's unknowns
    and `V_j` (`j < n-1`) the partial sums `k_0 + ... + k_j` for `j < p` and `-(k_{j+1} + ... +
    k_{n-1})` for `j >= p`, so that `k_i = V_i - V_{i-1} + T [i = p]` (`V_{-1} = V_{n-1} = 0`):
    the light states on either side of `p` are differences of sums of light states only, and
    the heaviest takes the rest. The chain rows of `s I - J`, summed from the nearer end,
    read `(s + up_j + down_j) V_j - up_j V_{j-1} - down_j V_{j+1} = (R or -R')_j + U_j k_n`
    (`+ down_{p-1} T` at `j = p-1`, `- up_p T` at `j = p`; `R`, `R'` the partial sums of the
    right-hand side from either end, `U_j = -dup_j x_j` those of the border column `u`, the same
    from either end) and their sum `s T = R_{n-1}`: the chain's unknowns sum to the right-hand
    side's sum over `s` up to the round-off of the entries (u sum |k_i|; the column sums of
    `J`'s chain block are zero), whatever the rates. The matrix does not depend on `p`; it is
    eliminated from the top with pivots `den_j = e_j + down_j`, `e_j = s + up_j e_{j-1} /
    den_{j-1}` (GTH's idea: sums of positive terms, no cancellation): `inv = 1/den`, `pm =
    up/den`, `g = down/den`, row `n-1` of `inv` holds `1/s`; `wv` the border eliminated, `vv =
    dg/dx`, `inv_sigma = 1/sigma`, `sigma = s - d - sum_j (vv_j - vv_{j+1}) wv_j`.

    The terms in `T` enter the elimination divided by their pivots, as `g_{p-1} T` and `-pm_p
    T` (`pm`, `g` at most 1 in size for positive rates): `up_p T` itself overflowed to inf, and
    `k` to NaN, at rates ~1e281 with `s = 1e-24` and a right-hand side ~1e4, where `k` (~1e28) is
    finite. What remains: the answer must be finite (`T = R_{n-1} / s` is about the heaviest
    state's unknown), and so must `s + up_j + down_j` (rates and `s` below ~1e308 together).

    The one-sided elimination of `s I - J` it replaces (`cpu_kernels.arrow_factor`'s) lost mass
    at each solve, up to 1.5e-8 of it at y = 13 with h = 1e-3 on the birth-death chain at eps
    1e-12 (a solve by LU: 1e-14 there, 4e-11 at y = 2): rodas4 from y0 = 150 ended 2.2e-6 off
    (then 8.3e-10 at 401 saved times, 4.3e-10 since the terms in T enter divided by
    their pivots; and 5,688 right-hand sides for 15,960). The
    partial sums from state 0 alone keep the mass too, but lose the light states above a heavy
    one to the round-off of the heavy one (rodas4 at atol 1e-150 from y0 = 100 then spent its
    1,000,000 steps). The cost: a march of 512 trajectories over [0, 5] at eps 1e-4 took 0.35-0.39
    s for 0.27 s at 8 states, 0.88-0.96 s for 0.70-0.90 s at 32 (2-core machine, shared)."""
    L = tmp.shape[1]
    m = n - 1
    y = z[n]
    e, top, cx = tmp[0], tmp[1], tmp[3]
    _rates(y, kr, beta, lr, up, dup, e, True)
    heaviest(z, n, piv, top)
    chain_factor(n, s, up, dr, inv, pm, g, tmp[2])
    for i in range(m):  # the border: U_j = -dup_j x_j, eliminated
        for q in range(L):
            wv[i, q] = -dup[i, q] * z[i, q]
    chain_border(n, inv, pm, g, wv)
    for q in range(L):
        cx[q] = 0.0
    for i in range(n):
        for q in range(L):
            cx[q] += c[i] * z[i, q]
    for i in range(n):
        for q in range(L):
            vv[i, q] = w[i] + kappa * y[q] * c[i]
    for q in range(L):  # d = dg/dy
        cx[q] = -a + kappa * cx[q]
    chain_sigma(n, s, cx, vv, wv, inv_sigma)


@numba.njit(**_JIT)
def _march_block(lo, hi, z0, t_eval, h0, inv_eps, k, beta, lin, down, w, c, b, a, kappa, A, C,
                 M, E, D, gamma, from_previous, stiffly_accurate, plain_error, dense_output, ctl,
                 rtol, atol, max_steps, out, status, steps_out, accepted_out, reached, lanes):  # fmt: skip
    """March trajectories `lo..hi-1` in `lanes` lanes side by side; writes `out (K, B, N)` at the output
    times, `status` (an index into `march.STATUS`), the steps, the accepted steps and the `t`
    each trajectory reached."""
    N = z0.shape[1]
    n = N - 1
    S = M.shape[0]
    K = t_eval.shape[0]
    L = lanes
    safety, fac_min, fac_max, nonfinite = ctl[0], ctl[1], ctl[2], ctl[3]
    err_floor, expo, ulps, tiny = ctl[4], ctl[5], ctl[6], ctl[7]
    t0, t_end = t_eval[0], t_eval[K - 1]
    y, y_new, yi, f = (np.zeros((N, L)), np.zeros((N, L)), np.zeros((N, L)), np.zeros((N, L)))
    ks = np.zeros((S, N, L))
    m1 = max(n - 1, 1)
    kr, lr, dr = np.zeros((m1, L)), np.zeros((m1, L)), np.zeros((m1, L))
    up, dup = np.zeros((m1, L)), np.zeros((m1, L))
    inv, pm, g, wv, vv = (np.zeros((n, L)), np.zeros((n, L)), np.zeros((n, L)), np.zeros((n, L)),
                          np.zeros((n, L)))  # fmt: skip
    tmp = np.zeros((4, L))
    s, inv_h, hh, errs, inv_sigma = (np.ones(L), np.ones(L), np.ones(L), np.zeros(L),
                                     np.zeros(L))  # fmt: skip
    t, h, t_out, target = np.zeros(L), np.ones(L), np.zeros(L), np.zeros(L)
    clip = np.zeros(L, dtype=np.bool_)
    traj = np.full(L, -1, dtype=np.int64)
    k_next = np.zeros(L, dtype=np.int64)
    piv = np.zeros(L, dtype=np.int64)  # the heaviest state of each lane (`_factor`)
    steps = np.zeros(L, dtype=np.int64)
    accepted = np.zeros(L, dtype=np.int64)
    nxt = lo
    running = 0
    for q in range(L):  # fill the lanes
        if nxt < hi:
            traj[q] = nxt
            nxt += 1
            running += 1
    while running:
        for q in range(L):  # a lane at 0 steps starts its trajectory
            j = traj[q]
            if j >= 0 and steps[q] == 0:
                r = inv_eps[j] if inv_eps.shape[0] > 1 else inv_eps[0]
                for i in range(n - 1):
                    kr[i, q], lr[i, q], dr[i, q] = k[i] * r, lin[i] * r, down[i] * r
                for i in range(N):
                    y[i, q] = z0[j, i]
                t[q], h[q], k_next[q], t_out[q] = t0, h0[j], 1, t_eval[1]
                target[q] = t_end if dense_output else t_eval[1]
        for q in range(L):
            if traj[q] < 0:  # an empty lane computes on harmless numbers
                hh[q], inv_h[q], s[q], clip[q] = 1.0, 1.0, 1.0 / gamma, False
                continue
            steps[q] += 1
            room = target[q] - t[q]
            clip[q] = h[q] >= room  # this step lands on the target
            hh[q] = room if clip[q] else h[q]
            inv_h[q] = 1.0 / hh[q]
            s[q] = 1.0 / (hh[q] * gamma)
        # the step (step.py): k_0 from f(y), then the stages
        _factor(y, n, s, kr, beta, lr, dr, w, c, a, kappa, up, dup, tmp, inv, pm, g, wv, vv,
                inv_sigma, piv)  # fmt: skip
        k0 = ks[0]
        _rhs(y, n, kr, beta, lr, dr, w, c, b, a, kappa, up, dup, tmp, k0)
        chain_solve(n, inv, pm, g, wv, vv, inv_sigma, piv, tmp, k0)
        for i in range(1, S):
            if from_previous[i]:
                for r in range(N):
                    for q in range(L):
                        yi[r, q] = yi[r, q] + ks[i - 1, r, q]
            else:  # y + sum_j A_ij k_j
                for r in range(N):
                    for q in range(L):
                        yi[r, q] = y[r, q]
                for jj in range(i):
                    aij = A[i, jj]
                    for r in range(N):
                        for q in range(L):
                            yi[r, q] += aij * ks[jj, r, q]
            ki = ks[i]
            _rhs(yi, n, kr, beta, lr, dr, w, c, b, a, kappa, up, dup, tmp, f)
            for r in range(N):  # f + inv_h sum_j C_ij k_j
                for q in range(L):
                    ki[r, q] = 0.0
            for jj in range(i):
                cij = C[i, jj]
                for r in range(N):
                    for q in range(L):
                        ki[r, q] += cij * ks[jj, r, q]
            for r in range(N):
                for q in range(L):
                    ki[r, q] = f[r, q] + inv_h[q] * ki[r, q]
            chain_solve(n, inv, pm, g, wv, vv, inv_sigma, piv, tmp, ki)
        if stiffly_accurate:
            for r in range(N):
                for q in range(L):
                    y_new[r, q] = yi[r, q] + ks[S - 1, r, q]
        else:
            for r in range(N):
                for q in range(L):
                    y_new[r, q] = y[r, q]
            for jj in range(S):
                for r in range(N):
                    for q in range(L):
                        y_new[r, q] += M[jj] * ks[jj, r, q]
        # the error norm (control.py), of the estimate `ks[S-1]` or `sum_j E_j k_j`
        ev = ks[S - 1]
        if not plain_error:
            ev = f  # free until the next stage
            for r in range(N):
                for q in range(L):
                    ev[r, q] = 0.0
            for jj in range(S):
                for r in range(N):
                    for q in range(L):
                        ev[r, q] += E[jj] * ks[jj, r, q]
        error_norm(ev, y, y_new, rtol, atol, errs)
        # the decisions, lane by lane
        for q in range(L):
            j = traj[q]
            if j < 0:
                continue
            err = errs[q]
            accept = err <= 1.0  # False for NaN
            if err != err:
                fac = nonfinite
            else:
                fac = safety * (err if err >= err_floor else err_floor) ** expo
                fac = min(max(fac, fac_min), fac_max)
            h_next = hh[q] * fac
            # a step shortened to land on a target says nothing against the longer one before it
            if clip[q] and accept:
                if h_next != h_next or h[q] != h[q]:
                    h[q] = np.nan
                elif h_next >= h[q]:
                    h[q] = h_next
            else:
                h[q] = h_next
            t_prev = t[q]
            if accept:
                t[q] = target[q] if clip[q] else t[q] + hh[q]
                accepted[q] += 1
            under = h[q] <= abs(t[q]) * ulps + tiny
            if accept and t_out[q] <= t[q]:  # output times in the accepted step (dense.py)
                kk = k_next[q]
                while kk < K and t_eval[kk] <= t[q]:
                    sk = (t_eval[kk] - t_prev) / hh[q]
                    if sk == 1.0:
                        for r in range(N):
                            out[kk, j, r] = y_new[r, q]
                    else:
                        for r in range(N):
                            d0, d1 = 0.0, 0.0
                            for jj in range(S):
                                d0 += D[0, jj] * ks[jj, r, q]
                                d1 += D[1, jj] * ks[jj, r, q]
                            out[kk, j, r] = (1 - sk) * y[r, q] + sk * (
                                y_new[r, q] + (1 - sk) * (d0 + sk * d1)
                            )
                    kk += 1
                k_next[q] = kk
                t_out[q] = t_eval[min(kk, K - 1)]
                if not dense_output:
                    target[q] = t_out[q]
            if accept:
                for r in range(N):
                    y[r, q] = y_new[r, q]
            code = -1
            if k_next[q] >= K:
                code = 0
            elif under:
                code = 3 if not np.isfinite(err) else 2
            elif steps[q] >= max_steps:
                code = 1
            if code >= 0:  # the trajectory ends; the lane takes the next one
                status[j], steps_out[j], accepted_out[j] = code, steps[q], accepted[q]
                reached[j] = t[q]
                steps[q], accepted[q] = 0, 0
                if nxt < hi:
                    traj[q] = nxt
                    nxt += 1
                else:
                    traj[q] = -1
                    running -= 1


@numba.njit(parallel=True, **_JIT)
def _march_all(chunks, z0, t_eval, h0, inv_eps, k, beta, lin, down, w, c, b, a, kappa, A, C, M, E,
               D, gamma, from_previous, stiffly_accurate, plain_error, dense_output, ctl, rtol,
               atol, max_steps, out, status, steps, accepted, reached, lanes):  # fmt: skip
    for p in prange(chunks.shape[0] - 1):
        _march_block(chunks[p], chunks[p + 1], z0, t_eval, h0, inv_eps, k, beta, lin, down, w, c,
                     b, a, kappa, A, C, M, E, D, gamma, from_previous, stiffly_accurate,
                     plain_error, dense_output, ctl, rtol, atol, max_steps, out, status, steps,
                     accepted, reached, lanes)  # fmt: skip


@numba.njit(**_JIT)
def _rhs_all(z0, inv_eps, k, beta, lin, down, w, c, b, a, kappa, out):
    """`f(z0)` of every trajectory, `(B, N)`, lane by lane."""
    B, N = z0.shape
    n = N - 1
    m1 = max(n - 1, 1)
    L = _LANES  # (the first derivatives only)
    kr, lr, dr = np.zeros((m1, L)), np.zeros((m1, L)), np.zeros((m1, L))
    up, dup, tmp = np.zeros((m1, L)), np.zeros((m1, L)), np.zeros((4, L))
    z, f = np.zeros((N, L)), np.zeros((N, L))
    for j0 in range(0, B, L):
        for q in range(L):
            j = min(j0 + q, B - 1)
            r = inv_eps[j] if inv_eps.shape[0] > 1 else inv_eps[0]
            for i in range(n - 1):
                kr[i, q], lr[i, q], dr[i, q] = k[i] * r, lin[i] * r, down[i] * r
            for i in range(N):
                z[i, q] = z0[j, i]
        _rhs(z, n, kr, beta, lr, dr, w, c, b, a, kappa, up, dup, tmp, f)
        for q in range(min(L, B - j0)):
            for i in range(N):
                out[j0 + q, i] = f[i, q]


def _tableau_arrays(tab, dense_output):
    """The tableau as the kernel's arguments: square `A`, `C` (zeros on and above the diagonal),
    `M`, `E`, `D (2, s)` and the shortcut flags."""
    s = tab.stages
    A, C = np.zeros((s, s)), np.zeros((s, s))
    for i in range(s):
        A[i, :i], C[i, :i] = tab.A[i], tab.C[i]
    if tab.D:
        D = np.array(tab.D, dtype=np.float64).reshape(2, s)
    elif dense_output:
        raise InputError(
            f"tableau {tab.name!r} has no continuous extension (D); use dense_output=False."
        )
    else:
        D = np.zeros((2, s))
    return (A, C, np.array(tab.M, dtype=np.float64), np.array(tab.E, dtype=np.float64), D,
            float(tab.gamma), np.array(tab.from_previous, dtype=np.bool_),
            bool(tab.stiffly_accurate), bool(tab.plain_error))  # fmt: skip


def march_chain(chain, z0, t_eval, *, eps=None, tableau=None, control=None, rtol=1e-6, atol=1e-9,
                max_steps=100_000, h0=None, dense_output=True, lanes=None):  # fmt: skip
    """`march.solve` for a neighbour-chain master-equation system given as numbers (`chain`,
    from `MasterEquationSystem.chain_arrays`, with its `inv_eps`; `eps (B,)` overrides it per
    trajectory), compiled: the same arguments and the same return value, `(z_out (K, B, N),
    status (B,), stats)` as torch tensors. `lanes`: trajectories per block marched side by side."""
    import torch

    from .control import StepControl
    from .march import _check_inputs
    from .tableau import RODAS4

    tab = RODAS4 if tableau is None else tableau
    control = StepControl() if control is None else control
    z0 = torch.as_tensor(z0, dtype=torch.float64).detach().cpu()
    _check_inputs(z0, t_eval, rtol, atol, max_steps)
    missing = [key for key in CHAIN_KEYS if key not in chain]
    if missing:
        raise InputError(f"the chain arrays lack {missing}; expected the keys {list(CHAIN_KEYS)}.")
    B, N = z0.shape
    n = N - 1
    if n < 2 or len(chain["k"]) != n - 1:
        raise InputError(
            f"z0 has {plural(N, 'component')}; the chain has {len(chain['k']) + 1} states plus one "
            f"slow one."
        )
    te = torch.as_tensor(t_eval, dtype=torch.float64).cpu().contiguous()
    K = te.shape[0]
    z_np = np.ascontiguousarray(z0.numpy())
    t_np = te.numpy()
    inv_eps = chain.get("inv_eps", 1.0) if eps is None else 1.0 / np.asarray(eps, dtype=np.float64)
    inv_eps = np.ascontiguousarray(np.atleast_1d(np.asarray(inv_eps, dtype=np.float64)))
    if inv_eps.shape[0] not in (1, B):
        raise InputError(
            f"eps must be one number or one per trajectory ({B}); got {inv_eps.shape}."
        )
    arr = {key: np.ascontiguousarray(np.asarray(chain[key], dtype=np.float64)) for key in
           ("k", "l", "down", "w", "c")}  # fmt: skip
    sc = {key: float(chain[key]) for key in ("beta", "b", "a", "kappa")}
    physics = (arr["k"], sc["beta"], arr["l"], arr["down"], arr["w"], arr["c"], sc["b"], sc["a"],
               sc["kappa"])  # fmt: skip
    if h0 is not None:
        h = np.full(B, float(h0))
    else:  # the torch march's first guess, on the compiled right-hand side
        f0 = np.empty_like(z_np)
        _rhs_all(z_np, inv_eps, *physics, f0)
        h = control.initial_step(torch.from_numpy(f0), z0, rtol, atol, float(te[0]),
                                 float(te[-1] - te[0])).numpy().copy()  # fmt: skip
    info = np.finfo(np.float64)
    ctl = np.array([control.safety, control.fac_min, control.fac_max, control.nonfinite_factor,
                    control.err_floor, -1.0 / tab.order, control.underflow_ulps * info.eps,
                    info.tiny])  # fmt: skip
    out = np.full((K, B, N), np.nan)
    out[0] = z_np
    status = np.zeros(B, dtype=np.int64)
    steps = np.zeros(B, dtype=np.int64)
    accepted = np.zeros(B, dtype=np.int64)
    reached = np.full(B, float(te[0]))
    # the batch in contiguous shares, a few per thread (trajectories differ in their steps)
    threads = numba.get_num_threads()
    lanes = max(1, min(_LANES, -(-B // threads))) if lanes is None else int(lanes)
    parts = max(1, min(-(-B // lanes), 4 * threads))
    chunks = np.linspace(0, B, parts + 1).round().astype(np.int64)
    _march_all(chunks, z_np, t_np, h, inv_eps, *physics, *_tableau_arrays(tab, dense_output),
               bool(dense_output), ctl, float(rtol), float(atol), int(max_steps), out, status,
               steps, accepted, reached, lanes)  # fmt: skip
    steps_t, s_stages = torch.from_numpy(steps), tab.stages
    stats = {
        "nfev": s_stages * steps_t,
        "njev": steps_t.clone(),
        "nlu": steps_t.clone(),
        "nsolve": s_stages * steps_t,
        "naccept": torch.from_numpy(accepted),
        "nreject": steps_t - torch.from_numpy(accepted),
        "iterations": int(steps.max()),
        "t_reached": torch.from_numpy(reached),
    }
    return torch.from_numpy(out), torch.from_numpy(status), stats
