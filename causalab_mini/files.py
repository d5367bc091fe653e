"""Writing a file whole: a temporary name beside it, flushed to disk, renamed into place.

Shared by the run writer (``outputs/write.py``) and the plugin's baselines, so both leave
either the old file or the new one — never half of one — and both give the new file
the permissions the user's umask asks for (``mkstemp`` alone makes every file 0600).

A run writes many files and needs them on disk only before its commit record: it writes them
without a flush each (``write_atomic(..., durable=False)``, ``write_new``) and makes them all
durable at once with one ``barrier``.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Iterable

TMP_SUFFIX = ".tmp"


def tmp_prefix(name: str) -> str:
    """The prefix of a temporary file standing in for ``name`` (orphans are found by it)."""
    return f".{name}."


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """``path`` holds ``data`` afterwards, or is as it was: a kill or a full disk leaves no half file.
    ``durable``: flushed to the disk before the rename (False: a later ``barrier`` does it)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=tmp_prefix(path.name), suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_new(path: Path, data: bytes) -> None:
    """``data`` into a new file at ``path`` (the umask's permissions), not flushed: for a file in a
    folder nothing reads until a commit moves it (a run's staging folder), which a ``barrier``
    makes durable before the commit."""
    with open(path, "wb") as fh:
        fh.write(data)


_SYNCFS = None  # libc's syncfs, looked up on first use (Linux)


def _syncfs():
    global _SYNCFS
    if _SYNCFS is None:
        _SYNCFS = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                call = ctypes.CDLL(None, use_errno=True).syncfs
                call.argtypes = [ctypes.c_int]
                _SYNCFS = call
            except (OSError, AttributeError):  # no libc symbol (an old or unusual libc)
                pass
    return _SYNCFS


FEW = 16  # files a barrier flushes one by one; more, and one syncfs flushes the filesystem


def barrier(folder: Path, written: Iterable[Path] = ()) -> None:
    """Every file in ``written`` (all under ``folder``) reaches the disk before this returns.

    Many files: one ``syncfs`` of the folder's filesystem on Linux — one flush, however many files
    a sweep wrote. A few (a pytest item's point, a small run): an ``fsync`` of each and of the
    folders holding them, since a ``syncfs`` also flushes every other writer's pages on that
    filesystem, which on a busy machine costs more than a handful of files. Off Linux, always the
    latter."""
    written = list(written)
    syncfs = _syncfs() if len(written) > FEW else None
    if syncfs:
        fd = os.open(folder, os.O_RDONLY)
        try:
            if syncfs(fd) != 0:
                import ctypes

                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(folder))
        finally:
            os.close(fd)
        return
    folders = set()
    for path in written:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        folders.add(Path(path).parent)
    for path in sorted(folders | {Path(folder)}):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # a platform that cannot open a folder (Windows): its rename is durable enough
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
