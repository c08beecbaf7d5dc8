"""Step-size control of the Rosenbrock march: the error norm, accept or reject, the next step.

One rule for every tableau and backend: accept when the RMS norm of the error estimate scaled by
`atol + rtol max(|y0|, |y1|)` is at most 1 (`rms`: finite for finite entries, which may be up to
1e308; their squares would overflow beyond 1e154, at rates near 1e174 over `atol`); the next step is `h * safety * err^(-1/order)`,
growing at most `fac_max`-fold after an accepted step and shrinking at most `1/fac_min`-fold
after a rejected one (accepted steps have a factor >= `safety`, rejected ones < `safety`, so one
clamp does both; the error is floored at `err_floor` first); a non-finite error shrinks the step
by `nonfinite_factor`. A step is too small once `|h| <= underflow_ulps uround |t|` (Hairer's
codes, `rodas.f`, `0.1 |h| <= uround |t|`): ten ulps of the current time, no floor tied to the
span. Every backend reads these fields (the compiled march, `compiled.py`, takes them as
arguments).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["StepControl", "rms"]


def rms(q, dim):
    """`sqrt(mean(q^2))` along `dim`, computed as `m sqrt(mean((q/m)^2))` with `m = max |q|`
    (kept within the normal floats), so that no square overflows: finite wherever `q` is, inf
    where it holds an inf, NaN where it holds a NaN."""
    info = torch.finfo(q.dtype)
    m = q.abs().amax(dim, keepdim=True).clamp_(info.tiny, info.max)
    q = q / m
    return torch.linalg.vecdot(q, q, dim=dim).mul_(1.0 / q.shape[dim]).sqrt_().mul_(m.squeeze(dim))


@dataclass(frozen=True)
class StepControl:
    safety: float = 0.9
    fac_min: float = 0.1
    fac_max: float = 6.0
    nonfinite_factor: float = 0.2
    err_floor: float = 1e-10
    underflow_ulps: float = 10.0

    def error_norm(self, err_vec, y0, y1, rtol, atol, kernels=None):
        """`sqrt(mean_i (e_i / (atol + rtol max(|y0_i|, |y1_i|)))^2)` per trajectory, batch last
        `(n, b) -> (b,)`, without overflow (`rms`); in one pass with the compiled kernels
        (`cpu_kernels.error_norm`, a second one where the squares overflow)."""
        if kernels is not None:
            err = torch.empty(y0.shape[1], dtype=y0.dtype)
            kernels.error_norm(err_vec.numpy(), y0.numpy(), y1.numpy(), rtol, atol, err.numpy())
            return err
        scale = torch.maximum(y0.detach().abs(), y1.detach().abs())
        return rms(err_vec.detach() / scale.mul_(rtol).add_(atol), 0)

    def next_step(self, h, err, order: float):
        """The step after one of size `h` with error norm `err` (`(b,)` each)."""
        fac = err.clamp(min=self.err_floor).pow_(-1.0 / order).mul_(self.safety)
        fac = fac.clamp_(self.fac_min, self.fac_max)
        return h * fac.nan_to_num_(nan=self.nonfinite_factor, posinf=self.nonfinite_factor)

    def initial_step(self, f0, z0, rtol, atol, t0, span):
        """Hairer's first guess `0.01 |z0| / |f(z0)|` in the scaled RMS norm (`rms`: rates of
        1e174 over `atol` 1e-10 made `|f(z0)|` inf, the guess 0 and the first step NaN), `(b,)`;
        batch first `z0`, `f0 (b, n)`. At least ten times the smallest step (`too_small` at
        `t0`): a guess below float64 (rates of 1e174 over `atol` 1e-300: 1e-470, computed as 0)
        made a first step of 0 and NaN (status non_finite); from this floor a rejected step falls
        below it and the march ends with status step_underflow, which is what happened."""
        info = torch.finfo(z0.dtype)
        scale = atol + rtol * z0.abs()
        d0 = rms(z0 / scale, -1)
        d1 = rms(f0 / scale, -1)
        guess = torch.where((d0 > 1e-5) & (d1 > 1e-5), 0.01 * d0 / d1, torch.full_like(d0, 1e-6))
        floor = 10 * (self.underflow_ulps * info.eps * abs(t0) + info.tiny)
        return torch.clamp(guess, min=floor, max=span)

    def too_small(self, h, t):
        """Whether each step `h` is below `underflow_ulps` ulps of its time `t` (or underflows
        at `t = 0`)."""
        info = torch.finfo(h.dtype)
        return h <= torch.abs(t).mul_(self.underflow_ulps * info.eps).add_(info.tiny)
