"""Reading a file a user names: a regular file only, and never more bytes than a limit.

Shared by ``document.read.read``, ``data``'s split reader and the featurizer bundle header
(``plan/featurizer_files``), which wrap a ``NotRegular`` or ``TooLarge`` in their own typed
refusal. A size from ``stat`` bounds nothing on its own: ``/dev/zero`` (or a symlink to it)
reports 0 bytes and reads forever, a FIFO reports 0 and blocks until someone writes, and a
file may grow after it was measured. So the kind of file is checked after following
symlinks and before opening (opening some devices does something), checked again on the
descriptor opened (the name may have been swapped in between), and read to at most
``limit + 1`` bytes. Standard library only.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, Optional, Union

PathLike = Union[str, Path]


class NotRegular(ValueError):
    """The path is something other than a regular file. ``str()`` is the predicate, for a
    sentence that names the path itself: "is a FIFO (named pipe), not a regular file", or
    "is a symlink to /dev/zero, a character device, not a regular file"."""

    def __init__(self, path: PathLike, what: str):
        link = f"a symlink to {os.path.realpath(path)}, " if os.path.islink(path) else ""
        super().__init__(f"is {link}{what}, not a regular file")
        self.what = what


class TooLarge(ValueError):
    """The file holds more than the limit: ``size`` bytes, or at least that many (``at_least``) when
    it grew past the limit while being read."""

    def __init__(self, size: int, at_least: bool = False):
        super().__init__(f"{'more than ' if at_least else ''}{size} bytes")
        self.size, self.at_least = size, at_least


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> Optional[str]:
    """What a file of this mode is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def check_regular(path: PathLike) -> os.stat_result:
    """The file's stat (symlinks followed), refusing anything but a regular file; an ``OSError``
    (missing, no permission, a symlink loop) propagates for the caller to word."""
    st = os.stat(path)
    what = kind(st.st_mode)
    if what is not None:
        raise NotRegular(path, what)
    return st


def open_regular(path: PathLike) -> BinaryIO:
    """``path`` opened for binary reading, refused unless it is a regular file before and after opening."""
    check_regular(path)
    # The builtin open, not os.open with O_NONBLOCK: only a FIFO swapped in between the check
    # and this line could block it, and the tests' audit of who opens a weights file reads
    # the mode the builtin open reports (os.open reports none).
    fh = open(path, "rb")
    try:
        what = kind(os.fstat(fh.fileno()).st_mode)
        if what is not None:
            raise NotRegular(path, what)
    except BaseException:
        fh.close()
        raise
    return fh


def read_bytes(path: PathLike, limit: int) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes; ``TooLarge`` past it, measured both
    before reading and by what the read returned."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise TooLarge(size)
        # What stat said, plus one byte to see whether there is more; read(limit + 1) would
        # allocate the whole limit up front, for a file of a few bytes.
        data = fh.read(size + 1)
        if len(data) > size:  # it grew, or it is a /proc-like file that reports 0: read on, bounded
            chunks, total = [data], len(data)
            while total <= limit:
                chunk = fh.read(min(_CHUNK, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > limit:
                raise TooLarge(limit, at_least=True)
            data = b"".join(chunks)
    return data


_CHUNK = 1 << 20
