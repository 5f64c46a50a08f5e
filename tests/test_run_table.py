"""The whole-table command: the row list covers upstream's README tables, rows resolve to the right result files,
unregistered models are skipped with a note, finished rows cost nothing, and the tables and plots are rewritten."""

import json
import re
from pathlib import Path

import pytest

import models
import rows
import run_table
from config import RunConfig

# Row labels of upstream's README tables, copied by hand: the newest ("Weighted by the number of reviews",
# open-spaced-repetition/srs-benchmark README.md, commit 00c9de5) and the FSRS-5-era one (the README of the project
# brief, which spelled Ebisu with a hyphen).
UPSTREAM_FSRS6_TABLE = [
    "RWKV-P", "RWKV", "LSTM", "GRU-P-short", "FSRS-6 recency", "FSRS-rs", "FSRS-6", "FSRS-6 preset", "GRU-P",
    "FSRS-6 binary", "FSRS-5", "FSRS-6 deck", "FSRS-4.5", "FSRS-6 pretrain", "FSRS v4", "FSRS-6 default param.",
    "DASH-short", "DASH", "DASH[MCM]", "DASH[ACT-R]", "GRU", "ACT-R", "AVG", "FSRS v3", "FSRS v2", "FSRS v1",
    "Anki-SM-2 trainable", "HLR", "HLR-short", "SM-2 trainable", "Ebisu v2", "Anki-SM-2", "SM-2-short", "SM-2",
    "RMSE-BINS-EXPLOIT",
]
UPSTREAM_FSRS5_TABLE = [
    "LSTM", "GRU-P-short", "GRU-P", "FSRS-5 recency", "FSRS-rs", "FSRS-5", "FSRS-5 preset", "FSRS-4.5",
    "FSRS-5 binary", "FSRS-5 deck", "FSRS v4", "DASH-short", "DASH", "DASH[MCM]", "GRU", "DASH[ACT-R]",
    "FSRS-5 pretrain", "FSRS-5 default param.", "ACT-R", "AVG", "FSRS v3", "FSRS v2", "NN-17", "FSRS v1",
    "Anki-SM-2 trainable", "HLR", "HLR-short", "SM-2 trainable", "Transformer", "Ebisu-v2", "Anki-SM-2",
    "SM-2-short", "SM-2", "RMSE-BINS-EXPLOIT",
]


# The users of the default data set (data/embedded) that the rows evaluate: user 4 has too little data.
EVALUATED = [1, 2, 3, 5, 6, 7]


def test_every_row_of_upstreams_readme_tables_is_in_the_row_list():
    names = {"Ebisu-v2": "Ebisu v2"}  # the FSRS-5-era README spelled it with a hyphen
    for label in UPSTREAM_FSRS6_TABLE + UPSTREAM_FSRS5_TABLE:
        label = names.get(label, label)
        assert len(rows.select(label)) == 1, label


def test_each_row_writes_the_result_file_it_is_named_after():
    base = RunConfig()
    for row in rows.ROWS:
        assert rows.config_for(row, base).name == row.name
    assert len({r.name for r in rows.ROWS}) == len(rows.ROWS)
    assert rows.BY_NAME["Anki-default"].command() == "python other.py --model Anki --default"
    assert rows.BY_NAME["FSRS-6-deck"].command() == "python other.py --model FSRS-6 --partitions deck"
    assert rows.BY_NAME["DASH[MCM]"].command() == "python other.py --model 'DASH[MCM]'"
    assert [r.name for r in rows.select("FSRS-6 default param., hlr ,Anki-SM-2")] == ["FSRS-6-default", "Anki-default",
                                                                                       "HLR"]


def test_unknown_row_is_a_usage_error(capsys):
    assert run_table.main(["--rows", "FSRS-6,NoSuchModel"]) == 2
    assert "unknown row(s): NoSuchModel" in capsys.readouterr().err


