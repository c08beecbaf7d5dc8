"""Give figures that fastslow-sim wrote before it marked its files the mark it writes now.

    python scripts/mark_figures.py figures/*.png figures/*.pdf

A later run replaces a file only if fastslow-sim wrote it, told from its content
(`fastslow_sim.io`): `save_figure` names fastslow-sim in a PNG's Software text and a PDF's
Creator. The committed figures/ were made by `fastslow-sim figures` before that, so they name
Matplotlib only, and `fastslow-sim figures` would refuse to replace them. This rewrites that one
text in place, nothing else (the pixels and drawing are untouched): the Software tEXt chunk of a
PNG (its CRC recomputed), the Creator of a PDF's Info dictionary (the cross-reference offsets
after it shifted). The new text is the one `save_figure` writes, so the bytes are those that
regenerating the same figure gives. A file that is not a Matplotlib PNG or PDF is left alone.
"""

from __future__ import annotations

import re
import sys
import zlib
from pathlib import Path

import matplotlib

from fastslow_sim import __version__
from fastslow_sim.io import MARK, written_by_us

CREATOR = f"{MARK} {__version__} (Matplotlib v{matplotlib.__version__})"


def mark_png(data: bytes) -> bytes | None:
    i, out = 8, [data[:8]]
    while i < len(data):
        n, kind = int.from_bytes(data[i : i + 4], "big"), data[i + 4 : i + 8]
        chunk = data[i : i + 12 + n]
        if kind == b"tEXt" and chunk[8:].startswith(b"Software\0Matplotlib"):
            body = b"tEXt" + b"Software\0" + CREATOR.encode("latin-1")
            chunk = (len(body) - 4).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")
            return b"".join(out) + chunk + data[i + 12 + n :]
        out.append(chunk)
        i += 12 + n
    return None


def mark_pdf(data: bytes) -> bytes | None:
    old = re.search(rb"/Creator \((Matplotlib v[^()\\]*)\)", data)
    xref = re.search(rb"\nxref\n0 (\d+)\n", data)
    start = re.search(rb"startxref\n(\d+)\n%%EOF\n?\Z", data)
    if not (old and xref and start) or int(start[1]) != xref.start() + 1:
        return None
    new = CREATOR.encode("latin-1")
    shift, at = len(new) - len(old[1]), old.start(1)
    rows = xref.end()
    table = data[rows : rows + 20 * int(xref[1])]

    def moved(row: bytes) -> bytes:
        offset = int(row[:10])
        return b"%010d" % (offset + shift if offset > at and row[17:18] == b"n" else offset) + row[10:]

    table = b"".join(moved(table[k : k + 20]) for k in range(0, len(table), 20))
    tail = data[rows + len(table) : start.start(1)] + b"%d\n%%%%EOF\n" % (int(start[1]) + shift)
    return data[:at] + new + data[old.end(1) : rows] + table + tail


def main(paths):
    for p in map(Path, paths):
        data = p.read_bytes()
        marked = (mark_png if data.startswith(b"\x89PNG") else mark_pdf)(data)
        if marked is None:
            print(f"{p}: left alone (not a Matplotlib PNG or PDF, or marked already)")
            continue
        p.write_bytes(marked)
        print(f"{p}: marked ({'ours' if written_by_us(p) else 'NOT RECOGNISED'})")


if __name__ == "__main__":
    main(sys.argv[1:])
