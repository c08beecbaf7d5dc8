"""The batched torch Rosenbrock march (`fastslow_sim.rosenbrock`): one method per tableau of
`rosenbrock.TABLEAUS` (`rodas4`, `rodas3`), so a new table is a new method."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..rosenbrock.tableau import TABLEAUS
from . import Method, Solution, register


def solve_rosenbrock(system, z0, t_eval, rtol, atol, eps=None, max_steps=1_000_000, device="cpu",
                     dense_output=None, linear_solver="auto", tableau="rodas4"):  # fmt: skip
    """One batch `z0 (B, N)` (and one `eps` per trajectory, if given) in one march; output times
    from the tableau's continuous extension where it has one (`dense_output=None`)."""
    import torch

    from ..rosenbrock import STATUS, solve

    tab = TABLEAUS[tableau]
    dense_output = bool(tab.D) if dense_output is None else dense_output

    if np.ndim(atol) != 0:
        raise InputError("rodas4 takes one scalar atol.")
    field = system.torch_functions(torch.float64, device, eps)
    z, codes, stats = solve(
        field, torch.as_tensor(z0, dtype=torch.float64, device=device),
        torch.as_tensor(t_eval, dtype=torch.float64), rtol=rtol, atol=atol,
        max_steps=max_steps, dense_output=dense_output, linear_solver=linear_solver, tableau=tab,
    )  # fmt: skip
    status = [STATUS[int(c)] for c in codes.cpu()]
    message = ["integration finished" if s == "success" else f"{tableau} stopped: {s}"
               for s in status]  # fmt: skip
    stats = {k: v.cpu().numpy() for k, v in stats.items() if k != "iterations"}
    return Solution(z.cpu().numpy(), status, message, stats)


_DESCRIPTIONS = {
    "rodas4": "batched torch RODAS4 (order 4, dense output), stiff, one step size per trajectory, "
    "CPU or CUDA",
    "rodas3": "batched torch RODAS3 (order 3, no dense output), stiff, one step size per "
    "trajectory, CPU or CUDA",
}


def _method(name):
    def solve_batch(*args, **kwargs):
        return solve_rosenbrock(*args, tableau=name, **kwargs)

    return Method(name, "torch", True, _DESCRIPTIONS.get(name, f"batched torch Rosenbrock {name}"),
                  solve_batch, options=("max_steps", "device", "dense_output", "linear_solver"),
                  differentiable=True, needs_torch_form=True)  # fmt: skip


for _name in TABLEAUS:
    register(_method(_name))
