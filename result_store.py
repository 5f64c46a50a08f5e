"""The result files: `result/<name>.jsonl` (and `raw/<name>.jsonl`), one JSON line per finished user.

Only the run that holds a file's lock writes it. Each finished user is appended as one complete line (a single
write() into the kernel, so a process killed at any instant, even by kill -9, loses at most the users in flight) and
the file is fsynced at least once a second (a machine that loses power loses at most the last second's users; an
fsync per user cost ~4 ms, as much as a cheap model's whole user); a torn last line is dropped by the rewrite at the
next start. The lock (`<file>.lock`, an flock held for the whole
run) keeps a second run off the file: without it two runs both compute the same users, and the closing rewrite of
one drops a line the other appended between its read and its replace. The kernel releases the lock when its holder
dies, even by kill -9, so a lock file left behind blocks nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from pathlib import Path

from data_loader import DataError


@contextlib.contextmanager
def locked(path: Path):
    """Hold `path`'s lock for the block, or raise DataError (exit 2) naming the run that holds it."""
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise DataError(f"{path} is being written by another run (pid {holder}); wait for it to end, or give "
                            f"this run another --result-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)  # the lock file itself stays: deleting it would race a newcomer
        yield
    finally:
        os.close(fd)  # releases the lock


def read_results(path: Path) -> tuple[list[dict], int]:
    """Valid result lines of a file and the number of unreadable ones (e.g. a line torn by a killed run)."""
    if not path.exists():
        return [], 0
    good, bad = [], 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                int(obj["user"])
                good.append(obj)
            except (ValueError, KeyError, TypeError):
                bad += 1
    return good, bad


def rewrite_sorted(path: Path) -> int:
    """Sort a JSONL file by user (one line per user, torn lines dropped), atomically; returns lines dropped."""
    lines, bad = read_results(path)
    if not lines and not bad:
        return 0
    by_user = {int(obj["user"]): obj for obj in lines}
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for user in sorted(by_user):
            fh.write(json.dumps(by_user[user]) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return bad


SYNC_SECONDS = 1.0  # the longest a written line waits for its fsync
_last_sync: dict[Path, float] = {}


def append_line(path: Path, obj: dict) -> None:
    """One complete line per write() (in the kernel before the next user is reported done); fsynced when the
    file's last fsync is more than SYNC_SECONDS old."""
    data = (json.dumps(obj) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        now = time.monotonic()
        if now - _last_sync.get(path, -math.inf) > SYNC_SECONDS:
            os.fsync(fd)
            _last_sync[path] = now
    finally:
        os.close(fd)


def set_aside(path: Path, version_of, current: str) -> dict[Path, int]:
    """Move the lines of `path` whose `version_of(line)` is not `current` into `<path>.<that version>` (appended,
    one file per version; "unversioned" for lines without one), leaving `path` with the current lines only
    (rewritten atomically). Returns {file: lines moved there}."""
    lines, _ = read_results(path)
    stale: dict[str, list[dict]] = {}
    for obj in lines:
        version = version_of(obj) or "unversioned"
        if version != current:
            stale.setdefault(version, []).append(obj)
    if not stale:
        return {}
    moved = {}
    for version, objs in stale.items():
        aside = path.with_name(f"{path.name}.{version}")
        with open(aside, "a", encoding="utf-8") as fh:
            for obj in objs:
                fh.write(json.dumps(obj) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        moved[aside] = len(objs)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for obj in lines:
            if (version_of(obj) or "unversioned") == current:
                fh.write(json.dumps(obj) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return moved
