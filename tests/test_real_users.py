"""bench/real_users.py: a folder of N users linked from real collections (the embedded data set's)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

import data_loader
from bench import real_users

EMBEDDED = Path(__file__).resolve().parents[1] / "data" / "embedded"
RAW_REVIEWS = {1: 9248, 2: 6111}  # data/embedded/README.md's table


def test_users_linked_in_turn_with_all_their_tables(tmp_path):
    out = tmp_path / "real5"
    assert real_users.main(["--out", str(out), "--users", "5"]) == 0
    assert data_loader.list_user_ids(str(out)) == [1, 2, 3, 4, 5]
    for new, source in zip(range(1, 6), [1, 2, 1, 2, 1]):
        for table in ("revlogs", "cards", "decks"):
            link = out / table / f"user_id={new}"
            assert link.is_symlink()
            assert link.resolve() == (EMBEDDED / table / f"user_id={source}").resolve()
        assert pq.ParquetFile(out / "revlogs" / f"user_id={new}" / "data.parquet").metadata.num_rows \
            == RAW_REVIEWS[source]
    assert sum(data_loader.review_counts(str(out), [1, 2, 3, 4, 5]).values()) == 3 * 9248 + 2 * 6111


def test_refuses_a_folder_in_use_and_unknown_users(tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("x")
    assert real_users.main(["--out", str(used)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert real_users.main(["--out", str(tmp_path / "new"), "--from", "1,99"]) == 2
    assert "user_id=99" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError):
        real_users.link_users(EMBEDDED, [], 3, tmp_path / "none")
