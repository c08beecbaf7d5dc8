"""Wording shared by the messages of every layer (no imports: the ODE core may use it)."""

from __future__ import annotations

__all__ = ["plural"]


def plural(n, noun: str, many: str | None = None, spec: str = "") -> str:
    """`n` and `noun` in its number: `plural(1, "step")` is "1 step", `plural(2, "step")` "2
    steps", `plural(1000, "token", spec=",")` "1,000 tokens", `plural(1, "trajectory")` "1
    trajectory" and `plural(3, "trajectory")` "3 trajectories"; `many` where the plural is
    irregular. `spec` formats the number (a format spec, e.g. "," or ".3g")."""
    if many is None:
        consonant_y = noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u")
        many = noun[:-1] + "ies" if consonant_y else noun + "s"
    return f"{n:{spec}} {noun if n == 1 else many}"
