"""Saving and loading results as self-describing NetCDF files, and the rule for every file the
toolkit writes.

Writes are atomic: the data go to a temporary file in the target folder, which is renamed onto
the target only once complete, so an interrupted run never leaves a file that looks finished.
The NetCDF-4 engine is h5netcdf (pure Python over h5py, no system netCDF library needed).

Nothing a user owns is replaced. An output path may be absent or an empty regular file; an
existing non-empty file is replaced only if fastslow-sim wrote it, as told by its content (never
its name): every file carries a mark, sniffed cheaply from its first (PDF: last) few KB.

* NetCDF-4/HDF5 (`save_dataset`): the root attribute `fastslow_sim_version` (or, in a dataset
  that `fastslow-sim figures` saved before every dataset carried it, `gallery_recipe`), and
  `fastslow_sim_digest`, a SHA-256 of the file's variables, their dimensions and every
  attribute as written: a file derived from one of ours (loaded, changed, combined, saved with
  the attributes kept) no longer matches it and is the user's, and so is one without the digest
  (saved before it existed: remove it to rerun);
* PNG, PDF, SVG (also gzipped), EPS/PS, TIFF, WebP (`analysis.save_figure`): the Software
  (PNG; TIFF and WebP: the Exif tag) or Creator metadata begins with `fastslow-sim` (JPEG, GIF,
  AVIF, raw and PGF figures carry no mark, so an existing one is never replaced);
* JSON (`save_json`): the object's first key is `fastslow_sim_version`; a JSON file without it
  is fastslow-sim's only when it lies in a run folder beside a checkpoint of fastslow-sim's
  (the run folders that `train-network` guards, written before the key existed) and begins
  with the first key ours had then (summary.json: `variant`, phi_vs_pst.json: `run`);
* torch checkpoints (zip): the pickled object holds the key `fastslow_sim_version`.

Anything else (a user's text, an image or HDF5 file without the mark, a corrupt or unreadable
file) is refused with one sentence, before any work (`check_writable`) and again just before
the rename. A symbolic link is followed: the file it points to is judged, and replaced.

A full disk ends in one `OSError` (ENOSPC) naming the target, never a half-written file: a
dataset whose numbers exceed the free space is refused before anything is written, and h5py
and torch.save write through `watched_file`, which keeps a failed write from them (h5py crashed
on one) and raises it after.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import math
import os
import re
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import xarray as xr

from ._version import __version__
from .errors import InputError
from .wording import bytes_text, short_repr

__all__ = ["save_dataset", "load_dataset", "save_json", "check_writable", "check_file_name",
           "check_parent",
           "atomic_path", "watched_file", "written_by_us", "MARK", "VERSION_KEY"]  # fmt: skip

ENGINE = "h5netcdf"
MARK = "fastslow-sim"  # how a figure's Creator/Software metadata begins
VERSION_KEY = "fastslow_sim_version"  # a dataset's root attribute, a JSON file's first key
DIGEST_KEY = "fastslow_sim_digest"  # a dataset's root attribute: `_content_digest` as written
# attributes that netCDF-4 keeps for itself (object references, ids), left out of the digest
_BOOKKEEPING = {DIGEST_KEY, "DIMENSION_LIST", "REFERENCE_LIST", "_Netcdf4Dimid",
                "_Netcdf4Coordinates", "_NCProperties", "CLASS", "NAME"}  # fmt: skip
# figure formats whose files carry no metadata that matplotlib lets us set
# (JPEG and GIF could carry a comment, but Pillow copies it into a file a user edits and saves)
UNMARKED_FORMATS = ("jpg", "jpeg", "gif", "avif", "raw", "rgba", "pgf")
_HEAD = 8192  # bytes read to sniff a file


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


def _sniff_hdf5(path: Path, head: bytes) -> bool:
    import h5py

    with h5py.File(path, "r") as f:  # gallery_recipe: a figure's dataset made before the mark
        # the mark without the digest is no proof: xarray keeps our version attribute on a
        # file it combined from ours (concat, merge) while dropping the digest
        if VERSION_KEY not in f.attrs and "gallery_recipe" not in f.attrs:
            return False
        if DIGEST_KEY not in f.attrs:
            return False
        stored = f.attrs[DIGEST_KEY]
        stored = stored.decode() if isinstance(stored, bytes) else str(stored)
        return stored == _content_digest(f)


def _content_digest(f) -> str:
    """SHA-256 of an open HDF5 file's datasets (name, dtype, shape, values) and attributes,
    netCDF's bookkeeping and the digest itself left out, in name order."""
    import h5py

    h = hashlib.sha256()

    def items(values):  # object arrays (variable-length strings or sequences), item by item
        for item in np.asarray(values, dtype=object).ravel():
            if isinstance(item, np.ndarray):
                h.update(f"{item.dtype}{item.shape}".encode() + item.tobytes())
            else:
                h.update(item if isinstance(item, bytes) else repr(item).encode())
            h.update(b"\0")

    def attrs(obj):
        for key in sorted(k for k in obj.attrs if k not in _BOOKKEEPING or k == "DIMENSION_LIST"):
            value = obj.attrs[key]
            h.update(f"{key}:{getattr(value, 'dtype', type(value).__name__)}=".encode())
            if key == "DIMENSION_LIST":  # a variable's dimensions, by the names of their scales
                h.update(repr([[f[ref].name for ref in refs] for refs in value]).encode())
            elif np.asarray(value).dtype.kind == "O":
                items(value)
            else:
                h.update(np.ascontiguousarray(np.asarray(value)).tobytes())
            h.update(b";")

    attrs(f)
    names = []
    f.visititems(lambda name, obj: names.append(name))
    for name in sorted(names):
        d = f[name]
        if not isinstance(d, h5py.Dataset):  # a group: its attributes
            h.update(f"<{name}>".encode())
            attrs(d)
            continue
        h.update(f"[{name}|{d.dtype}|{d.shape}]".encode())
        attrs(d)
        if d.dtype.kind == "O" or not d.shape:  # variable-length items, scalars
            values = np.asarray(d[()])
            if values.dtype.kind == "O":
                items(values)
            else:
                h.update(np.ascontiguousarray(values).tobytes())
            continue
        for block in _c_order_blocks(d.shape, d.dtype.itemsize):
            h.update(np.ascontiguousarray(d[block]).tobytes())
    return h.hexdigest()


