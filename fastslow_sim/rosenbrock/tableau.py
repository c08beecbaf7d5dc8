"""Rosenbrock tableaus in the (A, C, M, E, gamma) form of Sandu et al.'s KPP integrators.

A step of `s` stages solves `(I/(h gamma) - J) k_i = f(y + sum_j A_ij k_j) + sum_j C_ij k_j / h`
and takes `y_new = y + sum_i M_i k_i`, with the error estimate `sum_i E_i k_i`. A new method is a
new table here; the step, the step-size control and the march are shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

__all__ = ["RosenbrockTableau", "RODAS4", "RODAS3", "TABLEAUS"]


@dataclass(frozen=True)
class RosenbrockTableau:
    name: str
    gamma: float
    A: tuple  # strictly lower triangular, A[i][j] for j < i
    C: tuple
    M: tuple
    E: tuple
    order: float  # the error estimator's local order (the step-size exponent is -1/order)
    D: tuple = ()  # dense output: y(t0 + s h) = (1-s) y0 + s (y1 + (1-s) (D0.k + s D1.k))

    @property
    def stages(self) -> int:
        return len(self.M)

    def stability_function(self, z, embedded: bool = False):
        """`R(z)`: one step on `y' = lambda y` from `y = 1` with `z = h lambda` (exact Jacobian),
        `(1/gamma - z) k_i = z (1 + sum_j A_ij k_j) + sum_j C_ij k_j`, `R = 1 + M.k` (the embedded
        solution `R - E.k` with `embedded`). Order `p` means `R(z) - e^z = O(z^(p+1))`."""
        import numpy as np

        z = np.asarray(z, dtype=np.complex128)
        k = []
        for i in range(self.stages):
            a = sum(self.A[i][j] * k[j] for j in range(i))
            c = sum(self.C[i][j] * k[j] for j in range(i))
            k.append((z * (1 + a) + c) / (1 / self.gamma - z))
        R = 1 + sum(m * kj for m, kj in zip(self.M, k))
        return R - sum(e * kj for e, kj in zip(self.E, k)) if embedded else R

    @cached_property
    def from_previous(self) -> tuple:
        """Per stage `i`, whether `y + sum_j A_ij k_j` is `y_{i-1} + k_{i-1}` (row `i` is row
        `i-1` plus `e_{i-1}`: RODAS4's last two stages), one addition instead of a sum."""
        rows = [False]
        for i in range(1, len(self.A)):
            prev = self.A[i - 1]
            rows.append(i > 1 and tuple(self.A[i][: i - 1]) == tuple(prev) and self.A[i][i - 1] == 1.0)
        return tuple(rows)

    @cached_property
    def stiffly_accurate(self) -> bool:
        """`M = A_{s-1} + e_{s-1}`, so that `y_new = y_s + k_s`."""
        return tuple(self.M[:-1]) == tuple(self.A[-1]) and self.M[-1] == 1.0

    @cached_property
    def plain_error(self) -> bool:
        """The error estimate is the last stage alone, `E = e_{s-1}`."""
        return tuple(self.E) == (0.0,) * (self.stages - 1) + (1.0,)


def _lower(vals, s):
    """The strictly lower triangle of an `s x s` table from its entries row by row."""
    out, k = [], 0
    for i in range(s):
        out.append(tuple(vals[k : k + i]))
        k += i
    return tuple(out)


# Hairer and Wanner, Solving ODEs II (1996), section IV.7: L-stable, stiffly accurate, order 4 with
# an embedded order-3 estimate
RODAS4 = RosenbrockTableau(
    name="rodas4",
    gamma=0.25,
    A=_lower((1.544, 0.9466785280815826, 0.2557011698983284, 3.314825187068521, 2.896124015972201,
              0.9986419139977817, 1.221224509226641, 6.019134481288629, 12.53708332932087,
              -0.687886036105895, 1.221224509226641, 6.019134481288629, 12.53708332932087,
              -0.687886036105895, 1.0), 6),  # fmt: skip
    C=_lower((-5.6688, -2.430093356833875, -0.2063599157091915, -0.1073529058151375,
              -9.594562251023355, -20.47028614809616, 7.496443313967647, -10.24680431464352,
              -33.99990352819905, 11.7089089320616, 8.083246795921522, -7.981132988064893,
              -31.52159432874371, 16.31930543123136, -6.058818238834054), 6),  # fmt: skip
    M=(1.221224509226641, 6.019134481288629, 12.53708332932087, -0.687886036105895, 1.0, 1.0),
    E=(0.0, 0.0, 0.0, 0.0, 0.0, 1.0),
    order=4.0,
    # Hairer's continuous extension of order 3 (rodas.f, METH = 1: D21..D25, D31..D35)
    D=(
        (10.12623508344586, -7.487995877610167, -34.80091861555747, -7.992771707568823,
         1.025137723295662, 0.0),
        (-0.6762803392801253, 6.087714651680015, 16.43084320892478, 24.76722511418386,
         -6.594389125716872, 0.0),
    ),  # fmt: skip
)

# Sandu et al. (1997), as in KPP's Rodas3: L-stable, stiffly accurate, order 3 with an embedded
# order-2 estimate, 4 stages; no continuous extension (output times are landed on)
RODAS3 = RosenbrockTableau(
    name="rodas3",
    gamma=0.5,
    A=_lower((0.0, 2.0, 0.0, 2.0, 0.0, 1.0), 4),
    C=_lower((4.0, 1.0, -1.0, 1.0, -1.0, -8.0 / 3.0), 4),
    M=(2.0, 0.0, 1.0, 1.0),
    E=(0.0, 0.0, 0.0, 1.0),
    order=3.0,
)

TABLEAUS = {"rodas4": RODAS4, "rodas3": RODAS3}
