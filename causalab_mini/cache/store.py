"""The cache folder: one entry per key, each naming its files by content.

::

    DIR/entries/<key>.json   the entry: format, key, parts, the blob of every scored metric
                             (step, name, file, rows) and the point's saved files, each as
                             (sha256, size)
    DIR/blobs/<sha256>       a saved file's bytes, or the scored metrics' JSON, named by their digest

Every byte a hit serves comes out of a blob whose digest is checked as it is read: the rows the
run reports and its expectations and baselines are held to as much as the files it writes. An
entry edited to say other rows names a blob that is not there (a miss); rows whose JSON text is not
that of the metric files saved beside them are a miss too (1 and 1.0 compare equal, but differ).

A file is written whole under a temporary name and renamed into place (``files.write_atomic``),
blobs before the entry that names them, so a reader finds either no entry or one whose blobs are
all there. Two runs storing one key write the same bytes under the same names: the last rename
wins and nothing is mixed. Every read is checked — the entry parses, its key and parts are the
ones asked for, each blob has its digest — and anything else is a miss, which the run then
replaces. Blobs no entry names any more stay until the folder is removed.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from ..files import TMP_SUFFIX, write_atomic
from ..formats import TENSORS, find, format_of
from ..outputs.results import Result, Scored
from ..reading import NotRegular, TooLarge, read_bytes
from .key import FORMAT, CacheError

ENTRIES = "entries"
BLOBS = "blobs"
ENTRY_LIMIT = 64 << 20  # bytes of one entry: parts and references, never the results themselves
ORPHAN_AGE = 3600.0  # seconds: a temporary file this old belongs to a write that was killed


@dataclass(frozen=True)
class Entry:
    """One point's results: every metric it scored, and the files it saves (paths relative to the
    point's folder, in the order a run writes them; its document.json is not one)."""

    scored: tuple
    files: dict

    def tensors(self) -> dict[str, dict[str, Any]]:
        """The saved tensors by file path, as ``open`` reads them back: ``{file: {name: tensor}}``."""
        return {rel: format_of(rel).load(data) for rel, data in self.files.items()
                if format_of(rel).holds == TENSORS}


