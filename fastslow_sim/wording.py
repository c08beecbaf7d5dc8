"""Wording shared by the messages of every layer (no imports: the ODE core may use it)."""

from __future__ import annotations

__all__ = ["plural", "number_text"]


def plural(n, noun: str, many: str | None = None, spec: str = "") -> str:
    """`n` and `noun` in its number: `plural(1, "step")` is "1 step", `plural(2, "step")` "2
    steps", `plural(1000, "token", spec=",")` "1,000 tokens", `plural(1, "trajectory")` "1
    trajectory" and `plural(3, "trajectory")` "3 trajectories"; `many` where the plural is
    irregular. `spec` formats the number (a format spec, e.g. "," or ".3g")."""
    if many is None:
        consonant_y = noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u")
        many = noun[:-1] + "ies" if consonant_y else noun + "s"
    return f"{n:{spec}} {noun if n == 1 else many}"


def number_text(v) -> str:
    """A float as given: the shortest text that reads back as the same float64 (Python's
    repr), without a trailing ".0": `1000.0001` is "1000.0001" (":g" made it "1000"), `1.0`
    "1", `1e300` "1e+300"."""
    text = repr(float(v))
    return text[:-2] if text.endswith(".0") else text
