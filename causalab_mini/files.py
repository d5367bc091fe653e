"""Writing a file whole: a temporary name beside it, flushed to disk, renamed into place.

Shared by the run writer (``outputs/write.py``) and the plugin's baselines, so both leave
either the old file or the new one — never half of one — and both give the new file
the permissions the user's umask asks for (``mkstemp`` alone makes every file 0600).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

TMP_SUFFIX = ".tmp"


def tmp_prefix(name: str) -> str:
    """The prefix of a temporary file standing in for ``name`` (orphans are found by it)."""
    return f".{name}."


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` afterwards, or is as it was: a kill or a full disk leaves no half file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=tmp_prefix(path.name), suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