def _c_order_blocks(shape, itemsize):
    """Index tuples that read an array of `shape` in C order, at most `_DIGEST_BLOCK` bytes
    each (one item of the last axis at least), whatever axis is long."""
    k = next(k for k in range(len(shape))
             if int(np.prod(shape[k + 1 :], dtype=np.int64)) * itemsize <= _DIGEST_BLOCK)  # fmt: skip
    inner = max(1, int(np.prod(shape[k + 1 :], dtype=np.int64)) * itemsize)
    step = max(1, _DIGEST_BLOCK // inner)
    for lead in np.ndindex(*shape[:k]):
        for i in range(0, shape[k], step):
            yield lead + (slice(i, i + step),)


_DIGEST_BLOCK = 32 * 2**20  # bytes of a dataset read at a time by `_content_digest`


def _sniff_png(path: Path, head: bytes) -> bool:
    """A tEXt or iTXt chunk `Software` beginning with the mark, before the image data."""
    i = 8
    while i + 8 <= len(head):
        n, kind = int.from_bytes(head[i : i + 4], "big"), head[i + 4 : i + 8]
        if kind == b"IDAT":
            break
        data = head[i + 8 : i + 8 + n]
        key, _, text = data.partition(b"\0")
        if kind == b"iTXt":  # compression flag and method, language and translated keyword
            text = text[2:].split(b"\0", 2)[-1] if text[:1] == b"\0" else b""
        if kind in (b"tEXt", b"iTXt") and key == b"Software" and text.startswith(_MARK_BYTES):
            return True
        i += 12 + n
    return False


_MARK_BYTES = (MARK + " ").encode()  # "fastslow-sim 0.1.0 (Matplotlib ...)", not "fastslow-simx"
_PDF_CREATOR = re.compile(rb"/(?:Creator|Producer)\s*\(" + re.escape(_MARK_BYTES))


def _sniff_pdf(path: Path, head: bytes) -> bool:
    """The Info dictionary's Creator or Producer, which matplotlib writes just before the
    cross-reference table at the end: the last few KB, and those before `startxref`'s offset."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _HEAD))
        tail = f.read()
        if _PDF_CREATOR.search(tail):
            return True
        found = re.findall(rb"startxref\s+(\d+)", tail)
        if not found:
            return False
        xref = min(int(found[-1]), size)
        f.seek(max(0, xref - _HEAD))
        return bool(_PDF_CREATOR.search(f.read(xref - f.tell())))


def _sniff_ps(path: Path, head: bytes) -> bool:
    return re.search(rb"^%%Creator: " + re.escape(_MARK_BYTES), head, re.M) is not None


_SVG_CREATOR = re.compile(
    rb"<dc:creator>\s*<cc:Agent>\s*<dc:title>" + re.escape(_MARK_BYTES)
)


def _sniff_svg(path: Path, head: bytes) -> bool:
    return b"<svg" in head and _SVG_CREATOR.search(head) is not None


def _sniff_gzip(path: Path, head: bytes) -> bool:  # svgz
    return _sniff_svg(path, zlib.decompressobj(wbits=31).decompress(head, _HEAD))


def _sniff_zip(path: Path, head: bytes) -> bool:
    """A torch checkpoint: its pickle (`*/data.pkl`, the tensors are apart) names the key
    (read as bytes: a foreign pickle is never unpickled)."""
    with zipfile.ZipFile(path) as z:
        pickles = [n for n in z.namelist() if n.endswith("/data.pkl")]
        return len(pickles) == 1 and VERSION_KEY.encode() in z.read(pickles[0])


_JSON_MARKED = re.compile(rb'\A\s*\{\s*"' + VERSION_KEY.encode() + rb'"\s*:')


def _sniff_json(path: Path, head: bytes) -> bool:
    if _JSON_MARKED.match(head):
        return True
    # an older run folder: our checkpoint sits beside it, and the file begins as ours began
    first = _RUN_FOLDER_JSON.get(path.name)
    if first is None or not re.match(rb'\A\s*\{\s*"' + first + rb'"\s*:', head):
        return False
    beside = path.parent / "ckpt.pt"
    return beside.is_file() and written_by_us(beside)


# what a run folder of ours holds, and the first key of each before the mark existed
_RUN_FOLDER_JSON = {"summary.json": b"variant", "phi_vs_pst.json": b"run"}


def _sniff_pil(path: Path, head: bytes) -> bool:
    """TIFF and WebP: the Exif/TIFF Software tag (305) begins with the mark. Pillow reads only
    the headers here, not the pixels (its warnings on a corrupt file are not the user's)."""
    import warnings

    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Image.open(path) as im:
            if im.format not in ("TIFF", "WEBP"):
                return False
            software = str(im.getexif().get(305, "")).encode()
    return software.startswith(_MARK_BYTES)


_SNIFFERS = ((b"\x89HDF\r\n\x1a\n", _sniff_hdf5), (b"\x89PNG\r\n\x1a\n", _sniff_png),
             (b"%PDF-", _sniff_pdf), (b"%!PS-Adobe", _sniff_ps), (b"\x1f\x8b", _sniff_gzip),
             (b"PK\x03\x04", _sniff_zip), (b"<?xml", _sniff_svg), (b"<svg", _sniff_svg),
             (b"{", _sniff_json), (b"[", _sniff_json), (b"II*\x00", _sniff_pil),
             (b"MM\x00*", _sniff_pil), (b"RIFF", _sniff_pil))  # fmt: skip


def written_by_us(path) -> bool:
    """Whether the regular file at `path` (a link followed) was written by fastslow-sim, told
    from its first bytes (module docstring); an unreadable or corrupt file is not."""
    return _sniff(path) is True


def _sniff(path) -> bool | None:
    """`written_by_us`, and None for a file that begins as a format the sniffers know but fails
    to parse (cut short, damaged): whoever wrote it, it no longer shows."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD)
    except OSError:
        return False
    start = head.lstrip()
    for magic, sniff in _SNIFFERS:
        if (start if magic[:1] in b"<{[" else head).startswith(magic):
            try:
                return bool(sniff(Path(path), head))
            except Exception:  # noqa: BLE001 - whatever fails to parse is not ours
                return None
    return False


def _check_owned(p: Path, what: str):
    """`InputError` when the regular file at `p` is not empty and not fastslow-sim's."""
    ours = False
    try:
        if not p.is_file() or p.stat().st_size == 0 or (ours := _sniff(p)):
            return
    except OSError:
        pass
    link = f" (a link to {os.path.realpath(p)!r})" if p.is_symlink() else ""
    fmt = p.suffix.lstrip(".").lower()
    why = (f"; a .{fmt} figure carries no mark of who wrote it, so" if fmt in UNMARKED_FORMATS
           and what in ("plot", "figure") else " that fastslow-sim did not write;")  # fmt: skip
    if ours is None:  # a truncated dataset of ours reads as no one's: not "did not write"
        why = " that cannot be read (damaged or cut short), so nothing shows who wrote it, and"
    raise InputError(
        f"the {what} path {str(p)!r}{link} holds a file{why} it is never replaced: remove it or "
        f"choose another path."
    )


_EXAMPLE_NAMES = {"dataset": "dataset.nc", "plot": "plot.png", "figure": "figure.png"}


def check_file_name(path, what="output") -> None:
    """`InputError` when the text of `path` ends in a path separator: it names a folder, and
    `Path` drops the separator, so the file would take the folder's name (`--out nd/` wrote an
    HDF5 file `nd`). Outputs that are folders (run folders, sweep stores) are checked with
    `check_parent`, which takes the separator."""
    text = os.fsdecode(path) if isinstance(path, (str, bytes)) else ""  # a Path never ends in one
    if not text.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)) and \
            os.path.basename(text) not in (".", ".."):  # `nd/.`: Path makes it `nd`
        return
    folder = text.rstrip(os.sep + (os.altsep or "")) or text
    if os.path.basename(folder) in (".", ".."):
        folder = os.path.normpath(folder)
    example = _EXAMPLE_NAMES.get(what)
    raise InputError(
        f"the {what} path {text!r} names a folder; expected a file name"
        + (f" such as {os.path.join(folder, example)}." if example else " in it.")
    )


