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
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .generators import (
    BirthDeath,
    Cycle,
    Generator,
    MichaelisMenten,
    RandomIrreducible,
    TwoState,
    readout_vector,
)
from .stationary import chain_stationary, stationary_derivative, stationary_distribution

__all__ = [
    "resolve_eps",
    "FastSlowSystem",
    "MasterEquationSystem",
    "LinearSlowLaw",
    "MichaelisMentenSlowLaw",
    "SlowLaw",
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
        check_P_exact(int(P))
        return 1.0 / P, int(P)
    if isinstance(eps, (bool, np.bool_)):  # True is no ratio (float(True) ran as eps = 1)
        raise InputError(f"eps must be a positive finite number; got eps={eps!r}.")
    try:
        e = float(eps)
    except (TypeError, ValueError):
        raise InputError(f"eps must be a positive finite number; got eps={eps!r}.") from None
    if not math.isfinite(e) or e <= 0:
        raise InputError(f"eps must be a positive finite number; got eps={eps!r}.")
    return e, _integer_inverse(e)


# Every P up to 2**51 comes back exactly from eps = 1/P in float64 (two roundings of relative
# size 2**-53, off by less than 1/2 while P < 2**52 / 2); above it only some do (the powers of
# two, for one; 8% of those drawn from 2**51 to 2**52 and almost none beyond 2**53 do not).
P_EXACT = 2**51


def check_P_exact(P: int) -> None:
    """`InputError` unless `eps = 1/P` in float64 gives `P` back (`_integer_inverse`): a
    system holds `eps` only, so another `P` would run (multirate's blocks) and be saved. A `P`
    beyond int64 is left to the methods' own bounds (eps >= 1e-12; multirate's 2**63 - 1)."""
    if P > 2**63 - 1:
        return
    eps = 1.0 / P
    back = _integer_inverse(eps)
    if back != P:
        raise InputError(
            f"P = {P} is not held exactly by eps = 1/P in float64 (1/P rounds to "
            f"{eps!r}, which gives back P = {back}); expected P at most 2**51 = "
            f"{P_EXACT:,}, or a larger one that comes back exactly, such as a power of two."
        )


def _integer_inverse(e: float) -> int | None:
    """The integer `P` with `1/P == e` in float64 (within 2 ulps of `e`: the round-off of a
    division or two), or `None`. A relative tolerance on `1/e` would call `eps = 1.5e-9`
    `1/666666667` (off by 5e-10 relative, a million times the round-off)."""
    inv = 1.0 / e
    if not math.isfinite(inv):  # eps below 1/DBL_MAX (5e-324): 1/eps overflows
        return None
    P = round(inv)
    if P < 1 or abs(1.0 / P - e) > 2 * math.ulp(e):
        return None
    return P


def _fd_jacobian(fun, v, h=1e-7):
    """Central-difference Jacobian of `fun` at `v` (last axis), shape `(..., out, in)`."""
    cols = []
    for k in range(v.shape[-1]):
        dv = np.zeros_like(v)
        step = h * max(1.0, float(np.max(np.abs(v[..., k]))))
        dv[..., k] = step
        cols.append((fun(v + dv) - fun(v - dv)) / (2 * step))
    return np.stack(cols, axis=-1)


def merged_params(generator: dict, slow_law: dict) -> dict:
    """A generator's parameters and its slow law's in one record; a law's name that the generator
    also uses is kept as `slow_law_NAME`, so that neither value replaces the other."""
    out = dict(generator)
    for key, value in slow_law.items():
        out[f"slow_law_{key}" if key in generator else key] = value
    return out


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
        # at least one fast and one slow variable: with none the finite-difference Jacobian
        # (and the split of z) has nothing to stack (n_slow = 0 ended in numpy's ValueError)
        for name in ("n_fast", "n_slow"):
            v = getattr(self, name)
            try:  # any integer type (numpy's, a 0-d array, a torch integer tensor), not a bool
                k = None if isinstance(v, (bool, np.bool_)) else operator.index(v)
            except TypeError:
                k = None
            if k is None or k < 1:
                raise InputError(f"{name} must be an integer >= 1 (the number of "
                                 f"{'fast' if name == 'n_fast' else 'slow'} variables); "
                                 f"got {name}={v!r}.")  # fmt: skip
            setattr(self, name, k)
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

    def has_torch_form(self) -> bool:
        """Whether `torch_functions` exists for this system (the torch solvers need it)."""
        return False

    def with_eps(self, eps=None, P=None):
        """A copy of this system with another `eps`, or `eps = 1/P`; give exactly one."""
        import copy

        other = copy.copy(self)
        other.eps = resolve_eps(eps, P)[0]
        return other


class SlowLaw:
    """Base class of the slow laws `g(x, y)` of master-equation systems (one slow variable): the
    numpy form `g(x, y)`, its blocks `dx`, `dy`, and the torch form for the torch solvers."""

    def torch_form(self, dtype, device):
        """`(g, g_xy)` in torch, batch last: `g(x (n, b), y (1, b)) -> (1, b)` and
        `g_xy(x, y) -> (dg/dx (n, b), dg/dy (b,))`; constants made once, here."""
        raise InputError(
            f"slow law {type(self).__name__} has no torch form; define torch_form(dtype, device) "
            f"beside its numpy form to use the torch solvers."
        )


@dataclass
class LinearSlowLaw(SlowLaw):
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
        # named apart from the generator's (two-state's rates are a and b too)
        return {"slow_law": "linear", "slow_law_c": [float(v) for v in self.c],
                "slow_law_a": self.a, "slow_law_b": self.b}  # fmt: skip

    def torch_form(self, dtype, device):
        import torch

        cT = torch.as_tensor(self.c, dtype=dtype, device=device)[None]  # (1, n)
        a, b = self.a, self.b
        plain = isinstance(a, (int, float)) and b == 0

        def g(x, y):
            if plain:  # c.x - a y in one operation
                return torch.addmm(y, cT, x, beta=-a)
            return cT @ x + b - a * y

        def g_xy(x, y):
            B = x.shape[1]
            return cT.T.expand(-1, B), torch.full((B,), -float(a), dtype=dtype, device=device)

        return g, g_xy


@dataclass
class MichaelisMentenSlowLaw(SlowLaw):
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

    def torch_form(self, dtype, device):
        import torch

        cT = torch.as_tensor(self.c, dtype=dtype, device=device)[None]  # (1, n)
        k1, km1 = self.generator.k1, self.generator.k_minus1

        def g(x, y):
            f = cT @ x
            return km1 * f - k1 * y * (1 - f)

        def g_xy(x, y):
            return (k1 * y + km1) * cT.T, -k1 * (1 - (cT @ x)[0])

        return g, g_xy


def _gives(gen: Generator, name: str, partner: str) -> bool:
    """Whether `gen`'s class has its own `name` (not `Generator`'s default) from the class whose
    `partner` it uses: a subclass that changes `partner` (its rates) without `name` (the same
    rates in another form) is not taken to give it."""
    owner = next((k for k in type(gen).__mro__ if name in vars(k)), Generator)
    return owner is not Generator and getattr(type(gen), partner) is getattr(owner, partner)


class MasterEquationSystem(FastSlowSystem):
    """`eps dx/dt = Q(y)^T x`, `dy/dt = g(x, y)`: total probability `1^T x` is conserved."""

    def __init__(self, generator: Generator, slow_law, eps, *, name=None, x0=None, y0=None):
        self.generator = generator
        self.slow_law = slow_law
        # (up, down) of y on a neighbour chain, for p_st and Q^T x in O(n); None otherwise
        self._neighbour = (generator.neighbour_rates
                           if _gives(generator, "neighbour_rates", "rates") else None)  # fmt: skip
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
            parameters=merged_params(generator.params(), slow_law.params()),
            x0=x0,
            y0=y0,
            conserves_mass=True,
        )

    def _f(self, x, y):
        """`Q(y)^T x`; on a neighbour chain in O(n) as the divergence of the net fluxes
        `J_i = up_i x_i - down_i x_{i+1}` (which telescope, so `1^T f = 0` to rounding)."""
        if self._neighbour is None:
            return np.einsum("...ji,...j->...i", self.generator.rates(y), x)
        up, down = self._neighbour(y)
        flux = up * x[..., :-1] - down * x[..., 1:]
        pad = np.zeros(flux.shape[:-1] + (1,))
        return np.concatenate([pad, flux], -1) - np.concatenate([flux, pad], -1)

    def _f_x(self, x, y):
        return np.swapaxes(self.generator.rates(y), -1, -2)

    def _f_y(self, x, y):
        dq = self.generator.rates_dy(y)  # (..., m, n, n)
        return np.einsum("...kji,...j->...ik", dq, x)

    def critical_manifold(self, y, method="gth"):
        """`h0(y) = p_st(Q(y))`: the equilibrium manifold of the fast master equation, which the
        fast dynamics reach from any start, so transient states (Michaelis-Menten at `y = 0`)
        are allowed and get no mass; several closed classes raise. GTH on a neighbour chain
        takes O(n) from its rates (`chain_stationary`, which refuses negative or non-finite
        ones in O(n), as the dense path's validation would after building the matrices);
        otherwise, and for the other methods, the generator's `(..., n, n)` matrices."""
        if self._neighbour is not None and method == "gth":
            return chain_stationary(*self._neighbour(y), allow_transient=True)
        return stationary_distribution(self.generator.rates(y), method, allow_transient=True)

    @property
    def chain_p_st(self) -> bool:
        """Whether `critical_manifold` (GTH) runs in O(n) per point, on a neighbour chain."""
        return self._neighbour is not None

    def critical_manifold_dy(self, y):
        """`dh0/dy = -Z (dQ/dy)^T p_st`, shape `(..., n, m)`; transient states allowed, as in
        `critical_manifold`."""
        p = self.critical_manifold(y)
        return stationary_derivative(self.generator.rates(y), self.generator.rates_dy(y), p)

    def has_torch_form(self) -> bool:
        gen, law = type(self.generator), type(self.slow_law)
        own_rates = (gen.chain_rates is not Generator.chain_rates
                     or gen.torch_off_diagonal is not Generator.torch_off_diagonal)  # fmt: skip
        return self.n_slow == 1 and own_rates and getattr(law, "torch_form", None) not in (
            None, SlowLaw.torch_form)  # fmt: skip

    def chain_arrays(self):
        """The physics as numbers for the compiled march (`rosenbrock.compiled`), or `None` where
        it has none (a generator that is not a neighbour chain with `chain_constants`, a slow law
        other than the linear and Michaelis-Menten ones). Keys: up rate `k_i e^{beta y} + l_i y`
        and down rate `down_i` of link `i <-> i+1`; the slow law `g = w.x + b - a y + kappa y
        (c.x)` (linear: `w = c`, `kappa = 0`; Michaelis-Menten: `w = k_minus1 c`, `a = kappa =
        k1`, `b = 0`); `inv_eps = 1/eps`."""
        gen, law = self.generator, self.slow_law
        # a subclass that changes the rates without their constants keeps the torch path
        if self.n_slow != 1 or not _gives(gen, "chain_constants", "chain_rates"):
            return None
        k, beta, lk, down = gen.chain_constants()
        n = self.n_fast
        if type(law) is LinearSlowLaw:
            c = np.asarray(law.c, dtype=np.float64)
            w, b, a, kappa = c, float(law.b), float(law.a), 0.0
        elif type(law) is MichaelisMentenSlowLaw and law.generator is gen:
            c = np.asarray(law.c, dtype=np.float64)
            k1 = float(gen.k1)
            w, b, a, kappa = float(gen.k_minus1) * c, 0.0, k1, k1
        else:
            return None
        if c.shape != (n,):
            return None
        return {"k": k, "beta": beta, "l": lk, "down": down, "w": w, "c": c, "b": b, "a": a,
                "kappa": kappa, "inv_eps": 1.0 / self.eps}  # fmt: skip

    def torch_functions(self, dtype=None, device="cpu", eps=None, structured=True):
        """The torch `VectorField` of `z = [x, y]`, batch last (`z (n+1, b)`).

        `fun = [Q(y)^T x / eps, g(x, y)]`; `jac = [[Q^T / eps, (dQ/dy)^T x / eps], [g_x, g_y]]`,
        analytic. For a neighbour chain (the generator has `chain_rates`) and `structured`, `jac`
        is an `ArrowTridiagonal` (`Q^T` is tridiagonal), factored in O(n) vector operations;
        otherwise a dense `(b, n+1, n+1)` tensor. `eps` may be a tensor `(B,)`, one time-scale
        ratio per trajectory. Built from the generator's and slow law's torch forms only.
        """
        import torch

        from .generators import chain_divergence
        from .linalg import ArrowTridiagonal, keep_one
        from .vector_field import VectorField

        dtype = dtype or torch.float64
        if self.n_slow != 1:
            raise InputError(
                f"the torch solvers take one slow variable; {self.name!r} has {self.n_slow}."
            )
        gen, n = self.generator, self.n_fast
        g, g_xy = self.slow_law.torch_form(dtype, device)
        inv_e = 1.0 / torch.as_tensor(self.eps if eps is None else eps, dtype=dtype, device=device)
        inv_e = inv_e.reshape(1, -1)  # (1, B) or (1, 1)

        def ratio(idx):
            return inv_e if (idx is None or inv_e.shape[1] == 1) else inv_e[:, idx]

        # one eps for the whole batch is folded into the chain's rate constants
        folded = inv_e.numel() == 1 and not inv_e.requires_grad
        chain = gen.chain_rates(dtype, device, batch_last=True,
                                scale=float(inv_e) if folded else None)  # fmt: skip

        def dense_jac(z, idx=None):
            r = ratio(idx).T[:, :, None]  # (b, 1, 1)
            x, y = z[:n].T, z[n:].T
            Q, dQ = gen.torch_rates(y, derivative=True)
            fy = torch.einsum("bji,bj->bi", dQ, x)  # d(Q^T x)/dy
            top = torch.cat([Q.transpose(1, 2), fy[:, :, None]], dim=-1) * r
            v, d = g_xy(z[:n], z[n:])
            return torch.cat([top, torch.cat([v.T, d[:, None]], dim=-1)[:, None, :]], dim=1)

        if chain is None:

            def fun(z, idx=None):
                x, y = z[:n], z[n:]
                dx = gen.torch_apply_transpose(y.T, x.T).T * ratio(idx)
                return torch.cat([dx, g(x, y)])

            return VectorField(fun, dense_jac, "dense")

        padded = {}  # a buffer (n+1, b) whose first and last rows stay zero, with its views

        def zero_ended(b):
            P = torch.zeros((n + 1, b), dtype=dtype, device=device)
            return P[1:n], P[1:], P[:-1]

        def fun(z, idx=None):
            x, y = z[:n], z[n:]
            up, down, _ = chain(y, derivative=False)
            if torch.is_grad_enabled() or torch.compiler.is_compiling():
                flux = torch.mul(up, x[:-1]).addcmul_(down, x[1:], value=-1)  # net i -> i+1
                if not folded:
                    flux = flux * ratio(idx)
                return torch.cat([chain_divergence(flux, batch_last=True), g(x, y)])
            # without autograd: the same into preallocated rows, no concatenation
            b = z.shape[1]
            # a buffer made in inference mode cannot be written outside it: one kept per mode
            kind = "inference" if torch.is_inference_mode_enabled() else "padded"
            inner, hi, lo = keep_one(padded, (kind, b), lambda: zero_ended(b))
            back = torch.mul(down, x[1:], out=inner).addcmul_(up, x[:-1], value=-1)  # i+1 -> i
            if not folded:
                back.mul_(ratio(idx))
            out = torch.empty_like(z)
            torch.sub(hi, lo, out=out[:n])  # dx_i/dt = flux_{i-1} - flux_i
            out[n:] = g(x, y)
            return out

        if not structured:
            return VectorField(fun, dense_jac, "dense")

        def jac(z, idx=None):
            x, y = z[:n], z[n:]
            up, down, dup = chain(y)
            up, down = up.expand(n - 1, -1), down.expand(n - 1, z.shape[1])
            if not folded:
                r = ratio(idx)  # (1, b)
                up, down, dup = up * r, down * r, dup * r
            v, d = g_xy(x, y)
            # T = Q^T / eps from the rates, u = d(Q^T x)/dy / eps from the flux's y-derivative
            return ArrowTridiagonal.master_equation(up, down, dup * x[:-1], v, d, chain_state=x)

        return VectorField(fun, jac, "arrow")


