"""The interface between a system and the torch solvers: a batched vector field, batch last.

A system builds it (`MasterEquationSystem.torch_functions`); a solver calls only `fun`, `jac` and
reads `structure`, never the system's classes (DESIGN 5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["VectorField"]


@dataclass(frozen=True)
class VectorField:
    """`dz/dt = fun(z, idx)` for a batch stored batch last, `z (N, b)`: each component one
    contiguous row, the layout the solvers' eliminations and stage sums work in.

    `idx` (a long tensor, or `None` for the whole batch in order) names the trajectories whose
    columns `z` holds, for per-trajectory parameters. `jac(z, idx)` is `dfun/dz`: a dense
    `(b, N, N)` tensor, or a `linalg.ArrowTridiagonal` where `structure == "arrow"`; `None`
    means the solver takes it by automatic differentiation.
    """

    fun: Callable
    jac: Callable | None = None
    structure: str = "dense"  # "dense" or "arrow"

    @classmethod
    def from_batch_first(cls, fun, jac=None) -> VectorField:
        """From `fun(z (b, N), idx) -> (b, N)` and `jac(z (b, N), idx) -> (b, N, N)`."""

        def fun_bl(z, idx=None):
            return fun(z.T, idx).T

        jac_bl = None
        if jac is not None:

            def jac_bl(z, idx=None):
                return jac(z.T, idx)

        return cls(fun_bl, jac_bl, "dense")

    def batch_first(self):
        """`(fun, jac)` taking `z (b, N)`: `fun -> (b, N)`, `jac ->` as `self.jac`."""

        def fun(z, idx=None):
            return self.fun(z.T, idx).T

        def jac(z, idx=None):
            return self.jac(z.T, idx)

        return fun, (jac if self.jac is not None else None)


def autograd_jacobian(fun):
    """`jac(z (N, b), idx) -> (b, N, N)` of a batch-last `fun` by forward-mode automatic
    differentiation, the fallback when a field has no analytic Jacobian. The columns of a batch
    are independent, so one directional derivative along `e_j` for all of them at once gives
    column `j` of every trajectory's Jacobian; `torch.func.vmap` runs the `N` directions
    together."""
    import torch

    def jac(z, idx=None):
        N = z.shape[0]
        directions = torch.eye(N, dtype=z.dtype, device=z.device)[:, :, None].expand(N, *z.shape)

        def column(e):
            return torch.func.jvp(lambda w: fun(w, idx), (z,), (e,))[1]

        return torch.func.vmap(column)(directions).permute(2, 1, 0)  # (j, i, b) -> (b, i, j)

    return jac