def check_writable(path, what="output", probe: bool = True) -> Path:
    """Raise `InputError` unless `path` can be created or replaced: it is absent, an empty
    regular file or one that fastslow-sim wrote (`written_by_us`; never a directory, device,
    FIFO, socket or a file of the user's), and its folder exists and is writable. For a
    symbolic link that folder is the one of the file it points to (which `atomic_path`
    writes). `probe=False`: the folder is not probed with a new file (`check_parent`). A path
    that ends in a separator names a folder (`check_file_name`)."""
    check_file_name(path, what)
    p = Path(path)
    real, parent = _written(p)
    try:
        os.stat(p)
    except FileNotFoundError:
        pass
    except OSError as err:  # a loop of links, a name too long, a component that is a file
        raise InputError(f"cannot write the {what} {str(p)!r}: {err.strerror}.") from None
    longest = _name_max(parent) - _TEMP_EXTRA
    size = len(os.fsencode(real.name))  # the bytes on disk: a non-UTF-8 name is no error
    if size > longest:
        raise InputError(
            f"the {what} path {str(p)!r} has a file name of {size} bytes; "
            f"expected at most {longest} (the file system's limit, less room for the temporary "
            f"name it is written under)."
        )
    if p.is_dir():
        raise InputError(f"the {what} path {str(p)!r} is a directory; expected a file name.")
    kind = _special(p)
    if kind is not None:
        raise InputError(
            f"the {what} path {str(p)!r} is a {kind}, not a regular file; expected a new or "
            f"regular file (it is never replaced)."
        )
    _check_owned(p, what)
    if p.is_file() and not os.stat(p).st_mode & 0o222:
        raise InputError(
            f"the {what} path {str(p)!r} is read-only (no write permission); it is never "
            f"replaced: make it writable or choose another path."
        )
    check_parent(p, what, probe)
    return p


