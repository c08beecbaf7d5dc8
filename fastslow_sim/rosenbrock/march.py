"""The batched march: one Rosenbrock solve of many trajectories, each with its own step size.

Each trajectory has its own time, step size, accept/reject decision and status (`success`,
`max_steps`, `step_underflow`, `non_finite`); a failing trajectory stops alone and the others go
on. Statistics per trajectory: function evaluations, Jacobians, factorisations, stage solves,
accepted and rejected steps. The solution at the output times comes from the tableau's
continuous extension (or, with `dense_output=False`, from steps shortened to land on them).

The parts are orthogonal: the tableau (`tableau.py`), the step (`step.py`), the step-size
control (`control.py`), the dense output (`dense.py`), the linear solver (`linalg.LinearSolver`,
a parameter) and the vector field (`vector_field.VectorField`, from the system).

Layout and cost: the march works batch last, `z (n, b)`. On a CPU a step of a small system is a
few hundred tensor operations on short rows, each costing microseconds of dispatch whatever the
batch size; so the step works in place where autograd does not need the graph, and the batch
width changes rarely (see `solve`). Without a graph the march runs in inference mode.

Differentiable: with `differentiable=True` the accepted steps are recorded with their step sizes
detached, so autograd differentiates the discrete solution (discretise-then-optimise); at tight
tolerances this is the sensitivity of the ODE solution.
"""

from __future__ import annotations

import contextlib

import torch

from ..errors import InputError
from ..linalg import linear_solver as resolve_linear_solver
from ..vector_field import VectorField, autograd_jacobian
from .control import StepControl
from .dense import dense_outputs
from .step import rosenbrock_step
from .tableau import RODAS4, RosenbrockTableau

__all__ = ["solve", "rodas4_solve", "STATUS"]

STATUS = ("success", "max_steps", "step_underflow", "non_finite")


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


def rodas4_solve(fun, jac, z0, t_eval, **options):
    """`solve` with RODAS4 for batch-first callables: `fun(z (b, n), idx) -> (b, n)` and
    `jac(z, idx) -> (b, n, n)` (`None`: by automatic differentiation)."""
    return solve(VectorField.from_batch_first(fun, jac), z0, t_eval, **options)


def solve(
    field: VectorField,
    z0: torch.Tensor,
    t_eval: torch.Tensor,
    *,
    tableau: RosenbrockTableau = RODAS4,
    control: StepControl = StepControl(),  # noqa: B008 - frozen, shared
    linear_solver="auto",
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 100_000,
    h0: float | None = None,
    differentiable: bool = False,
    dense_output: bool = True,
):
    """Integrate `dz/dt = field.fun(z, idx)` (autonomous; `z0 (B, n)`) and return `z` at `t_eval`.

    `field.fun(z, idx)` and `field.jac(z, idx)` receive the columns `z (n, b)` of the
    trajectories `idx` (a long tensor into the batch; `None` means all, in order): only
    trajectories still running are evaluated. `linear_solver`: a name of
    `linalg.LINEAR_SOLVERS`, `"auto"` (by the field's `structure` and the device) or a
    `LinearSolver`. Returns `(z_out (K, B, n), status (B,) int, stats)`: `stats` holds `(B,)` int
    tensors of counts and `t_reached (B,)`, the time each trajectory reached (`t_eval[-1]` where
    it succeeded, where it stopped where it failed);
    `STATUS[status[b]]` names each trajectory's outcome. Entries after a failure are NaN.

    Output times: with `dense_output` (the default) steps run past them and the solution there
    comes from the tableau's continuous extension, so many output times cost no extra steps;
    with `dense_output=False` every step is shortened to land on them. RODAS4's extension is of
    order 3, so the values between steps can miss by several times rtol where the step ends
    do not (`solvers.rosenbrock.solve_rosenbrock` gives the numbers).

    The running trajectories are kept packed (`ya`, `ta`, `ha`): one step of all of them is one
    pass of whole-batch tensor operations. A trajectory that reaches its last output time or
    fails is frozen in place (computed and ignored) until an eighth of the packed set is frozen,
    and then the set is repacked, so that the cost per step follows the number still running
    while the width, and with it the buffers the step reuses, changes only every so often.
    """
    tab = tableau
    s_stages = tab.stages
    if dense_output and not tab.D:
        raise InputError(
            f"the tableau {tab.name!r} has no continuous extension; use dense_output=False "
            f"(every output time is then landed on)."
        )
    if field.jac is None:
        field = VectorField(field.fun, autograd_jacobian(field.fun), "dense")
    step = rosenbrock_step(tab)
    _check_inputs(z0, t_eval, rtol, atol, max_steps)
    B, n = z0.shape
    dtype, device = z0.dtype, z0.device
    t_eval = t_eval.to(dtype=dtype, device=device)
    K = t_eval.shape[0]
    t0, t_end = float(t_eval[0]), float(t_eval[-1])
    span = t_end - t0
    out_rows = torch.full((K, B, n), float("nan"), dtype=dtype, device=device)
    out_rows[0] = z0.detach()
    recorded = [[z0[b]] + [None] * (K - 1) for b in range(B)] if differentiable else None

    status = torch.zeros(B, dtype=torch.long, device=device)
    steps = torch.zeros(B, dtype=torch.long, device=device)
    naccept = torch.zeros(B, dtype=torch.long, device=device)
    t_reached = torch.full((B,), t0, dtype=dtype, device=device)
    grad = differentiable and torch.is_grad_enabled()  # else no graph: the step works in place
    solver = resolve_linear_solver(linear_solver, field.structure, device, grad)
    # without a graph the march runs in inference mode, which skips autograd's bookkeeping on
    # every one of the few hundred small operations of a step (about 1.3x faster on the CPU);
    # what it returns was made before, so it is an ordinary tensor
    with torch.inference_mode(not grad):
        if h0 is not None:
            h = torch.full((B,), h0, dtype=dtype, device=device)
        else:  # a first guess from the initial derivative, as Hairer's codes do
            with torch.no_grad():
                f0 = field.fun(z0.detach().T.contiguous(), None).T
                h = control.initial_step(f0, z0.detach(), rtol, atol, t0, span)

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
        workspace = {}  # the linear solver's buffers, reused step to step
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
        kernels = solver.kernels  # for the error norm (None unless compiled)
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
            y_new, err_vec, ks = step(field, ya, hh, inv_h, sel, solver, workspace)
            with untracked():
                err = control.error_norm(err_vec, ya, y_new, rtol, atol, kernels)
                accept = err <= 1.0  # False for NaN
                h_next = control.next_step(hh, err, tab.order)
                # a step shortened to land on a target says nothing against the longer step
                # proposed before it (else a short landing could end in a step underflow)
                ha = torch.where(clip & accept, torch.maximum(h_next, ha), h_next)
                t_prev = ta
                ta = torch.where(accept, torch.where(clip, target, ta + hh), ta)  # exact landing
                due = accept & (t_out <= ta)  # an output time in the accepted step
                acc_a += accept
                under = control.too_small(ha, ta)  # relative to t
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
                dense_outputs(tab, rows, ks, y_prev, y_new, t_prev, hh, ta, t_eval, k_next, idx,
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
                t_reached[gone] = ta[leave].detach()
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
        "t_reached": t_reached,
    }
    return out_rows, status, stats
