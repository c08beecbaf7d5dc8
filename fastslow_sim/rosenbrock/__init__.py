"""A batched adaptive stiff solver in torch: Rosenbrock methods (RODAS4) with one step size per
trajectory.

Why Rosenbrock: no Newton iteration, only one factorisation of `I/(h gamma) - J` per step and
one linear solve per stage, which batch well on CPUs and GPUs. RODAS4 (Hairer and Wanner, Solving
ODEs II, 1996, section IV.7) is L-stable and stiffly accurate, of order 4 with an embedded order-3
error estimate, so it takes large steps on the slow manifold of a stiff fast-slow system and does
not ring in the initial layer.

Parts: `tableau` (the coefficients; a new method is a new table), `step` (one step of any
tableau), `control` (error norm and step-size rules), `dense` (continuous extension), `march`
(the batched solve, `solve`); the linear solver is a parameter (`linalg.LINEAR_SOLVERS`).
`compiled` (`compiled.march_chain`, imported on demand: it needs numba) runs the same march,
from the same tableau and control, as one numba function per block of trajectories, for the
neighbour-chain systems that give their physics as numbers (`chain_arrays`); `integrate(...,
method="rodas4", march="auto"|"torch"|"compiled")` chooses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .tableau import RODAS3, RODAS4, TABLEAUS, RosenbrockTableau

if TYPE_CHECKING:
    from ..vector_field import VectorField, autograd_jacobian
    from .control import StepControl
    from .march import STATUS, rodas4_solve, solve

# the parts that need torch are imported on first use, so that the tableaus (and the registry of
# methods, which lists them) load without torch
_LAZY = {"StepControl": ".control", "STATUS": ".march", "rodas4_solve": ".march",
         "solve": ".march", "VectorField": "..vector_field",
         "autograd_jacobian": "..vector_field"}  # fmt: skip

__all__ = [
    "solve",
    "rodas4_solve",
    "STATUS",
    "RODAS4",
    "RODAS3",
    "TABLEAUS",
    "RosenbrockTableau",
    "StepControl",
    "VectorField",
    "autograd_jacobian",
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