def _written(p: Path) -> tuple[Path, Path]:
    """The file that a write to `p` makes (a symbolic link: the file it points to, which
    `atomic_path` replaces) and its folder."""
    real = Path(os.path.realpath(p)) if p.is_symlink() else p
    return real, real.parent if str(real.parent) else Path(".")


def check_parent(path, what="output", probe: bool = True) -> Path:
    """Raise `InputError` unless the folder that holds `path` (a symbolic link: the file it
    points to) exists and takes new entries (an output's folders are never made silently: a
    typo in one would scatter the results); a folder whose file system takes no new file (no
    free inodes, no space, a quota used up) is an `OSError` (ENOSPC, EDQUOT) naming the folder
    and why, not bad input. `probe=False` trusts the permissions and creates no probe file (as
    `atomic_path` checks again once its temporary file, which holds the last free inode
    perhaps, proved that the folder takes files)."""
    p = Path(path)
    real, parent = _written(p)
    shown = f"{str(p)!r} (a link to {str(real)!r})" if real is not p else repr(str(p))
    if not parent.exists():
        raise InputError(f"cannot write the {what} {shown}: folder {str(parent)!r} does not exist.")
    err = _create_error(parent) if probe and os.access(parent, os.W_OK) else None
    if err is not None and err.errno in _FULL:  # not the user's input: a full file system
        raise OSError(err.errno, f"{os.strerror(err.errno)} (no new file can be created in this "
                      f"folder for the {what} {shown}: {_full_why(parent, err.errno)})",
                      str(parent))  # fmt: skip
    if not os.access(parent, os.W_OK) or err is not None:
        raise InputError(f"cannot write the {what} {shown}: folder {str(parent)!r} is not writable.")
    return p


