"""The result files: `result/<name>.jsonl` (and `raw/<name>.jsonl`), one JSON line per finished user.

Each finished user is appended as one complete line (a single
write, flushed and fsynced), so a run killed at any instant loses at most the users in flight; a torn last line
from such a kill is dropped by the rewrite at the next start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


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


def append_line(path: Path, obj: dict) -> None:
    """One complete line per write, flushed to disk before the next user is reported done."""
    data = (json.dumps(obj) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
