"""A batched adaptive stiff solver in torch: RODAS4 with one step size per trajectory.

Why RODAS4: a Rosenbrock method needs no Newton iteration, only one factorisation of
`I/(h gamma) - J` per step and one linear solve per stage, which batch well on CPUs and GPUs.
RODAS4 (Hairer and Wanner, Solving ODEs II, 1996, section IV.7) is L-stable and stiffly
accurate, of order 4 with an embedded order-3 error estimate, so it takes large steps on the
slow manifold of a stiff fast-slow system and does not ring in the initial layer. Coefficients in
the (A, C, M, E, gamma) form of Sandu et al.'s KPP Rosenbrock integrators.

Linear algebra (`linalg.shifted_solver`): `jac` returns a dense `(b, n, n)` tensor (batched
LAPACK LU with pivoting) or a structured matrix, `linalg.ArrowTridiagonal` for the neighbour
chains of master-equation systems, solved with O(n) whole-batch vector operations.

Layout and cost: the solver works batch last, `z (n, b)`, so that each component of every
trajectory is one contiguous row. On a CPU a step of a small system is a few hundred tensor
operations on short rows, each costing a few microseconds of dispatch whatever the batch size;
so the step works in place where autograd does not need the graph (stage vectors in one
buffer, each stage sum one matrix product, the linear solver's buffers and views kept from one
step to the next), and the batch width changes rarely (see `rodas4_solve`). Without a graph the
march runs in inference mode, and on the CPU the hot loops (arrow solves, stage states and
right-hand sides, error norm) are compiled kernels (`cpu_kernels`, chosen by
`linalg.compiled_kernels`): one call and one pass through memory each.

Each trajectory has its own time, step size, accept/reject decision and status (`success`,
`max_steps`, `step_underflow`, `non_finite`); a failing trajectory stops alone and the others
go on. Statistics per trajectory: function evaluations, Jacobians, factorisations, stage solves,
accepted and rejected steps. The solution at the output times comes from RODAS4's continuous
extension (or, with `dense_output=False`, from steps shortened to land on them).

Differentiable: with `differentiable=True` the accepted steps are recorded with their step
sizes detached, so autograd differentiates the discrete solution (discretise-then-optimise);
at tight tolerances this is the sensitivity of the ODE solution.

`compile=True` passes the step (Jacobian, factorisation, six stages) through `torch.compile`:
on the CPU it fuses the many small vector operations, at the price of minutes of compilation on
the first call (cached on disk by torch for later processes).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from .errors import InputError
from .linalg import compiled_kernels, keep_one, shifted_solver

__all__ = ["RODAS4", "rodas4_solve", "autograd_jacobian", "STATUS"]

STATUS = ("success", "max_steps", "step_underflow", "non_finite")


@dataclass(frozen=True)
class _Tableau:
    gamma: float
    A: tuple  # strictly lower triangular, A[i][j] for j < i
    C: tuple
    M: tuple
    E: tuple
    order: float  # error estimator's local order (for the step-size exponent)
    D: tuple = ()  # dense output: y(t0 + s h) = (1-s) y0 + s (y1 + (1-s) (D0.k + s D1.k))


def _tri(vals, s):
    out, k = [], 0
    for i in range(s):
        row = []
        for _ in range(i):
            row.append(vals[k])
            k += 1
        out.append(tuple(row))
    return tuple(out)


_A = (1.544, 0.9466785280815826, 0.2557011698983284, 3.314825187068521, 2.896124015972201,
      0.9986419139977817, 1.221224509226641, 6.019134481288629, 12.53708332932087,
      -0.687886036105895, 1.221224509226641, 6.019134481288629, 12.53708332932087,
      -0.687886036105895, 1.0)  # fmt: skip
_C = (-5.6688, -2.430093356833875, -0.2063599157091915, -0.1073529058151375, -9.594562251023355,
      -20.47028614809616, 7.496443313967647, -10.24680431464352, -33.99990352819905,
      11.7089089320616, 8.083246795921522, -7.981132988064893, -31.52159432874371,
      16.31930543123136, -6.058818238834054)  # fmt: skip

RODAS4 = _Tableau(
    gamma=0.25,
    A=_tri(_A, 6),
    C=_tri(_C, 6),
    M=(1.221224509226641, 6.019134481288629, 12.53708332932087, -0.687886036105895, 1.0, 1.0),
    E=(0.0, 0.0, 0.0, 0.0, 0.0, 1.0),
    order=4.0,
    # Hairer's continuous extension of order 3 (rodas.f, METH = 1: D21..D25, D31..D35)
    D=(
        (
            10.12623508344586,
            -7.487995877610167,
            -34.80091861555747,
            -7.992771707568823,
            1.025137723295662,
            0.0,
        ),
        (
            -0.6762803392801253,
            6.087714651680015,
            16.43084320892478,
            24.76722511418386,
            -6.594389125716872,
            0.0,
        ),
    ),  # fmt: skip
)


def _combination(tab: _Tableau):
    """Per stage `i`, whether `y_i = y + sum_j A_ij k_j` is `y_{i-1} + k_{i-1}` (row `i` equals row
    `i-1` plus `e_{i-1}`: RODAS4's last two stages), one addition instead of a sum. And whether
    the method is stiffly accurate (`M = A_{s-1} + e_{s-1}`), so that `y_new = y_s + k_s`."""
    from_previous = [False]
    for i in range(1, len(tab.A)):
        prev = tab.A[i - 1]
        same = i > 1 and tuple(tab.A[i][: i - 1]) == tuple(prev) and tab.A[i][i - 1] == 1.0
        from_previous.append(same)
    stiffly_accurate = tuple(tab.M[:-1]) == tuple(tab.A[-1]) and tab.M[-1] == 1.0
    return from_previous, stiffly_accurate


def _rosenbrock_step(tab: _Tableau):
    """`step(fun, jac, y, h, 1/h, idx) -> (y_new, error vector, stages)` for one Rosenbrock step of
    tableau `tab` on a batch (batch last, `y (n, b)`): one factorisation of `I/(h gamma) - J`,
    one solve per stage. Each stage sum `y + sum_j A_ij k_j` (and `sum_j C_ij k_j`) is a single
    matrix product; without autograd the stages `k_j` are written into one reused `(s, n, b)`
    buffer, with it they stay separate tensors that autograd records."""
    from_previous, stiffly_accurate = _combination(tab)
    s_stages = len(tab.M)
    plain_error = tuple(tab.E) == (0.0,) * (s_stages - 1) + (1.0,)
    rows = {}  # (dtype, device) -> the rows of A and C as (1, i) tensors

    def coefficient_rows(like):
        key = (like.dtype, like.device)
        if key not in rows:
            kw = {"dtype": like.dtype, "device": like.device}
            rows[key] = (
                [torch.tensor([a], **kw) if a else None for a in tab.A],
                [torch.tensor([c], **kw) if c else None for c in tab.C],
            )
        return rows[key]

    # the rows as numpy arrays for the compiled CPU kernels (`cpu_kernels.combine`, `.stage`)
    A_np = [np.array(a, dtype=np.float64) for a in tab.A]
    C_np = [np.array(c, dtype=np.float64) for c in tab.C]

    def step(fun, jac, ya, hh, inv_h, sel, workspace=None):  # batch last: ya (n, b), hh (b,)
        s = (hh * tab.gamma).reciprocal_()
        solve, k0 = shifted_solver(jac(ya, sel), s, first=fun(ya, sel), workspace=workspace)
        A, C = coefficient_rows(ya)
        n, b = ya.shape
        # in place into one buffer unless autograd records or torch.compile traces the step
        buffered = not (k0.requires_grad or ya.requires_grad or torch.compiler.is_compiling())
        # on the CPU, compiled kernels form each stage's state and (with the compiled arrow
        # solver) solve for its right-hand side without forming it: one pass each
        kernels = compiled_kernels(ya.device) if buffered else None
        stage_solve = getattr(solve, "stage", None) if kernels is not None else None
        if buffered:

            def stage_buffer():  # K (s, n, b), its rows k_j, and k_0..k_{i-1} flat as (i, n b);
                # for the kernels, numpy views of K and of the stage states Y (s, n, b)
                K = torch.empty((s_stages, n, b), dtype=ya.dtype, device=ya.device)
                Kf = K.view(s_stages, n * b)
                Y = torch.empty_like(K) if kernels is not None else None
                numpy = (K.numpy(), Y.numpy()) if kernels is not None else (None, None)
                return K, K.unbind(0), [Kf[:i] for i in range(s_stages + 1)], Y, numpy

            # reused from step to step: the caller is done with the stages before the next step
            K, ks, leading, Y, (K_np, Y_np) = (stage_buffer() if workspace is None
                              else keep_one(workspace, ("stages", n, b), stage_buffer))  # fmt: skip
            ks[0].copy_(k0)
        else:
            ks = [k0]

        def first(i):  # k_0 .. k_{i-1} as (i, n b)
            return leading[i] if buffered else torch.stack(ks[:i]).view(i, n * b)

        yf, yi = ya.reshape(1, n * b), ya
        if kernels is not None:
            ya_np, inv_h_np = ya.numpy(), inv_h.numpy().reshape(-1)
        for i in range(1, s_stages):
            if from_previous[i]:
                yi = yi + ks[i - 1]
            elif kernels is not None:  # y + sum_j A_ij k_j in one pass
                kernels.combine(ya_np, K_np[:i], A_np[i], Y_np[i])
                yi = Y[i]
            else:  # mm then add: faster than addmm for one row on the CPU
                yi = torch.mm(A[i], first(i)).add_(yf).view(n, b)
            if stage_solve is not None:  # (s I - J)^{-1} (f + sum_j C_ij k_j / h), one pass
                stage_solve(fun(yi, sel), K_np[:i], C_np[i], inv_h_np, out=ks[i])
                continue
            rhs = torch.addcmul(fun(yi, sel), torch.mm(C[i], first(i)).view(n, b), inv_h)
            if buffered:
                solve(rhs, out=ks[i])
            else:
                ks.append(solve(rhs))
        if stiffly_accurate:
            y_new = yi + ks[-1]
        else:
            y_new = torch.addmm(yf, ya.new_tensor([tab.M]), first(s_stages)).view(n, b)
        err = (
            ks[-1] if plain_error else torch.mm(ya.new_tensor([tab.E]), first(s_stages)).view(n, b)
        )
        return y_new, err, (K if buffered else ks)

    return step


def _dense_outputs(tab, rows, ks, y0, y1, t0, h, t1, t_eval, k_next, idx, out_rows, recorded):
    """Write the solution at every output time in `(t0, t1]` of the accepted steps `rows`,
    `y(t0 + s h) = (1-s) y0 + s (y1 + (1-s) (D_0.k + s D_1.k))`, and advance `k_next`; exact at
    `s = 1` (a step that landed on the output time). All the (step, output time) pairs at once:
    a step longer than the spacing of the output times covers several. `recorded`
    (differentiable runs) keeps the values with their graphs. `y0`, `y1` are batch last,
    `(n, b)`; `ks` the stages, `(s, n, b)` (a tensor, or a list of `(n, b)`)."""
    n = y1.shape[0]
    kk = k_next[rows]  # the first output time in each step (due: t_eval[kk] <= t1)
    k_end = torch.searchsorted(t_eval, t1[rows], right=True)  # past the last one
    k_next[rows] = k_end
    counts = k_end - kk
    if bool((counts == 1).all()):  # the usual case: one output time per step
        sel, k = rows, kk
    else:  # pair each step with each of its output times
        sel = rows.repeat_interleave(counts)
        first = (torch.cumsum(counts, 0) - counts).repeat_interleave(counts)
        k = kk.repeat_interleave(counts) + torch.arange(sel.numel(), device=sel.device) - first
    s = ((t_eval[k] - t0[sel]) / h[sel])[:, None].detach()
    y_end = y1[:, sel].T  # batch first from here
    if bool((s == 1).all()):  # every step landed on its output time: the step's end
        val = y_end
    else:  # D (2, s) times the stages of these steps, one product
        Ks = (ks if torch.is_tensor(ks) else torch.stack(ks))[:, :, sel]
        D = torch.tensor(tab.D, dtype=Ks.dtype, device=Ks.device)
        d0, d1 = (D @ Ks.reshape(len(tab.M), -1)).reshape(2, n, -1).transpose(1, 2).unbind(0)
        val = (1 - s) * y0[:, sel].T + s * (y_end + (1 - s) * (d0 + s * d1))
    g = idx[sel]
    out_rows[k, g] = val.detach()
    if recorded is not None:
        for b, kb, i in zip(g.tolist(), k.tolist(), range(len(sel))):
            recorded[b][kb] = val[i]


def autograd_jacobian(fun):
    """`jac(z, idx) (b, n, n)` of `fun` by forward-mode automatic differentiation, the fallback
    when a system has no analytic Jacobian. The rows of a batch are independent, so one
    directional derivative along `e_j` for all rows at once gives column `j` of every
    trajectory's Jacobian; `torch.func.vmap` runs the `n` directions together."""

    def jac(z, idx=None):
        n = z.shape[1]
        directions = torch.eye(n, dtype=z.dtype, device=z.device)[:, None, :].expand(n, *z.shape)

        def column(e):
            return torch.func.jvp(lambda w: fun(w, idx), (z,), (e,))[1]

        return torch.func.vmap(column)(directions).permute(1, 2, 0)

    return jac


def _batch_last(fun, jac):
    """The solver works batch last, `z (n, b)`: each component one contiguous row, so that the
    elimination down a chain and the stage sums run on contiguous vectors. `fun.batch_last`
    (and `jac.batch_last`) are used where a system provides them (`torch_functions` does for
    the neighbour chains); otherwise the batch-first functions are called on the transpose."""
    fun_bl = getattr(fun, "batch_last", None)
    if fun_bl is None:

        def fun_bl(z, idx=None):
            return fun(z.T, idx).T

    if jac is None:
        jac = autograd_jacobian(fun)
    jac_bl = getattr(jac, "batch_last", None)
    if jac_bl is None:

        def jac_bl(z, idx=None):
            return jac(z.T, idx)

    return fun_bl, jac_bl


def _check_inputs(z0, t_eval, rtol, atol, max_steps):
    """`InputError` (one sentence) unless the arguments of `rodas4_solve` make sense."""
    if z0.ndim != 2 or z0.shape[0] < 1 or z0.shape[1] < 1:
        raise InputError(
            f"z0 must have shape (batch, n) with batch, n >= 1; got {tuple(z0.shape)}."
        )
    t = torch.as_tensor(t_eval, dtype=torch.float64).cpu()
    if t.ndim != 1 or t.numel() < 2 or not torch.isfinite(t).all() or not (t[1:] > t[:-1]).all():
        raise InputError(
            f"t_eval must be at least two finite, strictly increasing times; got {t.tolist()}."
        )
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not (float(v) > 0 and float(v) < float("inf")):
            raise InputError(f"{name} must be a positive finite number; got {v!r}.")
    if int(max_steps) < 1:
        raise InputError(f"max_steps must be a positive integer; got {max_steps!r}.")


def rodas4_solve(
    fun,
    jac,
    z0: torch.Tensor,
    t_eval: torch.Tensor,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 100_000,
    h0: float | None = None,
    differentiable: bool = False,
    compile: bool = False,
    dense_output: bool = True,
):
    """Integrate `dz/dt = fun(z, idx)` (autonomous, batched: `z (b, n)`) and return `z` at `t_eval`.

    `fun(z, idx)` and `jac(z, idx)` receive the rows `z` of the trajectories `idx` (a long tensor
    into the batch; `None` means all, in order): only trajectories still running are evaluated,
    and per-trajectory parameters must be indexed with `idx`. `jac` returns a dense `(b, n, n)`
    tensor or a structured matrix such as `linalg.ArrowTridiagonal` (see `linalg.shifted_solver`);
    `jac=None` takes it from `fun` by automatic differentiation (`autograd_jacobian`).
    Returns `(z_out (K, B, n), status (B,) int, stats dict of (B,) int tensors)`;
    `STATUS[status[b]]` names each trajectory's outcome. Entries after a failure are NaN.

    Output times: with `dense_output` (the default) steps run past them and the solution there
    comes from RODAS4's continuous extension of order 3 (Hairer's), so many output times cost no
    extra steps; with `dense_output=False` every step is shortened to land on them.

    The running trajectories are kept packed (`ya`, `ta`, `ha`): one step of all of them is one
    pass of whole-batch tensor operations. A trajectory that reaches its last output time or
    fails is frozen in place (computed and ignored) until an eighth of the packed set is frozen,
    and then the set is repacked, so that the cost per step follows the number still running
    while the width, and with it the buffers the step reuses, changes only every so often.
    """
    tab = RODAS4
    s_stages = len(tab.M)
    fun_bl, jac_bl = _batch_last(fun, jac)
    step = _rosenbrock_step(tab)
    if compile:
        step = torch.compile(step, dynamic=True)
    _check_inputs(z0, t_eval, rtol, atol, max_steps)
    B, n = z0.shape
    dtype, device = z0.dtype, z0.device
    t_eval = t_eval.to(dtype=dtype, device=device)
    K = t_eval.shape[0]
    t0, t_end = float(t_eval[0]), float(t_eval[-1])
    span = t_end - t0
    # Hairer's codes (rodas.f): a step is too small once 0.1 |h| <= uround |t|, that is below
    # ten ulps of the current time; no floor tied to the span (1e-14 * t_end killed Robertson on
    # [0, 1e11] at its first step). `tiny` only stops a step that underflows at t = 0.
    uround = torch.finfo(dtype).eps
    tiny = torch.finfo(dtype).tiny
    out_rows = torch.full((K, B, n), float("nan"), dtype=dtype, device=device)
    out_rows[0] = z0.detach()
    recorded = [[z0[b]] + [None] * (K - 1) for b in range(B)] if differentiable else None

    status = torch.zeros(B, dtype=torch.long, device=device)
    steps = torch.zeros(B, dtype=torch.long, device=device)
    naccept = torch.zeros(B, dtype=torch.long, device=device)
    grad = differentiable and torch.is_grad_enabled()  # else no graph: the step works in place
    # without a graph the march runs in inference mode, which skips autograd's bookkeeping on
    # every one of the few hundred small operations of a step (about 1.3x faster on the CPU);
    # what it returns was made before, so it is an ordinary tensor
    with torch.inference_mode(not grad):
        if h0 is not None:
            h = torch.full((B,), h0, dtype=dtype, device=device)
        else:  # a first guess from the initial derivative, as Hairer's codes do
            with torch.no_grad():
                f0 = fun(z0.detach(), None)
                scale = atol + rtol * z0.detach().abs()
                d0 = torch.sqrt(((z0.detach() / scale) ** 2).mean(-1))
                d1 = torch.sqrt(((f0 / scale) ** 2).mean(-1))
                guess = torch.where(
                    (d0 > 1e-5) & (d1 > 1e-5), 0.01 * d0 / d1, torch.full_like(d0, 1e-6)
                )
                h = torch.clamp(guess, min=100 * uround * abs(t0), max=span)

        # the packed working set of running trajectories
        idx = torch.arange(B, device=device)
        packed = (
            False  # False while the working set is the whole batch in order (idx = None for fun)
        )
        ya = (z0 if differentiable else z0.detach()).T.contiguous()  # batch last: (n, b)
        ta = torch.full((B,), t0, dtype=dtype, device=device)
        ha = h
        k_next = torch.ones(B, dtype=torch.long, device=device)
        # steps are shortened to land on `target`: every output time, or only the last one
        t_out = t_eval[k_next]  # the next output time of each trajectory
        target = torch.full((B,), t_end, dtype=dtype, device=device) if dense_output else t_out
        acc_a = torch.zeros(B, dtype=torch.long, device=device)
        workspace = None if compile else {}  # the linear solver's buffers, reused step to step
        n_iter = 0
        # A trajectory that finishes or fails is frozen in place (its column keeps being computed and
        # ignored) until an eighth of the packed set is frozen; then the set is repacked. Repacking
        # at every departure would change the batch width hundreds of times, and each new width
        # costs new buffers and views. Differentiable runs repack at once: a frozen column's
        # arithmetic may overflow, and autograd would sum its 0 * inf into shared parameters.
        live = torch.ones(B, dtype=torch.bool, device=device)
        n_live, n_frozen = B, 0
        repack_at = 0 if differentiable else 8
        inf = torch.tensor(float("inf"), dtype=dtype, device=device)
        kernels = compiled_kernels(device) if not grad else None  # for the error norm
        # the step-size bookkeeping records no graph (inference mode, or no_grad when recording)
        untracked = torch.no_grad if grad else contextlib.nullcontext
        on_cpu = device.type == "cpu"
        while n_live:
            n_iter += 1
            sel = idx if packed else None
            with untracked():
                room = target - ta
                clip = ha >= room  # this step lands on the target
                hh = torch.where(clip, room, ha)
                inv_h = (1.0 / hh)[None, :]
            y_new, err_vec, ks = step(fun_bl, jac_bl, ya, hh, inv_h, sel, workspace)
            with untracked():
                if kernels is not None:  # one pass
                    err = torch.empty_like(hh)
                    kernels.error_norm(err_vec.numpy(), ya.numpy(), y_new.numpy(), rtol, atol,
                                       err.numpy())  # fmt: skip
                else:  # RMS norm; vecdot is ~15x faster than vector_norm
                    scale = torch.maximum(ya.detach().abs(), y_new.detach().abs())
                    q = err_vec.detach() / scale.mul_(rtol).add_(atol)
                    err = torch.linalg.vecdot(q, q, dim=0).mul_(1.0 / n).sqrt_()
                accept = err <= 1.0  # False for NaN
                # next step h * 0.9 err^(-1/4), growing at most 6-fold after an accepted step and
                # shrinking at most 10-fold after a rejected one (accepted: factor >= 0.9; rejected:
                # < 0.9, so one clamp to [0.1, 6] does both)
                fac = err.clamp(min=1e-10).pow_(-1.0 / tab.order).mul_(0.9).clamp_(0.1, 6.0)
                h_next = hh * fac.nan_to_num_(nan=0.2, posinf=0.2)  # a non-finite step: shrink by 5
                # a step shortened to land on a target says nothing against the longer step
                # proposed before it (else a short landing could end in a step underflow)
                ha = torch.where(clip & accept, torch.maximum(h_next, ha), h_next)
                t_prev = ta
                ta = torch.where(accept, torch.where(clip, target, ta + hh), ta)  # exact landing
                due = accept & (t_out <= ta)  # an output time in the accepted step
                acc_a += accept
                under = ha <= torch.abs(ta).mul_(10 * uround).add_(tiny)  # relative to t
                if n_frozen:
                    due &= live
                    under &= live
                event = due | under
            y_prev = ya
            # (on the CPU, where a check costs no synchronisation, skip the copy when every
            # step was accepted, as almost all are)
            ya = y_new if on_cpu and bool(accept.all()) else torch.where(accept, y_new, ya)
            if not bool(event.any()) and n_iter < max_steps:
                continue
            # something happened: outputs, finished or failed trajectories (ya keeps its graph when
            # differentiable, so no no_grad here)
            rows = torch.nonzero(due).squeeze(-1)
            if rows.numel():
                _dense_outputs(tab, rows, ks, y_prev, y_new, t_prev, hh, ta, t_eval, k_next, idx,
                               out_rows, recorded)  # fmt: skip
                t_out = t_eval[k_next.clamp(max=K - 1)]
                if not dense_output:
                    target = torch.where(live, t_out, inf) if n_frozen else t_out
            finished = k_next >= K
            leave = finished & live
            if bool(under.any()):  # failures (rare)
                finite = torch.isfinite(err)
                fail_bad = under & ~finite & ~finished
                fail_under = under & finite & ~finished
                status[idx[fail_bad]] = STATUS.index("non_finite")
                status[idx[fail_under]] = STATUS.index("step_underflow")
                leave |= under
            if n_iter >= max_steps:
                status[idx[live & ~leave]] = STATUS.index("max_steps")
                leave = live.clone()
            n_leave = int(leave.sum())
            if n_leave:
                gone = idx[leave]
                steps[gone] = n_iter
                naccept[gone] = acc_a[leave]
                live &= ~leave
                n_live -= n_leave
                n_frozen += n_leave
                if n_live and n_frozen * repack_at >= live.numel():
                    keep = torch.nonzero(live).squeeze(-1)
                    idx, ta, ha, k_next, t_out, target, acc_a, live = (
                        idx[keep],
                        ta[keep],
                        ha[keep],
                        k_next[keep],
                        t_out[keep],
                        target[keep],
                        acc_a[keep],
                        live[keep],
                    )
                    ya = ya[:, keep]
                    packed, n_frozen = True, 0
                elif n_live:  # frozen: never clipped to a target, so never landing on one
                    target = torch.where(live, target, inf)

    if differentiable:
        rows = []
        for k in range(K):
            col = [
                recorded[b][k] if recorded[b][k] is not None else out_rows[k, b] for b in range(B)
            ]
            rows.append(torch.stack(col))
        out_rows = torch.stack(rows)
    stats = {
        "nfev": s_stages * steps,
        "njev": steps.clone(),
        "nlu": steps.clone(),
        "nsolve": s_stages * steps,
        "naccept": naccept,
        "nreject": steps - naccept,
        "iterations": n_iter,
    }
    return out_rows, status, stats