def creation_error(err: OSError, path, what: str) -> Exception:
    """The error to raise for `err`, from making the folder `path` (the `what`): a full file
    system (ENOSPC, EDQUOT) or an I/O error is an `OSError` naming `path` (a file operation
    that failed, exit status 1); anything else (no permission, a file where a folder is
    expected) is the user's input, an `InputError`."""
    if err.errno in WRITE_FAILED:
        text = err.strerror or os.strerror(err.errno)
        if err.errno in _FULL:
            near = Path(os.path.abspath(path))
            while not near.exists() and near != near.parent:
                near = near.parent
            text = f"{text} (the {what} cannot be made: {_full_why(near, err.errno)})"
        return OSError(err.errno, text, str(path))
    return InputError(f"cannot create the {what} {str(path)!r}: {err.strerror}.")


def _full_why(folder: Path, code: int) -> str:
    """Why no file can be created in `folder` whose creation failed with ENOSPC or EDQUOT."""
    if code == errno.EDQUOT:
        return "the disk quota is used up"
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return "its file system is full"
    if st.f_files > 0 and st.f_ffree == 0:
        return "its file system has no free inodes"
    return f"its file system has {bytes_text(_free_bytes(folder))} free"


_TEMP_EXTRA = 15  # ".NAME.XXXXXXXX.part": what `atomic_path`'s temporary name adds


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system of `folder` takes (255 where unknown)."""
    try:
        return os.pathconf(folder if folder.exists() else ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _create_error(folder: Path) -> OSError | None:
    """Why no file can really be created in `folder` (root passes `os.access` everywhere, also
    on a read-only mount such as /sys; a file system without free inodes takes no new file),
    or None when one can."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".fastslow-probe-", dir=folder)
    except OSError as err:
        return err
    os.close(fd)
    os.unlink(probe)
    return None


