"""Fast-slow systems `eps dx/dt = f(x, y)`, `dy/dt = g(x, y)` with `eps = 1/P`.

- `FastSlowSystem`: the general form, with optional analytic Jacobians (finite differences
  otherwise).
- `MasterEquationSystem`: `f(x, y) = Q(y)^T x` for a generator family `Q(y)` (DESIGN 2), with
  the analytic Jacobian `df/dx = Q^T`, `df/dy_k = (dQ/dy_k)^T x` and the critical manifold
  `h0(y) = p_st(Q(y))`.
- `SYSTEMS`: the named systems of the CLI, `birth-death` the default.

Arrays carry leading batch dimensions: `x` is `(..., n)`, `y` is `(..., m)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .generators import BirthDeath, Cycle, Generator, MichaelisMenten, RandomIrreducible, TwoState
from .stationary import stationary_derivative, stationary_distribution

__all__ = [
    "resolve_eps",
    "FastSlowSystem",
    "MasterEquationSystem",
    "LinearSlowLaw",
    "MichaelisMentenSlowLaw",
    "make_system",
    "SYSTEMS",
]


def resolve_eps(eps=None, P=None) -> tuple[float, float | None]:
    """`(eps, P)` from exactly one of them; `eps = 1/P` (DESIGN 2). `P` is a positive integer.

    Returns `P = None` when `eps` is given and `1/eps` is not an integer.
    """
    if eps is not None and P is not None:
        raise InputError(f"give either eps or P, not both (got eps={eps}, P={P}).")
    if eps is None and P is None:
        raise InputError("give one of eps or P (eps = 1/P), for example eps=0.125 or P=8.")
    if P is not None:
        if isinstance(P, bool) or not isinstance(P, (int, np.integer)):
            if isinstance(P, (float, np.floating)) and float(P).is_integer():
                P = int(P)
            else:
                raise InputError(f"P must be a positive integer (P = 1/eps); got P={P!r}.")
        if P < 1:
            raise InputError(f"P must be a positive integer (P = 1/eps); got P={P}.")
        return 1.0 / P, int(P)
    try:
        e = float(eps)
    except (TypeError, ValueError):
        raise InputError(f"eps must be a positive finite number; got eps={eps!r}.") from None
    if not math.isfinite(e) or e <= 0:
        raise InputError(f"eps must be a positive finite number; got eps={eps!r}.")
    inv = 1.0 / e
    return e, (int(round(inv)) if abs(inv - round(inv)) < 1e-9 * inv else None)


def _fd_jacobian(fun, v, h=1e-7):
    """Central-difference Jacobian of `fun` at `v` (last axis), shape `(..., out, in)`."""
    cols = []
    for k in range(v.shape[-1]):
        dv = np.zeros_like(v)
        step = h * max(1.0, float(np.max(np.abs(v[..., k]))))
        dv[..., k] = step
        cols.append((fun(v + dv) - fun(v - dv)) / (2 * step))
    return np.stack(cols, axis=-1)


@dataclass
class FastSlowSystem:
    """`eps dx/dt = f(x, y)`, `dy/dt = g(x, y)`; `x` of size `n_fast`, `y` of size `n_slow`.

    `f_x, f_y, g_x, g_y` are the Jacobian blocks (shapes `(..., n, n)`, `(..., n, m)`,
    `(..., m, n)`, `(..., m, m)`); any that is `None` is taken by central differences.
    """

    f: Callable
    g: Callable
    n_fast: int
    n_slow: int
    eps: float
    f_x: Callable | None = None
    f_y: Callable | None = None
    g_x: Callable | None = None
    g_y: Callable | None = None
    name: str = "custom"
    parameters: dict = field(default_factory=dict)
    x0: np.ndarray | None = None
    y0: np.ndarray | None = None
    conserves_mass: bool = False

    def __post_init__(self):
        self.eps = resolve_eps(eps=self.eps)[0]

    @property
    def P(self):
        return resolve_eps(eps=self.eps)[1]

    def split(self, z):
        return z[..., : self.n_fast], z[..., self.n_fast :]

    def rhs(self, t, z):
        """Stacked right-hand side `dz/dt` for `z = [x, y]`."""
        x, y = self.split(np.asarray(z, dtype=np.float64))
        return np.concatenate([self.f(x, y) / self.eps, self.g(x, y)], axis=-1)

    def blocks(self, x, y):
        """Jacobian blocks `(f_x, f_y, g_x, g_y)` at `(x, y)`."""
        fx = self.f_x(x, y) if self.f_x else _fd_jacobian(lambda v: self.f(v, y), x)
        fy = self.f_y(x, y) if self.f_y else _fd_jacobian(lambda v: self.f(x, v), y)
        gx = self.g_x(x, y) if self.g_x else _fd_jacobian(lambda v: self.g(v, y), x)
        gy = self.g_y(x, y) if self.g_y else _fd_jacobian(lambda v: self.g(x, v), y)
        return fx, fy, gx, gy

    def jacobian(self, t, z):
        """Jacobian of `rhs`: `[[f_x/eps, f_y/eps], [g_x, g_y]]`, shape `(..., n+m, n+m)`."""
        x, y = self.split(np.asarray(z, dtype=np.float64))
        fx, fy, gx, gy = self.blocks(x, y)
        top = np.concatenate([fx, fy], axis=-1) / self.eps
        bottom = np.concatenate([gx, gy], axis=-1)
        return np.concatenate([top, bottom], axis=-2)

    def params(self) -> dict:
        return {"system": self.name, "eps": self.eps, **self.parameters}

    def with_eps(self, eps):
        """A copy of this system with another `eps`."""
        import copy

        other = copy.copy(self)
        other.eps = resolve_eps(eps=eps)[0]
        return other


@dataclass
class LinearSlowLaw:
    """`g(x, y) = c . x + b - a y` (one slow variable)."""

    c: np.ndarray
    a: float = 1.0
    b: float = 0.0

    def __call__(self, x, y):
        return (x @ self.c + self.b)[..., None] - self.a * y

    def dx(self, x, y):
        return np.broadcast_to(self.c, x.shape[:-1] + (1, len(self.c))).copy()

    def dy(self, x, y):
        return np.full(y.shape[:-1] + (1, 1), -self.a)

    def params(self):
        return {"slow_law": "linear", "c": [float(v) for v in self.c], "a": self.a, "b": self.b}


@dataclass
class MichaelisMentenSlowLaw:
    """Substrate `y` per enzyme: `dy/dt = -k1 y (1 - f) + k_minus1 f`, `f = c . x` bound fraction.

    With `eps = E0/S0` this is the classical scaling of `dS/dt = -k1 E S + k_minus1 C` in which
    the complex relaxes on the fast time `eps`.
    """

    generator: MichaelisMenten

    @property
    def c(self):
        return np.arange(self.generator.n_states) / self.generator.N

    def __call__(self, x, y):
        f = (x @ self.c)[..., None]
        return -self.generator.k1 * y * (1.0 - f) + self.generator.k_minus1 * f

    def dx(self, x, y):
        coef = self.generator.k1 * y + self.generator.k_minus1  # (..., 1)
        return coef[..., None] * self.c

    def dy(self, x, y):
        f = (x @ self.c)[..., None]
        return (-self.generator.k1 * (1.0 - f))[..., None]

    def params(self):
        return {"slow_law": "michaelis-menten"}


class MasterEquationSystem(FastSlowSystem):
    """`eps dx/dt = Q(y)^T x`, `dy/dt = g(x, y)`: total probability `1^T x` is conserved."""

    def __init__(self, generator: Generator, slow_law, eps, *, name=None, x0=None, y0=None):
        self.generator = generator
        self.slow_law = slow_law
        n, m = generator.n_states, generator.n_slow
        super().__init__(
            f=self._f,
            g=slow_law,
            n_fast=n,
            n_slow=m,
            eps=eps,
            f_x=self._f_x,
            f_y=self._f_y,
            g_x=slow_law.dx,
            g_y=slow_law.dy,
            name=name or generator.name,
            parameters={**generator.params(), **slow_law.params()},
            x0=x0,
            y0=y0,
            conserves_mass=True,
        )

    def _f(self, x, y):
        return np.einsum("...ji,...j->...i", self.generator.rates(y), x)

    def _f_x(self, x, y):
        return np.swapaxes(self.generator.rates(y), -1, -2)

    def _f_y(self, x, y):
        dq = self.generator.rates_dy(y)  # (..., m, n, n)
        return np.einsum("...kji,...j->...ik", dq, x)

    def critical_manifold(self, y, method="gth"):
        """`h0(y) = p_st(Q(y))`: the equilibrium manifold of the fast master equation."""
        return stationary_distribution(self.generator.rates(y), method)

    def critical_manifold_dy(self, y):
        """`dh0/dy = -Z (dQ/dy)^T p_st`, shape `(..., n, m)`."""
        return stationary_derivative(self.generator.rates(y), self.generator.rates_dy(y))


def _linear_c(n):
    return np.arange(n) / (n - 1)


def _birth_death(eps):
    gen = BirthDeath(n=8, up=1.0, down=1.0, beta=4.0, y_mid=0.5)
    return MasterEquationSystem(
        gen, LinearSlowLaw(_linear_c(8)), eps, x0=np.eye(8)[0], y0=np.array([0.9])
    )


def _two_state(eps):
    gen = TwoState(a=1.0, b=1.0, beta=2.0)
    return MasterEquationSystem(
        gen, LinearSlowLaw(np.array([0.0, 1.0])), eps, x0=np.eye(2)[0], y0=np.array([0.9])
    )


def _cycle(eps):
    gen = Cycle(n=6)
    return MasterEquationSystem(
        gen, LinearSlowLaw(_linear_c(6)), eps, x0=np.eye(6)[0], y0=np.array([0.9])
    )


def _random(eps):
    gen = RandomIrreducible(n=8, seed=0)
    return MasterEquationSystem(
        gen, LinearSlowLaw(_linear_c(8)), eps, x0=np.eye(8)[0], y0=np.array([0.9])
    )


def _michaelis_menten(eps):
    gen = MichaelisMenten(N=4)
    return MasterEquationSystem(
        gen, MichaelisMentenSlowLaw(gen), eps, x0=np.eye(5)[0], y0=np.array([1.0])
    )


SYSTEMS: dict[str, tuple[Callable, str]] = {
    "birth-death": (_birth_death, "8-state birth-death, up rate exp(4(y-1/2)), g = c.x - y"),
    "two-state": (_two_state, "two states, rate 0->1 = exp(2y), 1->0 = 1, g = x_1 - y"),
    "cycle": (_cycle, "6-state non-reversible cycle, g = c.x - y"),
    "random": (_random, "seeded random irreducible 8-state family, g = c.x - y"),
    "michaelis-menten": (_michaelis_menten, "4 enzymes, substrate y, eps = E0/S0"),
}


def make_system(name: str = "birth-death", eps=None, P=None) -> MasterEquationSystem:
    """A named system (see `SYSTEMS`) with `eps = 1/P`; give exactly one of `eps`, `P`."""
    if name not in SYSTEMS:
        raise InputError(f"unknown system {name!r}; expected one of {sorted(SYSTEMS)}.")
    e, _ = resolve_eps(eps, P)
    return SYSTEMS[name][0](e)