def _linear(gen, eps, y0=0.9):
    n = gen.n_states
    return MasterEquationSystem(gen, LinearSlowLaw(readout_vector(n)), eps, x0=np.eye(n)[0],
                                y0=np.array([y0]))  # fmt: skip


def _birth_death(eps, n=8):
    return _linear(BirthDeath(n=n, up=1.0, down=1.0, beta=4.0, y_mid=0.5), eps)


def _two_state(eps):
    return _linear(TwoState(a=1.0, b=1.0, beta=2.0), eps)


def _cycle(eps, n=6):
    return _linear(Cycle(n=n), eps)


def _random(eps, n=8):
    return _linear(RandomIrreducible(n=n, seed=0), eps)


def _michaelis_menten(eps, n=5):
    gen = MichaelisMenten(N=n - 1)
    return MasterEquationSystem(
        gen, MichaelisMentenSlowLaw(gen), eps, x0=np.eye(n)[0], y0=np.array([1.0])
    )


SYSTEMS: dict[str, tuple[Callable, str]] = {
    "birth-death": (_birth_death, "8-state birth-death, up rate exp(4(y-1/2)), g = c.x - y"),
    "two-state": (_two_state, "two states, rate 0->1 = exp(2y), 1->0 = 1, g = x_1 - y"),
    "cycle": (_cycle, "6-state non-reversible cycle, g = c.x - y"),
    "random": (_random, "seeded random irreducible 8-state family, g = c.x - y"),
    "michaelis-menten": (_michaelis_menten, "4 enzymes (5 states), substrate y, eps = E0/S0"),
}
MAX_STATES = 4096  # --states: beyond, a dense system's p_st (GTH, O(n^3) a point) grows long


def make_system(name: str = "birth-death", eps=None, P=None, states=None) -> MasterEquationSystem:
    """A named system (see `SYSTEMS`) with `eps = 1/P`; give exactly one of `eps`, `P`.
    `states` sets the number of states (all but `two-state`; `None`: the default above)."""
    if name not in SYSTEMS:
        raise InputError(f"unknown system {name!r}; expected one of {sorted(SYSTEMS)}.")
    e, _ = resolve_eps(eps, P)
    if states is None:
        return SYSTEMS[name][0](e)
    from .validation import number

    if name == "two-state":
        raise InputError("the two-state system has 2 states; drop --states or pick another system.")
    low = 3 if name == "cycle" else 2
    n = number("states", states, low, MAX_STATES, integer=True)
    return SYSTEMS[name][0](e, n)