class Store:
    """A cache folder, made if missing; one that cannot be used is refused here, naming it."""

    def __init__(self, directory) -> None:
        self.root = Path(directory)
        if self.root.exists() and not self.root.is_dir():
            raise CacheError(str(self.root), "is a file, and a result cache is a folder",
                             "name a folder (it is made if missing)")
        try:
            for sub in (ENTRIES, BLOBS):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CacheError(str(self.root), f"cannot be used as a result cache ({err.strerror or err})",
                             "name a folder you can write") from None
        for sub in (self.root / ENTRIES, self.root / BLOBS):
            if not os.access(sub, os.W_OK | os.X_OK):
                raise CacheError(str(sub), "cannot be written into", "name a cache folder you can write")
        self._sweep_orphans()

    def _sweep_orphans(self) -> None:
        """Remove the temporary files of writes that were killed before their rename. A writer's
        own is seconds old; one older than ``ORPHAN_AGE`` is nobody's."""
        now = time.time()
        for sub in (self.root / ENTRIES, self.root / BLOBS):
            for tmp in sub.glob(f".*{TMP_SUFFIX}"):
                try:
                    if now - tmp.stat().st_mtime > ORPHAN_AGE:
                        tmp.unlink()
                except OSError:  # gone already (another run swept it), or not ours to remove
                    pass

    def entry_path(self, key: str) -> Path:
        return self.root / ENTRIES / f"{key}.json"

    def get(self, key: str, parts: Mapping) -> Optional[Entry]:
        """The entry stored under ``key``, or None: absent, damaged, or not for these parts."""
        try:  # a regular file of bounded size: a FIFO or /dev/zero planted there is a miss, not a hang
            text = read_bytes(self.entry_path(key), ENTRY_LIMIT)
        except (OSError, NotRegular, TooLarge):  # absent, unreadable, not an entry: computed, stored again
            return None
        try:
            return self._checked(json.loads(text), key, parts)
        except (OSError, ValueError, KeyError, TypeError, RecursionError):  # a damaged entry is a miss, never a crash
            return None

    def _checked(self, raw: Any, key: str, parts: Mapping) -> Entry:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("key") != key:
            raise ValueError("not an entry of this format and key")
        if raw.get("parts") != parts:
            raise ValueError("stored for other parts")
        scored = []
        for s in json.loads(self._blob(raw["scored"])):
            if not (isinstance(s["step"], str) and isinstance(s["name"], str)
                    and (s["file"] is None or isinstance(s["file"], str))
                    and isinstance(s["rows"], list) and all(isinstance(r, dict) for r in s["rows"])):
                raise ValueError("a scored metric is malformed")
            scored.append(Scored(s["step"], s["name"], Result(s["name"], s["rows"]), s["file"]))
        files = {}
        for f in raw["files"]:
            if not isinstance(f["path"], str):
                raise ValueError("a file's path is not a string")
            if f["path"] in files:  # put writes each once: a second would silently replace the first
                raise ValueError(f"{f['path']} is listed twice")
            if find(f["path"]) is None:  # put stores a point's saves only, each in a format it knows
                raise ValueError(f"{f['path']} is not a save's file")
            files[f["path"]] = self._blob(f)
        for s in scored:  # a metric saved as a file: its rows are that file's, byte for byte
            if s.file is not None and s.file not in files:
                raise ValueError(f"{s.file}, where {s.name} is saved, is not among the files stored")
            # Compared as text, not as values: 1 == 1.0, True == 1 and -0.0 == 0.0 in Python, so a
            # forged blob writing 1 for the file's 1.0 would pass a value check and be served.
            if s.file is not None and _canonical(json.loads(files[s.file])) != _canonical(s.result.rows):
                raise ValueError(f"{s.file} and the rows stored for {s.name} disagree")
        return Entry(tuple(scored), files)

    def _blob(self, ref: Any) -> bytes:
        """A blob's bytes, checked against the digest and size the entry names: a miss otherwise."""
        sha, size = ref["sha256"], ref["size"]
        if not isinstance(sha, str) or len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
            raise ValueError("not a sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError("not a size")
        data = read_bytes(self.root / BLOBS / sha, size)  # never more than the entry says it holds
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise ValueError(f"blob {sha[:12]}'s bytes are not the ones stored")
        return data

    def put(self, key: str, parts: Mapping, entry: Entry) -> bool:
        """Store ``entry`` under ``key`` (replacing a damaged one); False, with a warning, when the
        folder stopped taking files: the run's own results are not lost for it."""
        try:
            listed = [{"path": rel, **self._put_blob(data)} for rel, data in entry.files.items()]
            scored = [{"step": s.step, "name": s.name, "file": s.file, "rows": s.result.rows} for s in entry.scored]
            rows = self._put_blob(_canonical(scored))
            record = {"format": FORMAT, "key": key, "parts": dict(parts), "scored": rows, "files": listed}
            write_atomic(self.entry_path(key), (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        except OSError as err:
            warnings.warn(f"result cache {self.root}: could not store an entry ({err.strerror or err}); "
                          "the run's results are kept, the next run computes them again", stacklevel=2)
            return False
        return True


    def _put_blob(self, data: bytes) -> dict:
        """Write ``data`` under its digest (unless a sound copy is there); its reference."""
        sha = hashlib.sha256(data).hexdigest()
        blob = self.root / BLOBS / sha
        if not (blob.is_file() and hashlib.sha256(blob.read_bytes()).hexdigest() == sha):
            write_atomic(blob, data)
        return {"sha256": sha, "size": len(data)}


def _canonical(value) -> bytes:
    """JSON text that tells apart every two values JSON can: keys sorted, each number as Python
    writes it (``repr``, which reads back to the same float), so 1 and 1.0 differ."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")


def storable(scored) -> bool:
    """Whether rows read back from JSON equal these: plain dicts, lists, strings, numbers, bools.

    A tuple would read back as a list, unequal to it; such a point is computed every time
    rather than served different rows."""
    def plain(v) -> bool:
        if v is None or isinstance(v, (bool, int, float, str)):
            return True
        if isinstance(v, list):
            return all(plain(x) for x in v)
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        return False

    return all(plain(s.result.rows) for s in scored)
