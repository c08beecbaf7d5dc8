"""Validation of numbers from users, in one place: each check ends in one sentence that names the
value and what was expected (`InputError`; exit status 2 in the CLI)."""

from __future__ import annotations

import decimal
import math
import numbers
import re

import numpy as np

from .errors import InputError
from .wording import count_text

__all__ = ["number", "positive", "positive_int", "plain_int", "as_int", "no_underscore", "t_span",
           "folder", "count_text"]


def no_underscore(name: str, text) -> None:
    """`InputError` when the typed number `text` holds an underscore or a digit outside ASCII:
    Python's int(), float() and Decimal read "1_5" as 15 (and "٨" as 8), so a slip ran silently
    with another number (every number a user types goes through here, or through `as_int`)."""
    if isinstance(text, str) and "_" in text and reads_as_float(text):  # "ten_k": its parse says
        raise InputError(f"{name} must be a number written without underscores; got {text!r}.")
    if isinstance(text, str) and not text.isascii() and reads_as_float(text):  # float("٨") is 8
        raise InputError(f"{name} must be a number written in ASCII digits; got {text!r}.")


def reads_as_float(text) -> bool:
    """Whether Python reads `text` (or any value) as a number ("1_5"; not "ten_k", whose parse
    says so; not None or an object without `__float__`)."""
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def first_non_finite(a, name: str) -> None:
    """`InputError` naming the first entry of the numpy array `a` that is not finite, if any."""
    if not np.isfinite(a).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise InputError(f"{name} must be finite; entry {bad} is {a[bad]}.")


def as_int(text: str) -> int:
    """The integer that `text` writes ("12", "1e3", "2.0"), exactly: read as a decimal, not
    through float (which turned seed 99999999999999999999999 into 99999999999999991611392).
    `ValueError` unless it is an integer (one with an underscore included: see `no_underscore`);
    written in digits, of any size (the caller's bound says more); otherwise `OverflowError`
    for one of 1e19 or more in absolute value (never expanded: "1e999999" would be a million
    digits)."""
    text = str(text).strip()
    if "_" in text or not text.isascii():  # Decimal reads "1_5" as 15 and Arabic-Indic digits
        raise ValueError(text)
    if re.fullmatch(r"[+-]?[0-9]+", text):
        return int(text)
    try:
        v = decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise ValueError(text) from None
    if not v.is_finite():
        raise ValueError(text)
    if v and v.adjusted() > 18:
        raise OverflowError(text)
    if v != v.to_integral_value():
        raise ValueError(text)
    return int(v)


