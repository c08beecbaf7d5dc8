"""The batched torch Rosenbrock march (`fastslow_sim.rosenbrock`) as the `rodas4` method."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from . import Method, Solution, register


def solve_rodas4(system, z0, t_eval, rtol, atol, eps=None, max_steps=1_000_000, device="cpu",
                 dense_output=True, linear_solver="auto"):  # fmt: skip
    """One batch `z0 (B, N)` (and one `eps` per trajectory, if given) in one march."""
    import torch

    from ..rosenbrock import STATUS, solve

    if np.ndim(atol) != 0:
        raise InputError("rodas4 takes one scalar atol.")
    field = system.torch_functions(torch.float64, device, eps)
    z, codes, stats = solve(
        field, torch.as_tensor(z0, dtype=torch.float64, device=device),
        torch.as_tensor(t_eval, dtype=torch.float64), rtol=rtol, atol=atol,
        max_steps=max_steps, dense_output=dense_output, linear_solver=linear_solver,
    )  # fmt: skip
    status = [STATUS[int(c)] for c in codes.cpu()]
    message = ["integration finished" if s == "success" else f"rodas4 stopped: {s}" for s in status]
    stats = {k: v.cpu().numpy() for k, v in stats.items() if k != "iterations"}
    return Solution(z.cpu().numpy(), status, message, stats)


register(Method(
    "rodas4", "torch", True,
    "batched torch RODAS4, stiff, one step size per trajectory, CPU or CUDA",
    solve_rodas4, options=("max_steps", "device", "dense_output", "linear_solver"),
    differentiable=True, needs_torch_form=True,
))  # fmt: skip
