"""Child processes for the benchmark sections (``writing.py``, ``lens.py``): each measured variant
in a process of its own, so its imports, its warm-up and its peak memory are its own, answering
its parent one JSON object a line and timing a round only when told to ("go"), so the variants
take turns on the cores instead of competing for them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TextIO


def protocol() -> TextIO:
    """In a child: the stream its answers go to (the original stdout). Whatever a library prints
    afterwards goes to stderr, never into the answers."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return answers


def say(answers: TextIO, **fields) -> None:
    print(json.dumps(fields), file=answers)


class Child:
    """One child process: ``python script *args``, its stderr kept in ``log`` for a failure to show."""

    def __init__(self, script: Path, args: list, log: Path, env: dict | None = None):
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, str(script), *map(str, args)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError(f"{self.log_path.stem} ended without answering (rc {self.proc.returncode}); "
                               f"its stderr:\n{self.log_path.read_text()[-4000:]}")
        return json.loads(line)

    def go(self) -> dict:
        """One timed round."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait()
        self._log.close()