@pytest.fixture
def readme(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("intro\n<!-- tables:start -->\nold\n<!-- tables:end -->\nrest\n", encoding="utf-8")
    return path


def table_args(tmp_path, readme, *extra):
    all_rows = tmp_path / "results.md"
    if not all_rows.exists():
        all_rows.write_text("every row\n<!-- tables:start -->\n<!-- tables:end -->\n", encoding="utf-8")
    return ["--result-dir", str(tmp_path / "result"), "--readme", str(readme), "--plots", str(tmp_path / "plots"),
            "--all-rows-doc", str(all_rows), "--processes", "2", "--quiet", "--n-resamples", "199", *extra]


def test_whole_table_runs_rows_skips_unregistered_resumes_and_rewrites_tables(tmp_path, readme, monkeypatch, capsys):
    monkeypatch.delitem(models.REGISTRY, "HLR")  # as if nobody had added HLR yet
    code = run_table.main(table_args(tmp_path, readme, "--rows", "AVG,MOVING-AVG,HLR,RWKV"))
    err = capsys.readouterr().err
    assert code == 0
    assert "row HLR: skipped (model HLR is not in models.REGISTRY yet)" in err
    assert "row RWKV: skipped (trained once on 5,000 users" in err
    for name in ("AVG", "MOVING-AVG"):
        lines = [json.loads(l) for l in (tmp_path / "result" / f"{name}.jsonl").read_text().splitlines()]
        assert [l["user"] for l in lines] == EVALUATED
    assert not (tmp_path / "result" / "HLR.jsonl").exists()
    text = readme.read_text(encoding="utf-8")
    # upstream's current layout: the unweighted table without same-day reviews (no -short-secs file: the other
    # table says so), not the seeds' weighted + unweighted pair
    assert text.startswith("intro\n<!-- tables:start -->\n### Without same-day reviews\n\nTotal number of users: 6.")
    assert text.endswith("rest\n") and "### With same-day reviews" in text and "Weighted" not in text
    table_rows = [l.split("|")[1].strip(" *") for l in text.splitlines() if re.match(r"^\| \S.* \| 0 \|", l)]
    assert sorted(table_rows) == ["AVG", "MOVING-AVG"]  # one table, nothing else
    for plot in ("Superiority-6.png", "Wilcoxon-6-collections.png", "T-test-6-collections.png"):
        assert (tmp_path / "plots" / plot).stat().st_size > 0
    # every row, in the seeds' layout (review-weighted and unweighted), goes to the all-rows page
    every = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert every.startswith("every row\n<!-- tables:start -->\n") and "### Weighted by the number of reviews" in every
    names = [l.split("|")[1].strip(" *") for l in every.splitlines() if re.match(r"^\| \S.* \| 0 \|", l)]
    assert sorted(names) == ["AVG", "AVG", "MOVING-AVG", "MOVING-AVG"]  # weighted and unweighted

    # a second call finds every user done: nothing is recomputed, the files are unchanged
    before = {p.name: p.read_text() for p in (tmp_path / "result").iterdir()}
    assert run_table.main(table_args(tmp_path, readme, "--rows", "AVG,MOVING-AVG", "--no-tables")) == 0
    err = capsys.readouterr().err
    assert "AVG: 0 done, 6 already" in err and "MOVING-AVG: 0 done, 6 already" in err
    assert {p.name: p.read_text() for p in (tmp_path / "result").iterdir()} == before


def test_whole_table_on_one_dask_cluster(tmp_path, readme, capsys):
    code = run_table.main(table_args(tmp_path, readme, "--rows", "AVG,MOVING-AVG", "--executor", "dask",
                                     "--no-tables"))
    assert code == 0
    for name in ("AVG", "MOVING-AVG"):
        lines = [json.loads(l) for l in (tmp_path / "result" / f"{name}.jsonl").read_text().splitlines()]
        assert [l["user"] for l in lines] == EVALUATED
    assert readme.read_text(encoding="utf-8").count("old") == 1  # --no-tables


def test_scheduler_needs_the_dask_executor(capsys):
    assert run_table.main(["--rows", "AVG", "--scheduler", "tcp://127.0.0.1:1"]) == 2


def test_help_and_readme_agree_on_the_tables_layout():
    text = run_table.build_parser().format_help()
    assert "--layout seeds" in " ".join(text.split())
    readme = (Path(run_table.__file__).parent / "README.md").read_text(encoding="utf-8")
    assert "--layout seeds" in readme and "--all-tables" in readme
    assert len(readme.splitlines()) <= 300
    block = readme.split("<!-- tables:start -->")[1].split("<!-- tables:end -->")[0]
    assert block.lstrip().startswith("### Without same-day reviews") and "Weighted by" not in block
    for flag in ("--rows", "--processes", "--list", "--executor", "--scheduler", "--data"):
        assert flag in text and flag in readme