@contextlib.contextmanager
def atomic_path(path, what="output"):
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds
    and `path` is still absent or a file that may be replaced (`check_writable`): a rename
    replaces whatever sits at the target, and onto `/dev/full` it would replace the device with
    a regular file, or a user's file with ours (`InputError` instead). A symbolic link is
    followed, so the file it points to is replaced, not the link."""
    check_file_name(path, what)  # before realpath drops the separator
    path = Path(os.path.realpath(path))
    check_writable(path, what)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        # the bytes on the disk before the name (a crash leaves the old file or the new), while
        # the file is still mkstemp's 0600 and ours to open (a umask may leave it no permission)
        _fsync(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual permissions
        # once more: something may have appeared there meanwhile (no probe file: the temporary
        # file showed that the folder takes files, and may hold its last free inode)
        check_writable(path, what, probe=False)
        os.replace(tmp, path)
        _fsync(path.parent, strict=False)  # and the rename itself (the file is in place now)
    except OSError as err:
        if err.errno not in WRITE_FAILED or err.filename == str(path):
            raise
        # a full disk or an I/O error names the file asked for, not the temporary one (or
        # none, as write does)
        raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)


def _fsync(path: Path, strict: bool = True):
    """Flush `path` (a file or a folder) to its disk. A full disk or an I/O error raises
    (`strict`) an OSError naming `path`; where the file system cannot flush (EINVAL, EBADF
    on some systems' folders), the write stands as the operating system keeps it. A file
    that cannot be opened to read (no read permission) is opened to write; one that cannot be
    opened at all raises (`strict`): its flush is never skipped silently."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        if not strict or os.path.isdir(path):
            return
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            raise OSError(err.errno, err.strerror, str(path)) from None
    try:
        os.fsync(fd)
    except OSError as err:
        if strict and err.errno in WRITE_FAILED:  # the data did not reach the disk
            raise OSError(err.errno, err.strerror, str(path)) from None
    finally:
        os.close(fd)


_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left on the device, or in the user's quota
WRITE_FAILED = (*_FULL, errno.EIO)  # a write that failed: a full disk or the device's error


def _free_bytes(folder: Path) -> int:
    """The bytes this process may still write on the file system of `folder` (root may also
    use the blocks reserved for it)."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # not told: the write itself finds out (`_SpaceWatch`)
        return 2**63
    return st.f_frsize * (st.f_bfree if os.geteuid() == 0 else st.f_bavail)


def _check_space(path: Path, need: int, what: str):
    """`OSError(ENOSPC)` naming `path` when its file system has fewer than `need` bytes free
    (`need`: a lower bound of the file's size), before anything is written."""
    free = _free_bytes(Path(os.path.realpath(path)).parent)  # a link's target's file system
    if free < need:
        raise OSError(errno.ENOSPC, f"No space left on device (the {what} needs at least "
                      f"{bytes_text(need)}; its file system has {bytes_text(free)} free)",
                      str(path))  # fmt: skip


@contextlib.contextmanager
def watched_file(tmp, path, mode: str = "w+"):
    """Yield `tmp` opened for a writer that must not see a failed write (h5py, torch.save:
    `_SpaceWatch`); on leaving, the first write error is raised as an `OSError` naming `path`
    (also when the writer then failed on what it read back)."""
    f = _SpaceWatch(tmp, mode)
    try:
        with f:
            yield f
    except Exception:
        if f.error is None:
            raise
    if f.error is not None:
        err = f.error
        raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from None


class _SpaceWatch(io.FileIO):
    """A file for h5py's file-object driver that never tells HDF5 a write failed: the first
    OSError (a full disk) is kept in `error` and later writes are dropped, so that HDF5 ends and
    closes its file as usual and the caller raises `error` after. With the error raised inside
    HDF5 (on a path), h5py's file failed to close and h5netcdf closed it again when the
    exception was freed: the interpreter crashed (a segmentation fault, exit status 139)."""

    error: OSError | None = None

    def _keep(self, err: OSError):
        if self.error is None:
            self.error = err

    def write(self, b):
        """Write all of `b` or keep the error: h5py and torch ignore the count a write returns,
        so a short write (a disk that fills, or frees, part way) must not pass unnoticed."""
        view = memoryview(b).cast("B")
        done = 0
        while self.error is None and done < view.nbytes:
            try:
                wrote = self._write_some(view[done:])
            except OSError as err:
                self._keep(err)
                break
            if not wrote:  # nothing written and no error: a device that takes no more
                self._keep(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
            done += wrote or 0
        return view.nbytes

    def _write_some(self, view) -> int | None:
        return super().write(view)

    def truncate(self, size=None):
        try:
            return super().truncate(size)
        except OSError as err:
            self._keep(err)
            return self.tell() if size is None else size

    def flush(self):
        try:
            super().flush()
        except OSError as err:
            self._keep(err)


def _attr_value(v):
    """`v` as a NetCDF-4 attribute holds it, or `_UNWRITABLE`: a bool as 0 or 1 (NetCDF has no
    bool), None as "", a list of strings (or a numpy array of them) as a list of Python str
    (h5netcdf writes it as variable-length strings, read back as a list: one of one string is
    named in `STRING_LISTS_KEY` for `load_dataset`; numpy's fixed-width
    `<U` array has no HDF5 type), a list of numbers as a numpy array. A dict, a list mixing
    strings and numbers or holding None, an integer beyond 64 bits, any other object: none."""
    if v is None:
        return ""
    if isinstance(v, (str, bytes)):
        return v
    if isinstance(v, np.ndarray) and v.dtype.kind in "USO":
        v = v.tolist()  # a 0-d array: its one str or bytes
        if isinstance(v, (str, bytes)):
            return v
    if isinstance(v, (list, tuple)) and v:
        for kind in (str, bytes):
            if all(isinstance(x, kind) for x in v):
                return [kind(x) for x in v]  # np.str_ entries too: plain str
    try:
        a = np.asarray(v)
    except (TypeError, ValueError):  # a ragged list
        return _UNWRITABLE
    if a.dtype.kind not in "biufc":  # object (None, dict, mixed), strings mixed with numbers
        return _UNWRITABLE
    if a.dtype.kind == "b":
        return a.astype(int) if a.ndim else int(v)
    return a if isinstance(v, (list, tuple)) else v


_UNWRITABLE = object()


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


STRING_LISTS_KEY = "fastslow_sim_string_lists"  # [[variable or None, attribute], ...]


def _one_string_list(v) -> bool:
    return isinstance(v, list) and len(v) == 1 and isinstance(v[0], str)


def _clean_attrs(attrs: dict, variable: str | None = None) -> dict:
    """`attrs` as `save_dataset` writes them (`_attr_value`); `InputError` naming the first one
    that a NetCDF-4 file cannot hold, before any file is made."""
    out = {}
    for k, v in attrs.items():
        out[k] = _attr_value(v)
        if out[k] is _UNWRITABLE:
            which = (f"the dataset attribute {k!r}" if variable is None else
                     f"the attribute {k!r} of the dataset variable {variable!r}")  # fmt: skip
            raise InputError(
                f"{which} is {_a(type(v).__name__)}, {short_repr(v)}, which a NetCDF-4 file cannot "
                f"hold; expected a string, a number (an integer within 64 bits), or a list of only "
                f"numbers or only strings."
            )
    return out


def save_dataset(ds: xr.Dataset, path) -> Path:
    """Write `ds` to NetCDF-4 at `path`, atomically, with the root attribute
    `fastslow_sim_version` (this version's, unless `ds` names the one that computed it)."""
    if not isinstance(ds, xr.Dataset):  # refused before any file is made
        raise InputError(f"save_dataset writes an xarray.Dataset (what integrate returns); got "
                         f"a {type(ds).__name__}, {short_repr(ds)}.")  # fmt: skip
    ds = ds.copy()  # attributes it cannot write: refused before the path is probed
    ds.attrs = _clean_attrs({**ds.attrs, VERSION_KEY: ds.attrs.get(VERSION_KEY, __version__)})
    for name in ds.variables:
        ds[name].attrs = _clean_attrs(ds[name].attrs, str(name))
    # NetCDF reads a list of one string back as the string: named here, restored on load
    ones = [[None, k] for k, v in ds.attrs.items() if _one_string_list(v)]
    ones += [[str(n), k] for n in ds.variables for k, v in ds[n].attrs.items() if _one_string_list(v)]
    ds.attrs.pop(STRING_LISTS_KEY, None)
    if ones:
        ds.attrs[STRING_LISTS_KEY] = json.dumps(ones)
    path = check_writable(path, "dataset")
    ds.attrs.pop(DIGEST_KEY, None)  # a loaded dataset's: the new file gets its own
    # the file holds at least the numbers' bytes (uncompressed): refused before any is written
    _check_space(path, sum(v.nbytes for v in ds.variables.values() if v.dtype.kind in "biufcmM"),
                 "dataset")  # fmt: skip
    with atomic_path(path, "dataset") as tmp:
        import dask
        import h5py

        # HDF5 writes through the file object (`_SpaceWatch`); in this process: under a
        # distributed client xarray ships the write to the cluster, which cannot pickle it
        with watched_file(tmp, path) as f, dask.config.set(scheduler="synchronous"):
            ds.to_netcdf(f, engine=ENGINE)
        with watched_file(tmp, path, "r+") as f, h5py.File(f, "r+") as h5:
            h5.attrs[DIGEST_KEY] = _content_digest(h5)  # of the file as written, read back
    return path


def _finite(v):
    """`v` with every non-finite float as None, numpy and torch values as Python ones."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if hasattr(v, "tolist"):  # numpy scalars and arrays, torch tensors: Python values
        return _finite(v.tolist())
    return v


def strict_json(obj, indent: int | None = None) -> str:
    """Strict JSON (RFC 8259 has no NaN or Infinity): non-finite numbers become null."""
    return json.dumps(_finite(obj), allow_nan=False, default=float, indent=indent)


def save_json(obj: dict, path, what="output", indent: int | None = 1) -> Path:
    """Write the JSON object `obj` to `path`, atomically, as strict JSON (`strict_json`: a NaN
    is null), its first key `fastslow_sim_version` (the mark that lets a later run replace it)."""
    with atomic_path(path, what) as tmp:
        tmp.write_text(strict_json({VERSION_KEY: __version__, **obj}, indent=indent))
    return Path(path)


def load_dataset(path) -> xr.Dataset:
    """Read a dataset written by `save_dataset` (fully loaded into memory, file closed)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"no dataset at {str(p)!r}.")
    try:
        with xr.open_dataset(p, engine=ENGINE) as ds:
            ds = ds.load()
    except OSError as err:
        if err.errno is not None:  # the read itself failed (EIO, EACCES): a file operation
            err.filename = err.filename or str(p)
            raise
        # h5py's "file signature not found" and the like name no file and no errno
        raise InputError(f"the file {str(p)!r} is not a NetCDF-4 dataset that can be read "
                         f"({' '.join(str(err).split()) or type(err).__name__}); expected a "
                         f"dataset that fastslow-sim wrote.") from None  # fmt: skip
    try:
        ones = json.loads(ds.attrs.pop(STRING_LISTS_KEY, "[]"))
    except (TypeError, ValueError):
        ones = []
    for name, key in ones if isinstance(ones, list) else []:
        attrs = ds.attrs if name is None else ds[name].attrs if name in ds.variables else {}
        if isinstance(attrs.get(key), str):
            attrs[key] = [attrs[key]]
    return ds
