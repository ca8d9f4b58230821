"""What a nightly gate (or a merge) writes into its report folder while it runs: one writer at a
time, and each finished run kept the moment it is finished.

- `one_writer(folder)`: the folder's lock, held for the whole command. A second gate or merge
  writing the same folder is refused at once, saying who holds it (two gates had each read,
  changed and replaced history.jsonl: one night's line was lost).
- `Journal`: runs.jsonl, a JSON object a line, each line flushed as it is written (a process killed
  at any moment leaves every line it finished) and fsync'd at least once a second and at the end
  (a machine that goes down loses at most that second); `read_journal` leaves out a torn last line.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import time
from pathlib import Path

LOCK_NAME = ".writer.lock"
SYNC_EVERY_S = 1.0


class FolderBusy(Exception):
    """Another process is writing this report folder."""


@contextlib.contextmanager
def one_writer(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise FolderBusy(f"{folder}: another gate or merge is writing this report folder ({holder}): give this "
                             "one another --out, or run it after that one") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} since {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC\n")
        lock.flush()
        yield


class Journal:
    """Lines appended to `path` (emptied first), each flushed, synced at least every second."""

    def __init__(self, path: Path):
        self._file = open(path, "w")
        self._synced = time.monotonic()

    def add(self, entry: dict) -> None:
        self._file.write(json.dumps(entry, default=str) + "\n")
        self._file.flush()
        if time.monotonic() - self._synced >= SYNC_EVERY_S:
            self._sync()

    def _sync(self) -> None:
        os.fsync(self._file.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        if not self._file.closed:
            self._sync()
            self._file.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_journal(path: Path) -> list[dict]:
    """The entries of a journal; a last line cut short (its writer killed mid-write) left out."""
    lines = path.read_text().split("\n")
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: torn
                break
            raise ValueError(f"{path}:{number}: not a JSON line: {line[:80]!r}") from None
    return entries
