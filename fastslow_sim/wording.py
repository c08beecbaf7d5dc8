"""Wording shared by the messages of every layer (no imports of the package: the ODE core may use
it)."""

from __future__ import annotations

import decimal
import math

__all__ = ["plural", "number_text", "count_text", "int_text", "amount_text", "bytes_text"]


def count_text(v: int) -> str:
    """A count as a message prints it: `1,000,000`, or `1e+300` beyond 16 digits (a count
    parsed from `1e300` is an integer of 301 digits)."""
    if abs(v) < 10**16:
        return f"{v:,}"
    if abs(v) < 10**308:
        return f"{float(v):.3g}"
    return format(decimal.Decimal(v).normalize(), ".3g")  # 1e+999: no float holds it


def int_text(v: int) -> str:
    """An integer a user typed digit by digit (an option of type int), echoed as typed: grouped
    in thousands like a count below 10^16, every digit beyond (`count_text`'s `1e+21` is for a
    count parsed from a text such as `1e21`, which was not what was typed here)."""
    return f"{v:,}" if abs(v) < 10**16 else str(v)


def amount_text(v: float, digits: int = 3) -> str:
    """A measured amount to `digits` significant digits, grouped in thousands like a count:
    `amount_text(26843.5)` is "26,800", `amount_text(23.47)` "23.5", `amount_text(1.0)` "1";
    in exponent form beyond 1e16 (as `count_text`) and below 1e-3, and as Python writes it when
    not finite."""
    if not math.isfinite(v) or v == 0 or not 1e-3 <= abs(v) < 1e16:
        return f"{v:.{digits}g}"
    rounded = float(f"{v:.{digits}g}")
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    text = f"{rounded:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text  # 1, not 1.00 (as .3g)


def bytes_text(n: float) -> str:
    """A size in bytes as a message prints it, in the largest binary unit up to GiB that it
    reaches, by `amount_text`: `bytes_text(81920)` is "80 KiB", `bytes_text(1.5 * 2**30)` "1.5
    GiB", `bytes_text(5.24e15)` "4,880,000 GiB", `bytes_text(40)` "40 bytes" (":,.3g" of GiB made
    these "7.63e-05 GiB" and "4.88e+06 GiB")."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{amount_text(n / size)} {unit}"
    return f"{amount_text(n)} {'byte' if n == 1 else 'bytes'}"


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


def short_repr(v, width: int = 60) -> str:
    """`v` for a message: its repr up to `width` characters (cut with "..."), an array of more
    than 8 entries as its shape and dtype, a small one on one line (numpy's repr is not)."""
    if type(v).__name__ == "ndarray":  # numpy's (no import here: the ODE core may use this)
        if v.size > 8:
            return f"an array of shape {tuple(v.shape)} and dtype {v.dtype}"
        v = v.tolist()
    text = repr(v)
    return text if len(text) <= width else text[: width - 3] + "..."
