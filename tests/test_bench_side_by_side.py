"""bench/bench_side_by_side.py's row → command mapping, without running upstream or ours.

The expected upstream commands are written out by hand from upstream's January-2025 config.py / other.py /
script.py (other.py's --model, --short, --dry; script.py's --partitions, --recency, --binary, --dry, --pretrain,
--disable_short_term), not derived from the mapping under test.
"""

from __future__ import annotations

import json
import os

import pytest

import rows
from bench import bench_side_by_side as sbs

HAND_WRITTEN = {
    "AVG": ["other.py", "--model", "AVG"],
    "90%": ["other.py", "--model", "90%"],
    "DASH[MCM]": ["other.py", "--model", "DASH[MCM]"],
    "GRU-P-short": ["other.py", "--model", "GRU-P", "--short"],
    "HLR-short": ["other.py", "--model", "HLR", "--short"],
    "DASH-short": ["other.py", "--model", "DASH", "--short"],
    "SM2-short": ["other.py", "--model", "SM2", "--short"],
    "Anki-default": ["other.py", "--model", "Anki", "--dry"],
    "FSRS-5": ["script.py"],
    "FSRS-5-preset": ["script.py", "--partitions", "preset"],
    "FSRS-5-deck": ["script.py", "--partitions", "deck"],
    "FSRS-5-recency": ["script.py", "--recency"],
    "FSRS-5-binary": ["script.py", "--binary"],
    "FSRS-5-default": ["script.py", "--dry"],
    "FSRS-5-S0": ["script.py", "--pretrain"],
    "FSRS-5-disable_short_term": ["script.py", "--disable_short_term"],
}


@pytest.mark.parametrize("row", sorted(HAND_WRITTEN))
def test_upstream_command_of_row(row):
    assert sbs.upstream_program(row) == HAND_WRITTEN[row]


@pytest.mark.parametrize("row, args", [("GRU-P-short", ["--model", "GRU-P", "--short"]),
                                       ("FSRS-5-preset", ["--model", "FSRS-5", "--partitions", "preset"]),
                                       ("FSRS-5-S0", ["--model", "FSRS-5", "--S0"]),
                                       ("Anki-default", ["--model", "Anki", "--default"]),
                                       ("SM2", ["--model", "SM2"]),
                                       ("not-a-row", ["--model", "not-a-row"])])
def test_our_command_of_row(row, args):
    assert sbs.our_args(row) == args


def test_every_row_is_mapped_or_skipped_with_a_reason():
    """Each README row either has an upstream command or a specific reason; the mapping names only real rows."""
    names = {row.name for row in rows.ROWS}
    assert set(sbs.UPSTREAM_COMMANDS) <= names
    for name in sorted(names - set(sbs.UPSTREAM_COMMANDS)):
        assert sbs.upstream_program(name) is None
        assert "no upstream January-2025 command is known" not in sbs.skip_reason(name), name


@pytest.mark.parametrize("row, words", [("FSRS-6-preset", "FSRS-6 is added to upstream after January 2025"),
                                        ("FSRS-7-recency", "FSRS-7 is added"),
                                        ("FSRS-6-one-step", "FSRS-6 is added"),
                                        ("LSTM", "RNN-class"),
                                        ("FSRS-rs", "--rust"),
                                        ("SBD-recency", "SBD is added"),
                                        ("MOVING-AVG", "MOVING-AVG is added"),
                                        ("LogisticRegression", "LogisticRegression is added"),
                                        ("Something", "no upstream January-2025 command is known")])
def test_skip_message(row, words):
    message = sbs.skip_reason(row)
    assert message.startswith("skipped: ") and words in message


