"""The batched Rosenbrock march (`fastslow_sim.rosenbrock`): one method per tableau of
`rosenbrock.TABLEAUS` (`rodas4`, `rodas3`), so a new table is a new method. Each runs in torch
(CPU or CUDA) or compiled (`rosenbrock.compiled`, the whole per-trajectory march in numba) on
the CPU for systems that give their physics as numbers (`chain_arrays`); `march` chooses."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..rosenbrock.tableau import TABLEAUS
from . import ATOL_ANY, Method, Solution, max_steps_message, register

MARCHES = ("auto", "torch", "compiled")


def _compiled_available():
    try:
        from ..rosenbrock import compiled  # noqa: F401 - imports numba
    except ImportError:
        return False
    return True


def choose_march(system, march, device, linear_solver):
    """`"torch"` or `"compiled"` for `march`; `auto` takes the compiled march on the CPU for a
    system with `chain_arrays` (and the default linear solver) where numba imports."""
    import torch

    if march not in MARCHES:
        raise InputError(f"unknown march {march!r}; expected one of {list(MARCHES)}.")
    arrays = getattr(system, "chain_arrays", None)
    fits = arrays is not None and arrays() is not None
    cpu = torch.device(device).type == "cpu"
    if march == "compiled":
        if not fits:
            raise InputError(
                f"the compiled march needs a neighbour-chain system with one slow variable that "
                f"gives its rates as numbers (chain_arrays); {system.name!r} has none, use "
                f"march='torch'."
            )
        if not cpu or linear_solver != "auto":
            raise InputError(
                f"the compiled march runs on the CPU with its own arrow solve; got device "
                f"{device!r} and linear_solver {linear_solver!r} (use march='torch')."
            )
        if not _compiled_available():
            raise InputError("the compiled march needs numba, which does not import.")
        return "compiled"
    if march == "auto" and fits and cpu and linear_solver == "auto" and _compiled_available():
        return "compiled"
    return "torch"


def solve_rosenbrock(system, z0, t_eval, rtol, atol, eps=None, max_steps=1_000_000, device="cpu",
                     dense_output=None, linear_solver="auto", tableau="rodas4",
                     march="auto"):  # fmt: skip
    """One batch `z0 (B, N)` (and one `eps` per trajectory, if given) in one march; output times
    from the tableau's continuous extension where it has one (`dense_output=None`). RODAS4's is
    of order 3, its steps of order 4: on the 30-state birth-death chain at eps 1e-6 and rtol 1e-8
    the outputs between steps missed by 4.3e-8 (4.3 rtol), those of `dense_output=False`, which
    lands a step on every output time (at more steps), by 1.2e-10."""
    import torch

    from ..rosenbrock import STATUS, solve

    tab = TABLEAUS[tableau]
    dense_output = bool(tab.D) if dense_output is None else dense_output

    if np.ndim(atol) != 0:
        raise InputError(f"{tableau} takes one scalar atol.")
    kind = choose_march(system, march, device, linear_solver)
    z0_t = torch.as_tensor(z0, dtype=torch.float64, device=device)
    t_t = torch.as_tensor(t_eval, dtype=torch.float64)
    if kind == "compiled":
        from ..rosenbrock.compiled import march_chain

        z, codes, stats = march_chain(system.chain_arrays(), z0_t, t_t, eps=eps, tableau=tab,
                                      rtol=rtol, atol=atol, max_steps=max_steps,
                                      dense_output=dense_output)  # fmt: skip
    else:
        field = system.torch_functions(torch.float64, device, eps)
        z, codes, stats = solve(
            field, z0_t, t_t, rtol=rtol, atol=atol, max_steps=max_steps,
            dense_output=dense_output, linear_solver=linear_solver, tableau=tab,
        )  # fmt: skip
    status = [STATUS[int(c)] for c in codes.cpu()]
    t_reached = stats.pop("t_reached").cpu().tolist()
    why = {
        "success": lambda t: "integration finished",
        "max_steps": lambda t: max_steps_message(tableau, int(max_steps), t),
        "step_underflow": lambda t: f"{tableau} stopped: step_underflow at t = {t:.6g} (its step "
        f"fell below ten float64 spacings of t, so the tolerances ask for more than float64 "
        f"resolves there; raise atol or rtol)",
        "non_finite": lambda t: f"{tableau} stopped: non_finite at t = {t:.6g} (the solution or "
        f"its error estimate became non-finite)",
    }
    message = [why[s](t) for s, t in zip(status, t_reached)]
    stats = {k: v.cpu().numpy() for k, v in stats.items() if k != "iterations"}
    return Solution(z.cpu().numpy(), status, message, stats, attrs={"march": kind})


_DESCRIPTIONS = {
    "rodas4": "batched RODAS4 (order 4, dense output), stiff, one step size per trajectory: "
    "torch on the CPU or CUDA, or the compiled CPU march for neighbour chains (march=)",
    "rodas3": "batched RODAS3 (order 3, no dense output), stiff, one step size per trajectory: "
    "torch on the CPU or CUDA, or the compiled CPU march for neighbour chains (march=)",
}


_PREPARED = set()  # the kinds of march whose kernels this process has loaded (`prepare`)


def _method(name):
    def solve_batch(*args, **kwargs):
        return solve_rosenbrock(*args, tableau=name, **kwargs)

    def prepare(system, z0, t_eval, rtol, atol, eps=None, **options):
        """One step of the first trajectory, as the solve would march it: numba loads the
        march's kernels from its cache (compiles them the first time) at their first call in a
        process, 2-3 s here against 0.01-0.1 s for the solve of the default batch. Once per
        process and kind of march (a step again costs 2-5 ms, as much as a small solve)."""
        device, solver = options.get("device", "cpu"), options.get("linear_solver", "auto")
        kind = (name, type(system).__name__, str(device), solver,
                choose_march(system, options.get("march", "auto"), device, solver))  # fmt: skip
        if kind in _PREPARED:
            return
        eps = None if eps is None else np.atleast_1d(eps)[:1]
        solve_rosenbrock(system, np.asarray(z0)[:1], np.asarray(t_eval)[:2], rtol, atol, eps=eps,
                         tableau=name, **{**options, "max_steps": 1})  # fmt: skip
        _PREPARED.add(kind)

    return Method(name, "torch", True, _DESCRIPTIONS.get(name, f"batched Rosenbrock {name}"),
                  solve_batch, options=("max_steps", "device", "dense_output", "linear_solver",
                                        "march"),
                  differentiable=True, needs_torch_form=True, atol_min=ATOL_ANY,
                  atol_why="it was tested down to 5e-324, the smallest positive float64",
                  prepare=prepare)  # fmt: skip


for _name in TABLEAUS:
    register(_method(_name))
