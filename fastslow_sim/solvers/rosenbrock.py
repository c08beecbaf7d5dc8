"""The batched RODAS4 march (`fastslow_sim.rosenbrock`) as the `rodas4` method: in torch (CPU or
CUDA), or compiled (`rosenbrock.compiled`, the whole per-trajectory march in numba) on the CPU
for systems that give their physics as numbers (`chain_arrays`)."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from . import Method, Solution, register

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


def solve_rodas4(system, z0, t_eval, rtol, atol, eps=None, max_steps=1_000_000, device="cpu",
                 dense_output=True, linear_solver="auto", march="auto"):  # fmt: skip
    """One batch `z0 (B, N)` (and one `eps` per trajectory, if given) in one march."""
    import torch

    from ..rosenbrock import STATUS, solve

    if np.ndim(atol) != 0:
        raise InputError("rodas4 takes one scalar atol.")
    kind = choose_march(system, march, device, linear_solver)
    z0_t = torch.as_tensor(z0, dtype=torch.float64, device=device)
    t_t = torch.as_tensor(t_eval, dtype=torch.float64)
    if kind == "compiled":
        from ..rosenbrock.compiled import march_chain

        z, codes, stats = march_chain(system.chain_arrays(), z0_t, t_t, eps=eps, rtol=rtol,
                                      atol=atol, max_steps=max_steps,
                                      dense_output=dense_output)  # fmt: skip
    else:
        field = system.torch_functions(torch.float64, device, eps)
        z, codes, stats = solve(
            field, z0_t, t_t, rtol=rtol, atol=atol, max_steps=max_steps,
            dense_output=dense_output, linear_solver=linear_solver,
        )  # fmt: skip
    status = [STATUS[int(c)] for c in codes.cpu()]
    message = ["integration finished" if s == "success" else f"rodas4 stopped: {s}" for s in status]
    stats = {k: v.cpu().numpy() for k, v in stats.items() if k != "iterations"}
    return Solution(z.cpu().numpy(), status, message, stats, attrs={"march": kind})


register(Method(
    "rodas4", "torch", True,
    "batched RODAS4, stiff, one step size per trajectory: torch on the CPU or CUDA, or the "
    "compiled CPU march for neighbour chains (march='auto'|'torch'|'compiled')",
    solve_rodas4, options=("max_steps", "device", "dense_output", "linear_solver", "march"),
    differentiable=True, needs_torch_form=True,
))  # fmt: skip