def test_skipped_rows_run_nothing(tmp_path, capsys, monkeypatch):
    """With --upstream, rows upstream cannot run print their reason and start no process."""
    def no_run(*args, **kwargs):
        raise AssertionError("a skipped row must not run")

    monkeypatch.setattr(sbs, "timed", no_run)
    (tmp_path / "other.py").write_text("")
    sbs.main(["--data", str(tmp_path), "--models", "FSRS-6, LSTM,MOVING-AVG", "--upstream", str(tmp_path),
              "--repeat", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    assert [line.split(" | ")[0] for line in lines] == ["| FSRS-6", "| LSTM", "| MOVING-AVG"]


@pytest.mark.parametrize("row, reads", [("SM2", True), ("SM2-short", True), ("Ebisu-v2", True),
                                        ("FSRS-5-preset", True), ("FSRS-5-deck", True), ("SM2-trainable", False),
                                        ("FSRS-5", False), ("AVG", False), ("HLR-short", False)])
def test_which_upstream_commands_read_cards_and_decks(row, reads):
    """Upstream's process_untrainable (SM2, Ebisu-v2) and every --partitions run read cards/ and decks/."""
    assert sbs.reads_decks(sbs.upstream_program(row)) is reads


def test_rows_needing_decks_skipped_without_them(tmp_path, capsys, monkeypatch):
    def no_run(*args, **kwargs):
        raise AssertionError("a skipped row must not run")

    monkeypatch.setattr(sbs, "timed", no_run)
    (tmp_path / "revlogs").mkdir()
    sbs.main(["--data", str(tmp_path), "--models", "SM2,FSRS-5-deck", "--upstream", str(tmp_path), "--repeat", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    assert len(lines) == 2 and all("cards and decks" in line for line in lines)


def test_sim_decks_tables():
    """Every kept card has one deck that is in the decks table; about 1 % of cards are left out; seeded."""
    import numpy as np

    from bench.sim_decks import user_tables

    card_ids = np.arange(100_000, 120_000)
    cards, decks = user_tables(card_ids, seed=7)
    assert cards["card_id"].is_unique and set(cards["card_id"]) <= set(card_ids)
    assert 0.005 < 1 - len(cards) / len(card_ids) < 0.015
    assert set(cards["deck_id"]) <= set(decks["deck_id"]) and 2 <= len(decks) <= 8
    assert decks["preset_id"].between(0, 2).all()
    again, _ = user_tables(card_ids, seed=7)
    assert again.equals(cards)


def test_compare_results_reports_means_and_the_worst_user(tmp_path):
    def write(path, rows):
        path.write_text("".join(json.dumps({"user": u, "size": n, "metrics": {"LogLoss": ll}}) + "\n"
                                for u, n, ll in rows))

    ours, theirs = tmp_path / "ours.jsonl", tmp_path / "theirs.jsonl"
    write(ours, [(1, 10, 0.30), (2, 20, 0.50)])
    write(theirs, [(1, 10, 0.31), (2, 20, 0.49)])  # means equal (0.40), each user 0.01 apart
    assert sbs.compare_results(ours, theirs) == \
        "2 users, sizes equal; LogLoss 0.4000 vs 0.4000, per user ≤ 1.0e-02"
    write(theirs, [(1, 10, 0.31), (2, 21, 0.49)])
    assert sbs.compare_results(ours, theirs).startswith("DIFFERENT users/sizes: [2]")


@pytest.mark.parametrize("numpy_says,expected", [("1.26.4 True", "cpu"), ("1.26.4 False", "cpu"),
                                                 ("2.2.6 True", "published"), ("2.2.6 False", None),
                                                 ("2.4.1 True", None)])
def test_tie_order_follows_upstreams_numpy(numpy_says, expected, tmp_path, monkeypatch):
    """Our SRS_BENCH_TIE_ORDER is set to the order of upstream's numpy (asked through its interpreter): 1.26 as it
    runs on this CPU, 2.0-2.2 with AVX-512 the published order; others have no re-implementation and say so."""
    from upstream.legacy_sort import TIE_ORDER_ENV

    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho {numpy_says}\n")
    fake.chmod(0o755)
    monkeypatch.delenv(TIE_ORDER_ENV, raising=False)
    line = sbs.match_tie_order(str(fake))
    assert os.environ.get(TIE_ORDER_ENV) == expected
    assert ("does not reproduce" in line) == (expected is None)
    monkeypatch.setenv(TIE_ORDER_ENV, "generic")  # a value already set is kept
    assert sbs.match_tie_order(str(fake)).endswith("(from the environment)")
    assert os.environ[TIE_ORDER_ENV] == "generic"
