#!/usr/bin/env python3
"""Download the anki-revlogs-10k dataset (open-spaced-repetition/anki-revlogs-10k on Hugging Face).

    python download_data.py [--out DIR] [--users 1-100,250] [--revision REV]

Fetches `revlogs/`, `cards/` and `decks/` (all users, about 10,000 folders, or only the users given with --users)
into DIR (default ../anki-revlogs-10k, where the benchmark looks by default). Files already present are not fetched
again. Exit codes: 0 done, 1 bad arguments or a local error, 2 the hub could not be reached or refused the download.
If the hub asks for it (gated dataset), accept the terms on the dataset page and log in (`hf auth login` or HF_TOKEN).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

REPO_ID = "open-spaced-repetition/anki-revlogs-10k"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "anki-revlogs-10k"
TABLES = ("revlogs", "cards", "decks")


def parse_users(spec: str) -> list[int]:
    """'1-100,250' -> [1, ..., 100, 250] (sorted, unique). Raises ValueError on malformed input."""
    users: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if lo > hi:
                raise ValueError(f"range {part!r} is empty (start > end)")
            users.update(range(lo, hi + 1))
        else:
            users.add(int(part))
    if not users:
        raise ValueError("no user ids given")
    if min(users) < 1:
        raise ValueError("user ids start at 1")
    return sorted(users)


def allow_patterns(users: list[int] | None) -> list[str]:
    """Patterns for snapshot_download: every table of the given users, or the three tables (+ README) for all."""
    if users is None:
        return [f"{t}/*" for t in TABLES] + ["README.md"]
    return [f"{t}/user_id={u}/*" for u in users for t in TABLES]


def _hub_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'could not reach / use the hub' (network, HTTP, auth, missing repo)."""
    errors: list[type[BaseException]] = [OSError, TimeoutError, ConnectionError]
    try:
        import huggingface_hub.errors as hub_errors

        for name in ("HfHubHTTPError", "HTTPError", "LocalEntryNotFoundError", "OfflineModeIsEnabled",
                     "RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError", "DisabledRepoError",
                     "EntryNotFoundError", "RemoteEntryNotFoundError", "IncompleteSnapshotError", "XetDownloadError"):
            exc = getattr(hub_errors, name, None)
            if isinstance(exc, type):
                errors.append(exc)
    except ImportError:  # pragma: no cover - huggingface_hub is a requirement
        pass
    for module, name in (("httpx2", "HTTPError"), ("httpx", "HTTPError"), ("requests", "RequestException")):
        try:
            exc = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if isinstance(exc, type):
            errors.append(exc)
    return tuple(errors)


def download(out: Path, users: list[int] | None = None, revision: str | None = None) -> Path:
    from huggingface_hub import snapshot_download

    out.mkdir(parents=True, exist_ok=True)
    path = snapshot_download(repo_id=REPO_ID, repo_type="dataset", local_dir=str(out),
                             allow_patterns=allow_patterns(users), revision=revision)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Download the {REPO_ID} dataset from Hugging Face.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"target folder (default {DEFAULT_OUT})")
    parser.add_argument("--users", default=None,
                        help="only these user ids, e.g. '1-100,250' (default: all 10,000 users)")
    parser.add_argument("--revision", default=None, help="dataset revision (branch, tag or commit); default main")
    args = parser.parse_args(argv)
    users = None
    if args.users is not None:
        try:
            users = parse_users(args.users)
        except ValueError as exc:
            print(f"error: --users {args.users!r}: {exc}", file=sys.stderr)
            return 1
    what = "all users" if users is None else f"{len(users)} user(s)"
    print(f"downloading {REPO_ID} ({what}) into {args.out}")
    try:
        path = download(args.out, users, args.revision)
    except KeyboardInterrupt:
        print("error: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except _hub_errors() as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: cannot download {REPO_ID} from the Hugging Face hub ({type(exc).__name__}: {first}); "
              f"check the network; if access is refused, accept the dataset's terms on its hub page and log in (HF_TOKEN)",
              file=sys.stderr)
        return 2
    found = sorted((Path(path) / "revlogs").glob("user_id=*"))
    print(f"done: {len(found)} user folder(s) under {Path(path) / 'revlogs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
