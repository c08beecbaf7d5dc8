"""Saving and loading results as self-describing NetCDF files.

Writes are atomic: the data go to a temporary file in the target folder, which is renamed onto
the target only once complete, so an interrupted run never leaves a file that looks finished.
The NetCDF-4 engine is h5netcdf (pure Python over h5py, no system netCDF library needed).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
import xarray as xr

from .errors import InputError

__all__ = ["save_dataset", "load_dataset", "check_writable", "atomic_path"]

ENGINE = "h5netcdf"


def _special(path: Path) -> str | None:
    """What `path` is when it exists and is neither a regular file nor a directory, else `None`."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    for test, kind in ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):  # fmt: skip
        if test(mode):
            return kind
    return "special file"


def check_writable(path, what="output") -> Path:
    """Raise `InputError` unless `path` can be created or replaced: it is absent or a regular
    file (never a directory, device, FIFO or socket), and its folder exists and is writable."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.exists() and p.is_dir():
        raise InputError(f"the {what} path {str(p)!r} is a directory; expected a file name.")
    kind = _special(p)
    if kind is not None:
        raise InputError(
            f"the {what} path {str(p)!r} is a {kind}, not a regular file; expected a new or "
            f"regular file (it is never replaced)."
        )
    if not parent.exists():
        raise InputError(
            f"cannot write the {what} {str(p)!r}: folder {str(parent)!r} does not exist."
        )
    if not os.access(parent, os.W_OK) or not _can_create(parent):
        raise InputError(
            f"cannot write the {what} {str(p)!r}: folder {str(parent)!r} is not writable."
        )
    return p


def _can_create(folder: Path) -> bool:
    """Whether a file can really be created in `folder` (root passes `os.access` everywhere,
    also on a read-only mount such as /sys)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".fastslow-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds
    and `path` is still absent or a regular file: a rename replaces whatever sits at the target,
    and onto `/dev/full` it would replace the device with a regular file (`InputError` instead).
    A symbolic link is followed, so the file it points to is replaced, not the link."""
    path = Path(os.path.realpath(path))
    check_writable(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual permissions
        check_writable(path)  # once more: something may have appeared there meanwhile
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _clean_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, (bool, np.bool_)):
            v = int(v)
        elif v is None:
            v = ""
        elif isinstance(v, (list, tuple)):
            v = np.asarray(v)
        out[k] = v
    return out


def save_dataset(ds: xr.Dataset, path) -> Path:
    """Write `ds` to NetCDF-4 at `path`, atomically."""
    path = check_writable(path, "dataset")
    ds = ds.copy()
    ds.attrs = _clean_attrs(ds.attrs)
    for name in ds.variables:
        ds[name].attrs = _clean_attrs(ds[name].attrs)
    with atomic_path(path) as tmp:
        ds.to_netcdf(tmp, engine=ENGINE)
    return path


def load_dataset(path) -> xr.Dataset:
    """Read a dataset written by `save_dataset` (fully loaded into memory, file closed)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"no dataset at {str(p)!r}.")
    with xr.open_dataset(p, engine=ENGINE) as ds:
        return ds.load()