def number(name: str, value, lo=None, hi=None, *, integer=False, lo_open=False):
    """`value` as a float (an int with `integer`), or `InputError` unless it is a finite number
    (an integer) within `[lo, hi]` (`(lo, hi]` with `lo_open`)."""
    kind = "an integer" if integer else "a finite number"
    bounds = []
    if lo is not None:
        bounds.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        bounds.append(f"<= {hi:g}")
    expected = f"{name} must be {kind}{' ' if bounds else ''}{' and '.join(bounds)}"
    no_underscore(name, value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        try:  # numpy scalars and numeric strings are numbers too
            v = float(value)
        except (TypeError, ValueError):
            raise InputError(f"{expected}; got {value!r}.") from None
    else:
        v = float(value)
    ok = (
        math.isfinite(v)
        and (not integer or v.is_integer())
        and (lo is None or (v > lo if lo_open else v >= lo))
        and (hi is None or v <= hi)
    )
    if not ok:
        raise InputError(f"{expected}; got {value!r}.")
    return int(v) if integer else v


def positive(name: str, value) -> float:
    """`value` as a positive finite float, or `InputError`."""
    no_underscore(name, value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool) or not (math.isfinite(v) and v > 0):
        raise InputError(f"{name} must be a positive finite number; got {value!r}.")
    return v


def positive_int(name: str, value) -> int:
    """`value` as an integer >= 1, or `InputError`: integers and text exactly (`as_int`; through
    float, 2**63 - 1 became 2**63), a float only where it is whole."""
    no_underscore(name, value)
    expected = f"{name} must be a positive integer; got {value!r}."
    if isinstance(value, bool):
        raise InputError(expected)
    if isinstance(value, numbers.Integral):
        v = int(value)
    elif isinstance(value, (str, decimal.Decimal)):
        try:
            v = as_int(str(value))
        except ValueError:
            raise InputError(expected) from None
        except OverflowError:  # 1e19 or more with an exponent: never expanded
            raise InputError(f"{name} must be a positive integer written in digits when it is "
                             f"1e19 or more; got {value!r}.") from None  # fmt: skip
    else:
        try:
            f = float(value)
        except (TypeError, ValueError):
            f = math.nan
        if not (math.isfinite(f) and f.is_integer()):
            raise InputError(expected)
        v = int(f)
    if v < 1:
        raise InputError(expected)
    return v


def plain_int(value):
    """`value` as a Python `int` when it is an integer of any kind (`int` or a numpy integer such
    as `np.int64(8)`, never a `bool`), else `value` unchanged for the caller's own check to
    refuse: configs keep plain ints, so they stay JSON-serialisable."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return value


def t_span(value) -> tuple[float, float]:
    """`(t0, t1)` as floats, or `InputError` unless they are finite and run forward."""
    try:
        t0, t1 = (float(v) for v in value)
    except (TypeError, ValueError):
        raise InputError(f"t_span must be two numbers (t0, t1); got {value!r}.") from None
    if not (math.isfinite(t0) and math.isfinite(t1)) or t1 <= t0:
        raise InputError(f"t_span must run forward (t0 < t1, both finite); got ({t0}, {t1}).")
    return t0, t1


def folder(path, what: str):
    """`path` as a `Path`, or `InputError` unless it and each folder above it is a folder or
    does not exist yet (a regular file, or a symbolic link to nothing, cannot hold files)."""
    import os
    from pathlib import Path

    path = Path(path)
    for p in reversed((path, *path.parents)):
        if str(p) in (".", "", os.sep):
            continue
        if p.is_symlink() and not p.exists():
            where = "" if p == path else f" (above the {what} {str(path)!r})"
            raise InputError(f"{str(p)!r}{where} is a symbolic link to {os.readlink(p)!r}, which "
                             f"does not exist; expected the {what} to be a folder or a new path.")
        if p.exists() and not p.is_dir():
            where = "" if p == path else f" (above the {what} {str(path)!r})"
            raise InputError(f"{str(p)!r}{where} exists and is not a folder; expected the {what} "
                             f"to be a folder or a new path.")
    return path


def comma_entries(text: str, name: str, what: str = "numbers", example: str = "'1, 0.5'"
                  ) -> list[str]:  # fmt: skip
    """The entries of a comma-separated `text`, stripped; an empty one ("1,,0", "dense,") is
    refused in one sentence naming it (`what`: what the entries are, as `example`). An empty
    or whitespace-only `text` ("", "  ") gives `[]`: the caller says what it needs."""
    entries = []
    for k, raw in enumerate(str(text).split(","), 1):
        entry = raw.strip()
        if entry == "":
            if k == 1 and raw == str(text):  # nothing at all: the caller says what it needs
                return []
            raise InputError(f"{name} entry {k} of {text!r} is empty; expected {what} separated "
                             f"by single commas, as {example}.")  # fmt: skip
        entries.append(entry)
    return entries


def number_list(text: str, name: str) -> list[float]:
    """The numbers of a comma-separated `text` (`--x0`, `--y0`, `--eps`): spaces around an entry
    are allowed ("1, 0.5"); an entry with a space inside ("1 5", which once read as 15) or an
    empty one ("1,,0") is refused in one sentence naming it, as is one that is no number."""
    values = []
    for k, entry in enumerate(comma_entries(text, name), 1):
        if any(ch.isspace() for ch in entry):
            raise InputError(f"{name} entry {entry!r} of {text!r} has a space inside it; expected one "
                             f"number per comma-separated entry, as '1, 0.5'.")  # fmt: skip
        no_underscore(f"{name} entry {k}", entry)
        try:
            values.append(float(entry))
        except ValueError:
            raise InputError(f"{name} entry {entry!r} of {text!r} is not a number; expected a "
                             f"comma-separated list of numbers, as '1, 0.5'.") from None  # fmt: skip
    return values
