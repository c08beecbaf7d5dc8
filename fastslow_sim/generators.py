"""Master-equation generators `Q(y)`, batched over the slow variable.

Convention (DESIGN 2): `Q[..., i, j] >= 0` is the rate of jumping from state `i` to state `j`
(`i != j`) and `Q[..., i, i] = -sum_{j != i} Q[..., i, j]`, so every row sums to zero. The fast
master equation is `eps dx/dt = Q(y)^T x`.

Every generator is a small object with
- `rates(y)`: `Q` of shape `(..., n, n)` for `y` of shape `(..., m)` (a scalar `y` is `m = 1`);
- `rates_dy(y)`: `dQ/dy` of shape `(..., m, n, n)`, analytic, used for the Jacobian and `dp/dy`;
- `closed_form(y)`: the exact `p_st(y)` of shape `(..., n)` where one exists (else `None`);
- `params()`: a JSON-able dict, saved with every result.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import InputError
from .validation import first_non_finite, number

__all__ = [
    "Generator",
    "TwoState",
    "BirthDeath",
    "Cycle",
    "RandomIrreducible",
    "MichaelisMenten",
    "random_generators",
    "validate_generator",
    "from_off_diagonal",
    "readout_vector",
    "rate_domain",
    "domain_text",
]

_MAX = float(np.finfo(np.float64).max)
_TINY = float(np.finfo(np.float64).tiny)


def from_off_diagonal(rates: np.ndarray) -> np.ndarray:
    """Generator from off-diagonal rates: zero the diagonal, then set `Q_ii = -sum_{j != i} Q_ij`."""
    q = np.array(rates, dtype=np.float64, copy=True)
    n = q.shape[-1]
    idx = np.arange(n)
    q[..., idx, idx] = 0.0
    q[..., idx, idx] = -q.sum(axis=-1)
    return q


def _neighbour_generator(up, down) -> np.ndarray:
    """The generator `(..., n, n)` of a neighbour chain from its rates `(..., n-1)`: `Q_{i,i+1}
    = up_i`, `Q_{i+1,i} = down_i`, the diagonal minus the row sums."""
    up, down = np.broadcast_arrays(up, down)
    n = up.shape[-1] + 1
    i = np.arange(n - 1)
    q = np.zeros(up.shape[:-1] + (n, n))
    q[..., i, i + 1] = up
    q[..., i + 1, i] = down
    return from_off_diagonal(q)


def _constant(label: str, value, lo=None, hi=None, *, lo_open: bool = False):
    """`InputError` (one sentence naming `label`, the value and the range) unless `value` is a
    finite number `>= lo` (`> lo` with `lo_open`) and `<= hi` (`None`: no bound) (`number`'s
    test, which also reads a numpy scalar or a 0-d tensor (a rate being differentiated), but
    neither text nor a bool, which a generator's arithmetic would not take as a rate. The value
    itself is kept, so that a tensor stays a tensor."""
    try:
        if isinstance(value, (str, bytes, bool, np.bool_)):
            raise InputError(label)
        probe = value.detach() if hasattr(value, "detach") else value  # float() warns on grad
        number(label, probe, lo, hi, lo_open=lo_open)
    except InputError:
        bounds = [] if lo is None else [f"{'>' if lo_open else '>='} {lo:g}"]
        bounds += [] if hi is None else [f"<= {hi:g}"]
        bound = " " + " and ".join(bounds) if bounds else ""
        raise InputError(f"{label} must be a finite number{bound}; got {value!r}.") from None
    return value


def validate_generator(Q, *, atol: float | None = None, name: str = "Q") -> None:
    """Raise `InputError` (one sentence) unless `Q` is a batch of valid generators.

    Checks: at least 2-D and square in its last two axes, finite, off-diagonal rates `>= 0`, and
    every row summing to zero within `atol * (1 + |Q_ii|)`; `atol` (a finite number `>= 0`)
    defaults to `max(1e-10, 100 * machine epsilon of Q's dtype)`.
    """
    if atol is not None:  # a negative one refused every row, NaN none
        atol = float(_constant("atol", atol, 0.0))
    is_torch = type(Q).__module__.startswith("torch")
    q = Q.detach().cpu().numpy() if is_torch else np.asarray(Q)
    if q.ndim < 2 or q.shape[-1] != q.shape[-2]:
        raise InputError(
            f"{name} must be a square matrix (or a batch of them) of shape (..., n, n); "
            f"got shape {tuple(q.shape)}."
        )
    if q.shape[-1] < 1:
        raise InputError(f"{name} must have at least one state; got shape {tuple(q.shape)}.")
    if not np.issubdtype(q.dtype, np.number) or np.iscomplexobj(q):
        raise InputError(f"{name} must hold real numbers; got dtype {q.dtype}.")
    # Fast screens first (one pass each); the detailed, slower search only runs on failure.
    with np.errstate(all="ignore"):  # inf - inf in the screen's sum: the search below names it
        finite_sum = np.isfinite(q.sum())
    if not finite_sum:
        first_non_finite(q, name)
    n = q.shape[-1]
    diag = np.diagonal(q, axis1=-2, axis2=-1)
    if np.count_nonzero(q < 0) != np.count_nonzero(diag < 0):
        neg = (q < 0) & ~np.eye(n, dtype=bool)
        bad = np.argwhere(neg)[0]
        raise InputError(
            f"{name} must have non-negative off-diagonal rates; entry {tuple(int(i) for i in bad)} "
            f"is {q[tuple(bad)]:.6g}."
        )
    if atol is None:
        atol = max(1e-10, 100 * float(np.finfo(q.dtype).eps)) if q.dtype.kind == "f" else 1e-10
    rowsum = q @ np.ones(n)
    # for a valid row, |Q_ii| is its largest entry: the scale of its round-off
    badrow = np.abs(rowsum) > atol * (1.0 + np.abs(diag))
    if np.any(badrow):
        bad = np.argwhere(badrow)[0]
        raise InputError(
            f"{name} rows must sum to zero (Q_ii = -sum of the row's rates); row "
            f"{tuple(int(i) for i in bad)} sums to {rowsum[tuple(bad)]:.6g}."
        )


def _as_slow(y, m: int = 1) -> np.ndarray:
    """`y` as a float64 array of shape `(..., m)`; a scalar or `(...,)` array is taken as `m = 1`."""
    y_in = y
    try:
        y = np.asarray(y)
        if y.dtype.kind == "c":  # numpy would drop the imaginary part with a warning
            raise TypeError
        y = y.astype(np.float64, copy=False)
    except (TypeError, ValueError):
        raise InputError(
            f"y (the slow variable) must be a real number or an array of them; got {y_in!r}."
        ) from None
    if m == 1 and (y.ndim == 0 or y.shape[-1] != 1):
        y = y[..., None]
    if y.shape[-1] != m:
        raise InputError(
            f"y must have {m} slow component(s) in its last axis; got shape {y.shape}."
        )
    return y


class Generator:
    """Base class: a family of generators `Q(y)` on `n_states` states and `n_slow` slow variables."""

    name: str = "generator"
    n_slow: int = 1
    # what holds on `domain()`, for the sentences that refuse a y outside it (`domain_text`)
    domain_reason: str = "its rates and their Jacobian are finite"

    @property
    def n_states(self) -> int:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def rates(self, y) -> np.ndarray:
        raise NotImplementedError

    def rates_dy(self, y) -> np.ndarray:
        raise NotImplementedError

    def closed_form(self, y) -> np.ndarray | None:
        return None

    def domain(self) -> tuple[float, float]:
        """Interval `(lo, hi)` of `y` on which the rates are valid and they, `rates_dy` and the
        Jacobians built from them (sums of `n` rates, each times its `y`-derivative's factor)
        are finite. The base class: the real line; a generator whose rates overflow, or are
        invalid, somewhere says where (the built-ins: see each one's `domain`)."""
        return (-math.inf, math.inf)

    def _rate_domain(self, scale, slope, center=0.0) -> tuple[float, float]:
        """`rate_domain` of the rates `scale_j exp(slope_j (y - center))` (the positive ones
        only) with the room `n (|slope_j| + 1)`, the factor `exp(slope_j (y - center))` finite
        too (the rates are computed as `scale_j` times it); `InputError` where no `y` is left."""
        scale, slope = np.broadcast_arrays(np.asarray(scale, float), np.asarray(slope, float))
        keep = scale > 0
        b = slope[keep]
        log_scale = np.log(scale[keep])
        with np.errstate(over="ignore"):
            room = self.n_states * (np.abs(b) + 1.0)
        # a room beyond float64 (|slope| near its largest number) moves its factor |b| into the
        # rate's log scale: the same bound, n (1 + 1/|b|) |b| r <= M, in finite numbers (the
        # other rooms are left as they were, bit for bit)
        big = np.isinf(room)
        room[big] = self.n_states * (1.0 + 1.0 / np.abs(b[big]))
        log_scale[big] += np.log(np.abs(b[big]))
        ends = rate_domain(np.append(log_scale, 0.0 * b), np.append(b, b),
                           np.append(room, np.ones_like(b)), center)  # fmt: skip
        if ends is None:
            raise InputError(
                f"the {self.name} generator's rate constants leave no y where its rates and "
                f"their Jacobian are finite; got {self.params()}."
            )
        return ends

    def params(self) -> dict:
        d = asdict(self) if hasattr(self, "__dataclass_fields__") else {}
        d.pop("name", None)
        return {"generator": self.name, **d}

    def neighbour_rates(self, y):
        """For a chain that jumps between neighbours only, `i <-> i+1`: `(up, down)`, numpy
        `(..., n-1)` each for `y (..., m)`, the rates `i -> i+1` and `i+1 -> i` (`rates(y)` is
        built from them, and `p_st` takes O(n) from them, `stationary.chain_stationary`). `None`
        (the default) for any other generator."""
        return None

    # torch forms, beside the numpy ones: batched over `y (B, 1)` and differentiable in parameters
    # that are tensors; the torch solvers (rodas4, torchdiffeq) use only these.

    def chain_rates(self, dtype=None, device="cpu", batch_last=False, scale=None):
        """For a chain that jumps between neighbours only, `i <-> i+1`: a function
        `rates(y, derivative=True) -> (up, down, dup)`, the rates `i -> i+1`, `i+1 -> i` and
        `d up/dy` (`None` without `derivative`), each broadcastable to `(B, n-1)` for `y (B, 1)`
        or, `batch_last`, to `(n-1, B)` for `y (1, B)`; a float `scale` (such as `1/eps`)
        multiplies every rate. `None` (the default) for any other generator."""
        return None

    def torch_off_diagonal(self, y):
        """The off-diagonal rates `Q_ij(y)` and `dQ_ij/dy` in torch, `(B, n, n)` each (diagonals
        zero), for `y (B, 1)`. Defined from `chain_rates` for the neighbour chains; any other
        generator defines it beside its numpy `rates`."""
        import torch

        chain = self.chain_rates(y.dtype, y.device)
        if chain is None:
            raise InputError(
                f"generator {self.name!r} has no torch form; define torch_off_diagonal(y) "
                f"beside its rates(y) to use the torch solvers."
            )
        B, n = y.shape[0], self.n_states
        up, down, dup = (r.expand(B, n - 1) for r in chain(y[..., :1]))
        off = torch.diag_embed(up, offset=1) + torch.diag_embed(down, offset=-1)
        return off, torch.diag_embed(dup, offset=1)

    def torch_rates(self, y, derivative: bool = False):
        """`Q(y)` in torch, `(B, n, n)` for `y (B, 1)`; with `derivative`, also `dQ/dy`."""
        off, doff = self.torch_off_diagonal(y)
        Q = _t_generator(off)
        return (Q, _t_generator(doff)) if derivative else Q

    def torch_apply_transpose(self, y, x):
        """`Q(y)^T x` in torch, `(B, n)`: O(n) for the neighbour chains (the net probability flux
        `up_i x_i - down_i x_{i+1}` between `i` and `i+1`), dense otherwise."""
        import torch

        chain = self.chain_rates(x.dtype, x.device)
        if chain is None:
            return torch.einsum("bji,bj->bi", self.torch_rates(y), x)
        up, down, _ = chain(y[:, :1], derivative=False)
        return chain_divergence(up * x[:, :-1] - down * x[:, 1:])


@dataclass
class TwoState(Generator):
    """Two states: rate 0->1 is `a exp(beta y)`, rate 1->0 is `b`.

    `p_st(y) = (b, a e^{beta y}) / (b + a e^{beta y})`.
    """

    a: float = 1.0
    b: float = 1.0
    beta: float = 1.0
    name: str = field(default="two-state", init=False, repr=False)

    def __post_init__(self):
        # one zero rate leaves one absorbing state and one transient (a single closed class,
        # which the stationary solvers take); both zero, two closed classes; negative, no generator
        _constant("the two-state generator's rate a", self.a, 0.0)
        _constant("the two-state generator's rate b", self.b, 0.0)
        _constant("the two-state generator's beta", self.beta)
        if not self.a + self.b > 0:
            raise InputError(
                f"the two-state generator needs a or b positive (with both 0 each state absorbs "
                f"and p_st is not unique); got a={self.a!r}, b={self.b!r}."
            )

    @property
    def n_states(self) -> int:
        return 2

    def domain(self):
        """Where `n (|beta| + 1) a e^{beta y}` (`n = 2`), `e^{beta y}` and `n b` are finite
        (`rate_domain`): `beta y <= min(log(M / (2 (|beta| + 1) a)), log M)`, `M` float64's
        largest number (353.995 for the CLI's `beta = 2`); the real line for `beta = 0`. On the
        other side (`y -> -inf` for `beta > 0`, `+inf` for `beta < 0`) the rate underflows to 0
        and state 0 absorbs: `p_st` puts all the mass there, its limit, so that side stays
        open."""
        return self._rate_domain([self.a, self.b], [self.beta, 0.0])

    def neighbour_rates(self, y):
        up = self.a * np.exp(self.beta * _as_slow(y)[..., :1])
        return up, np.full_like(up, float(self.b))

    def rates(self, y):
        return _neighbour_generator(*self.neighbour_rates(y))

    def rates_dy(self, y):
        y = _as_slow(y)[..., 0]
        dup = self.a * self.beta * np.exp(self.beta * y)
        d = np.zeros(y.shape + (1, 2, 2))
        d[..., 0, 0, 1] = dup
        d[..., 0, 0, 0] = -dup
        return d

    def closed_form(self, y):
        y = _as_slow(y)[..., 0]
        up = self.a * np.exp(self.beta * y)
        return np.stack([self.b / (self.b + up), up / (self.b + up)], axis=-1)

    def chain_rates(self, dtype=None, device="cpu", batch_last=False, scale=None):
        return _exponential_chain(self.a, self.beta, 0.0, self.b, 2, dtype, device, batch_last,
                                  scale)  # fmt: skip

    def chain_constants(self):
        """The rates as numbers for the compiled march: `(k, beta, l, down)` with the up rate
        `k_i e^{beta y} + l_i y` and the down rate `down_i` of each link `i <-> i+1`, `(n-1,)`
        arrays and `beta` a float; the same rates as `chain_rates`."""
        return _exponential_constants(self.a, self.beta, 0.0, self.b, 2)


@dataclass
class BirthDeath(Generator):
    """Birth-death chain on `0..n-1`: up rate `u(y) = up * exp(beta (y - y_mid))`, down rate `down`.

    `p_st,i(y) = r^i (1 - r) / (1 - r^n)` with `r = u(y)/down` (uniform when `r = 1`).
    With `beta = 0` and `up/down = 0.1` it is the nearly decomposable test chain of DESIGN 3.1.
    """

    n: int = 8
    up: float = 1.0
    down: float = 1.0
    beta: float = 4.0
    y_mid: float = 0.5
    name: str = field(default="birth-death", init=False, repr=False)

    def __post_init__(self):
        if int(self.n) != self.n or self.n < 2:
            raise InputError(f"a birth-death chain needs an integer n >= 2 states; got n={self.n}.")
        # a zero rate cuts the chain (a reducible one), a negative one makes no generator
        _constant("the birth-death generator's rate up", self.up, 0.0, lo_open=True)
        _constant("the birth-death generator's rate down", self.down, 0.0, lo_open=True)
        _constant("the birth-death generator's beta", self.beta)
        _constant("the birth-death generator's y_mid", self.y_mid)

    @property
    def n_states(self) -> int:
        return int(self.n)

    def domain(self):
        """Where `n (|beta| + 1) u(y)`, `e^{beta (y - y_mid)}` and `n down` are finite
        (`rate_domain`): `beta (y - y_mid) <= min(log(M / (n (|beta| + 1) up)), log M)`, `M`
        float64's largest number (y <= 177.023 at the defaults); the real line for `beta = 0`.
        On the other side (`y -> -inf` for `beta > 0`, `+inf` for `beta < 0`) `u` underflows
        to 0 and state 0 absorbs: `p_st` puts all the mass there, its limit, so that side stays
        open."""
        return self._rate_domain([self.up, self.down], [self.beta, 0.0], self.y_mid)

    def up_rate(self, y):
        return self.up * np.exp(self.beta * (_as_slow(y)[..., 0] - self.y_mid))

    def neighbour_rates(self, y):
        u = self.up_rate(y)[..., None]
        up = np.broadcast_to(u, u.shape[:-1] + (self.n_states - 1,))
        return up, np.full(up.shape, float(self.down))

    def rates(self, y):
        return _neighbour_generator(*self.neighbour_rates(y))

    def rates_dy(self, y):
        du = self.beta * self.up_rate(y)
        n = self.n_states
        d = np.zeros(du.shape + (1, n, n))
        i = np.arange(n - 1)
        d[..., 0, i, i + 1] = du[..., None]
        d[..., 0, i, i] = -du[..., None]
        return d

    def closed_form(self, y):
        r = self.up_rate(y) / self.down
        # log-space so that r**i does not underflow for long chains
        logw = np.arange(self.n_states) * np.log(r)[..., None]
        logw -= logw.max(axis=-1, keepdims=True)
        w = np.exp(logw)
        return w / w.sum(axis=-1, keepdims=True)

    def chain_rates(self, dtype=None, device="cpu", batch_last=False, scale=None):
        return _exponential_chain(self.up, self.beta, self.y_mid, self.down, self.n_states, dtype,
                                  device, batch_last, scale)  # fmt: skip

    def chain_constants(self):
        """The rates as numbers for the compiled march: `(k, beta, l, down)` with the up rate
        `k_i e^{beta y} + l_i y` and the down rate `down_i` of each link `i <-> i+1`, `(n-1,)`
        arrays and `beta` a float; the same rates as `chain_rates`."""
        return _exponential_constants(self.up, self.beta, self.y_mid, self.down, self.n_states)


@dataclass
class Cycle(Generator):
    """Non-reversible cycle: rate `i -> i+1 (mod n)` is `forward * exp(y s_i)` with
    `s_i = i/(n-1) - 1/2`, rate `i -> i-1 (mod n)` is `backward`.

    The probability current around the cycle is non-zero, so detailed balance fails; there is no
    simple closed form for `p_st` (it is solved numerically).
    """

    n: int = 6
    forward: float = 1.0
    backward: float = 0.2
    name: str = field(default="cycle", init=False, repr=False)

    def __post_init__(self):
        if int(self.n) != self.n or self.n < 3:
            raise InputError(f"a cycle needs an integer n >= 3 states; got n={self.n}.")
        # either direction alone goes round the cycle (irreducible); with neither, every state
        # absorbs
        _constant("the cycle generator's rate forward", self.forward, 0.0)
        _constant("the cycle generator's rate backward", self.backward, 0.0)
        if not (self.forward > 0 or self.backward > 0):
            raise InputError(
                f"the cycle generator needs a positive rate forward or backward (with neither, "
                f"every state absorbs); got forward={self.forward!r}, backward={self.backward!r}."
            )

    @property
    def n_states(self) -> int:
        return int(self.n)

    def _s(self):
        return readout_vector(self.n_states) - 0.5

    def domain(self):
        """Where `n (|s_i| + 1) forward e^{y s_i}`, `e^{y s_i}` and `n backward` are finite
        for every `i` (`rate_domain`): `|y| <= 2 min(log(M / (1.5 n forward)), log M)` (`s_i`
        spans [-1/2, 1/2]; `M` float64's largest number; 1415.17 at the defaults). The rates
        that underflow on the way leave the backward cycle: the chain stays irreducible."""
        return self._rate_domain(np.append(np.full(self.n_states, self.forward), self.backward),
                                 np.append(self._s(), 0.0))  # fmt: skip

    def rates(self, y):
        y = _as_slow(y)[..., 0]
        n = self.n_states
        i = np.arange(n)
        q = np.zeros(y.shape + (n, n))
        q[..., i, (i + 1) % n] = self.forward * np.exp(y[..., None] * self._s())
        q[..., i, (i - 1) % n] += self.backward
        return from_off_diagonal(q)

    def rates_dy(self, y):
        y = _as_slow(y)[..., 0]
        n = self.n_states
        i = np.arange(n)
        dfw = self.forward * self._s() * np.exp(y[..., None] * self._s())
        d = np.zeros(y.shape + (1, n, n))
        d[..., 0, i, (i + 1) % n] = dfw
        d[..., 0, i, i] = -dfw
        return d

    def torch_off_diagonal(self, y):
        import torch

        n, kw = self.n_states, {"dtype": y.dtype, "device": y.device}
        i = torch.arange(n, device=y.device)
        s = torch.as_tensor(self._s(), **kw)
        fw = self.forward * torch.exp(y[:, :1] * s)  # (B, n): rate i -> i+1 (mod n)
        shift = torch.zeros(n, n, **kw)
        shift[i, (i + 1) % n] = 1.0
        back = torch.zeros(n, n, **kw)
        back[i, (i - 1) % n] = self.backward
        return fw[:, :, None] * shift + back, (s * fw)[:, :, None] * shift


@dataclass
class RandomIrreducible(Generator):
    """Seeded random family `Q_ij(y) = A_ij exp(y B_ij)` on `n` states.

    `A_ij ~ U(0, 1)` on a random sparsity pattern of density `density`, plus a random Hamiltonian
    cycle with rates at least 0.1 so that every member is irreducible; `B_ij ~ N(0, 1)`.
    """

    n: int = 8
    seed: int = 0
    density: float = 0.5
    name: str = field(default="random", init=False, repr=False)

    def __post_init__(self):
        if int(self.n) != self.n or self.n < 2:
            raise InputError(f"a random generator needs an integer n >= 2 states; got n={self.n}.")
        _density("the random generator's density", self.density)
        rng = np.random.default_rng(self.seed)
        n = self.n_states
        a = rng.uniform(0.0, 1.0, (n, n)) * (rng.uniform(size=(n, n)) < self.density)
        perm = rng.permutation(n)
        a[perm, np.roll(perm, -1)] += rng.uniform(0.1, 1.0, n)
        np.fill_diagonal(a, 0.0)
        self._a = a
        self._b = rng.normal(size=(n, n)) * (a > 0)

    @property
    def n_states(self) -> int:
        return int(self.n)

    def domain(self):
        """Where `n (|B_ij| + 1) A_ij e^{y B_ij}` and `e^{y B_ij}` are finite for every
        positive `A_ij` (`rate_domain`): `B_ij y <= min(log(M / (n (|B_ij| + 1) A_ij)), log M)`,
        `M` float64's largest number ([-364.899, 577.677] for `n = 8, seed = 0`). A rate that
        underflows to 0 on the way may leave transient states (`p_st` gives them no mass) or
        several closed classes (refused by name)."""
        return self._rate_domain(self._a, self._b)

    def rates(self, y):
        y = _as_slow(y)[..., 0]
        return from_off_diagonal(self._a * np.exp(y[..., None, None] * self._b))

    def rates_dy(self, y):
        y = _as_slow(y)[..., 0]
        off = self._a * self._b * np.exp(y[..., None, None] * self._b)
        n = self.n_states
        idx = np.arange(n)
        off[..., idx, idx] = -off.sum(axis=-1)
        return off[..., None, :, :]

    def torch_off_diagonal(self, y):
        import torch

        a = torch.as_tensor(self._a, dtype=y.dtype, device=y.device)
        b = torch.as_tensor(self._b, dtype=y.dtype, device=y.device)
        off = a * torch.exp(y[:, :1, None] * b)
        return off, off * b


@dataclass
class MichaelisMenten(Generator):
    """`N` enzyme molecules, state `i` = number bound to substrate; substrate concentration `y`.

    Binding `E + S -> C` at rate `k1 y` per free enzyme, unbinding plus catalysis `C -> E` at rate
    `k_minus1 + k2` per complex: up rate `(N - i) k1 y`, down rate `i (k_minus1 + k2)`.
    `p_st(y)` is binomial with bound fraction `y / (y + K_M)`, `K_M = (k_minus1 + k2) / k1`.
    Defined for `y >= 0`.
    """

    N: int = 4
    k1: float = 1.0
    k_minus1: float = 1.0
    k2: float = 1.0
    name: str = field(default="michaelis-menten", init=False, repr=False)
    domain_reason = "its rates are non-negative and, with their Jacobian, finite"

    def __post_init__(self):
        if int(self.N) != self.N or self.N < 1:
            raise InputError(f"Michaelis-Menten needs an integer N >= 1 enzymes; got N={self.N}.")
        # no binding (k1 = 0) drains every state to 0, no way out of the complex
        # (k_minus1 + k2 = 0) to N: one closed class, as at y = 0, which the solvers take; with
        # neither, every state absorbs and p_st is not unique
        _constant("the michaelis-menten generator's rate k1", self.k1, 0.0)
        _constant("the michaelis-menten generator's rate k_minus1", self.k_minus1, 0.0)
        _constant("the michaelis-menten generator's rate k2", self.k2, 0.0)
        if not (self.k1 > 0 or self.k_minus1 + self.k2 > 0):
            raise InputError(
                f"the michaelis-menten generator needs k1 or k_minus1 + k2 positive (with "
                f"neither every state absorbs and p_st is not unique); got k1={self.k1!r}, "
                f"k_minus1={self.k_minus1!r}, k2={self.k2!r}."
            )

    @property
    def n_states(self) -> int:
        return int(self.N) + 1

    @property
    def K_M(self) -> float:
        return (self.k_minus1 + self.k2) / self.k1

    def domain(self):
        """`y >= 0` (below, the binding rate is negative) up to where `n` times the largest
        rate stays finite, `n N k1 y <= M` (`M` float64's largest number; about 9e306 at the
        defaults): the rates are linear in `y`, their derivatives constants."""
        top = self.n_states * self.N * self.k1
        return (0.0, _MAX / top if top > 0 else math.inf)

    def neighbour_rates(self, y):
        y = _as_slow(y)[..., :1]
        i = np.arange(self.n_states - 1)
        up = (self.N - i) * self.k1 * y
        return up, np.broadcast_to((i + 1) * (self.k_minus1 + self.k2), up.shape).copy()

    def rates(self, y):
        return _neighbour_generator(*self.neighbour_rates(y))

    def rates_dy(self, y):
        y = _as_slow(y)[..., 0]
        n = self.n_states
        i = np.arange(n - 1)
        d = np.zeros(y.shape + (1, n, n))
        d[..., 0, i, i + 1] = (self.N - i) * self.k1
        d[..., 0, i, i] = -(self.N - i) * self.k1
        return d

    def closed_form(self, y):
        y = _as_slow(y)[..., 0]
        f = y / (y + self.K_M)
        i = np.arange(self.n_states)
        binom = np.array([math.comb(int(self.N), int(k)) for k in i], dtype=np.float64)
        return binom * f[..., None] ** i * (1.0 - f[..., None]) ** (self.N - i)

    def chain_rates(self, dtype=None, device="cpu", batch_last=False, scale=None):
        import torch

        kw = {"dtype": dtype or torch.float64, "device": device}
        n, scale = self.n_states, 1.0 if scale is None else float(scale)
        link = (n - 1, 1) if batch_last else (1, n - 1)  # one constant per link i -> i+1
        i = torch.arange(n - 1, **kw)
        down = ((i + 1) * (self.k_minus1 + self.k2) * scale).reshape(link)
        dup = ((self.N - i) * self.k1 * scale).reshape(link)  # up = dup * y

        def rates(y, derivative=True):
            up = dup * y
            return up, down, (dup.expand_as(up) if derivative else None)

        return rates

    def chain_constants(self):
        """The rates as numbers for the compiled march: `(k, beta, l, down)` with the up rate
        `k_i e^{beta y} + l_i y` and the down rate `down_i` of each link `i <-> i+1`, `(n-1,)`
        arrays and `beta` a float; the same rates as `chain_rates`."""
        i = np.arange(self.n_states - 1)
        zero = np.zeros(len(i))
        return (zero, 0.0, (self.N - i) * float(self.k1),
                (i + 1) * (float(self.k_minus1) + float(self.k2)))  # fmt: skip


def random_generators(count: int, n: int, seed: int = 0, density: float = 0.5) -> np.ndarray:
    """`count` independent random irreducible generators on `n` states, shape `(count, n, n)`.

    Off-diagonal rates `U(0, 1)` on a random pattern of the given density, plus a random
    Hamiltonian cycle of rates in `[0.1, 1)` (which makes each one irreducible). `count` is an
    integer >= 0, `n` >= 1.
    """
    for name, value in (("count", count), ("n (states)", n)):
        if isinstance(value, bool):  # True is no count
            raise InputError(f"{name} must be an integer; got {value!r}.")
    count = number("count", count, lo=0, integer=True)
    n = number("n (states)", n, lo=1, integer=True)
    _density("density", density)
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.0, 1.0, (count, n, n)) * (rng.uniform(size=(count, n, n)) < density)
    perm = np.argsort(rng.uniform(size=(count, n)), axis=-1)
    rows = np.arange(count)[:, None]
    a[rows, perm, np.roll(perm, -1, axis=-1)] += rng.uniform(0.1, 1.0, (count, n))
    return from_off_diagonal(a)


def _density(label: str, value) -> None:
    """`InputError` unless `value` is a density of off-diagonal rates, a number in [0, 1]
    (0: the random Hamiltonian cycle alone, which keeps the chain irreducible)."""
    _constant(label, value, 0.0, 1.0)


def rate_domain(log_scale, slope, room, center=0.0, positive=False):
    """The interval `(lo, hi)` of `y` on which every rate `r_j = exp(log_scale_j + slope_j (y -
    center))` stays `room_j r_j <= M`, `M` float64's largest number, that is `slope_j (y -
    center) <= log(M / room_j) - log_scale_j` (arrays broadcast together; the scale as a log,
    so that one beyond float64, such as `e^kappa`, may still give finite rates). `room_j`
    covers what is built from the rate: `n (|slope_j| + 1)` keeps the sums of `n` rates and of
    `n` derivatives `slope_j r_j` (a generator's diagonal, a Jacobian's entries) finite. With
    `positive`, each rate is also a positive normal float, `r_j >= tiny` (below, it loses bits,
    then underflows to 0 and its link falls away). A rate with `slope_j = 0` bounds nothing
    unless it alone breaks the bound. `None` where no `y` is left."""
    log_scale, slope, room = (np.ravel(np.asarray(a, dtype=np.float64))
                              for a in np.broadcast_arrays(log_scale, slope, room))  # fmt: skip
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        # each bound as a (y - center) <= c
        a = np.concatenate([slope, -slope if positive else []])
        c = np.concatenate([np.log(_MAX / room) - log_scale,
                            log_scale - math.log(_TINY) if positive else []])  # fmt: skip
        if not np.all(c[a == 0] >= 0):
            return None
        up, down = a > 0, a < 0
        hi = center + float(np.min(c[up] / a[up], initial=math.inf))
        lo = center + float(np.max(c[down] / a[down], initial=-math.inf))
    return (lo, hi) if lo <= hi else None


def into_domain(family, y, atol, rtol=0.0):
    """`y` with the values that lie outside `family.domain()` by at most a solver's tolerance,
    `atol + rtol |y|` (`atol` a number or an array like `y`), set to the domain's end: an end
    that the dynamics approach (Michaelis-Menten's substrate, used up, reaches y = -3e-13).
    Values farther out are kept, for the caller's check to refuse."""
    lo, hi = family.domain()
    y = np.asarray(y, dtype=np.float64)
    slack = atol + rtol * np.abs(y)
    finite = np.isfinite(y)  # (an infinite y has an infinite relative slack)
    y = np.where(finite & (y < lo) & (y >= lo - slack), lo, y)
    return np.where(finite & (y > hi) & (y <= hi + slack), hi, y)


def domain_text(family) -> str:
    """`"the NAME generator's domain [lo, hi], where REASON"`, for the sentences that refuse a
    `y` outside `family.domain()`: the ends to 6 significant digits, rounded inward (a printed
    end given back is inside), and the family's `domain_reason`."""
    from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

    def inward(v, rounding):
        if not math.isfinite(v) or v == 0:
            return f"{v:g}"
        d = Decimal(v)  # the double's exact value; a 6-digit decimal beside it, then its double
        return f"{float(d.quantize(Decimal(1).scaleb(d.adjusted() - 5), rounding)):.6g}"

    lo, hi = family.domain()
    reason = getattr(family, "domain_reason", "its rates are finite")
    return (f"the {family.name} generator's domain [{inward(lo, ROUND_CEILING)}, "
            f"{inward(hi, ROUND_FLOOR)}], where {reason}")  # fmt: skip


# ----------------------------------------------------------------------------------------------
# helpers of the torch forms


def readout_vector(n: int) -> np.ndarray:
    """`c_i = i/(n-1)`: each state's position on [0, 1], the readout of the slow laws and the
    corpus (`c . x` is the mean position of `x`)."""
    return np.arange(n) / (n - 1)


def _t_generator(off):
    """Generator from off-diagonal rates with a zero diagonal (torch), out of place."""
    import torch

    return off - torch.diag_embed(off.sum(-1))


def _exponential_chain(k, beta, y_mid, down, n, dtype, device, batch_last, scale):
    """`chain_rates` of a chain with up rate `k exp(beta (y - y_mid))` and a constant down rate.
    The constants are made once here, not at every call (the solver calls the rates six times per
    step): the up rate is `exp(log(k scale) - beta y_mid + beta y)`, two operations. `k`, `beta`
    and `down` may be tensors (differentiated)."""
    import torch

    kw = {"dtype": dtype or torch.float64, "device": device}
    scale = 1.0 if scale is None else float(scale)
    chain = (n - 1, -1) if batch_last else (-1, n - 1)  # expand to the chain's shape
    link = (n - 1, 1) if batch_last else (1, n - 1)
    down = (torch.as_tensor(down, **kw) * scale).reshape(1, 1).expand(link)
    log_k = torch.log(torch.as_tensor(k, **kw) * scale) - beta * y_mid

    def rates(y, derivative=True):
        if isinstance(beta, torch.Tensor):  # a parameter being differentiated
            up = torch.exp(log_k + beta * y).expand(*chain)
        else:
            up = torch.exp(torch.add(log_k, y, alpha=beta)).expand(*chain)
        return up, down, (beta * up if derivative else None)

    return rates


def _exponential_constants(k, beta, y_mid, down, n):
    """`chain_constants` of a chain with up rate `k exp(beta (y - y_mid))` and a constant down
    rate: `k_i = k e^{-beta y_mid}`, `l_i = 0`."""
    beta = float(beta)
    ones = np.ones(n - 1)
    return (float(k) * math.exp(-beta * float(y_mid)) * ones, beta, 0.0 * ones, float(down) * ones)


def chain_divergence(flux, batch_last=False):
    """`dx_i/dt` from the net fluxes `flux_i` from `i` to `i+1`, `(B, n-1)` or, `batch_last`,
    `(n-1, B)`: `flux_{i-1} - flux_i`, with no flux beyond either end."""
    import torch.nn.functional as F

    if batch_last:
        padded = F.pad(flux, (0, 0, 1, 1))
        return padded[:-1] - padded[1:]
    padded = F.pad(flux, (1, 1))
    return padded[:, :-1] - padded[:, 1:]
