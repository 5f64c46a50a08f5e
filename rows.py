"""Every row of the README tables in one place: row name → model + flags.

The row name is the result-file name (`result/<name>.jsonl`), which is what `evaluate.py` reads and labels
("FSRS-6-default" is shown as "FSRS-6 default param.", "Anki" as "Anki-SM-2 trainable", ...). It is not chosen
here: it follows from the model and flags by `RunConfig.name`, and `config_for` checks that the two agree.

The list is the union of upstream srs-benchmark's README tables (the FSRS-6 table, the older FSRS-5 table, and the
newer rows such as FSRS-7, MOVING-AVG, LogisticRegression and 90%), plus srs-bench's own FSRS-6 upstream-trainer
row. A row runs when its model is in `models.REGISTRY` at run time; the others are reported and skipped, so rows
light up as models are added. `python run_table.py --list` shows the state of every row.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

import models
from config import RunConfig


@dataclass(frozen=True)
class Row:
    name: str  # result-file name; equals RunConfig(algo, **flags).name
    algo: str  # key in models.REGISTRY
    flags: dict = field(default_factory=dict)  # RunConfig fields that differ from the defaults
    unsupported: str | None = None  # why srs-bench cannot produce this row at all (not just "not registered yet")
    table: str = "day"  # "day": the table without same-day reviews; "same-day": with them (--with_same_day)

    @property
    def current(self) -> bool:
        """Whether upstream's current tables (the README's) have this row; the others are the seeds' tables' rows
        and srs-bench's own (`evaluate.py --layout seeds` shows every row: docs/results.md)."""
        return self.name not in NOT_CURRENT

    def args(self) -> list[str]:
        """other.py's arguments for this row (`--model M` and its flags)."""
        words = ["--model", self.algo]
        for key, value in self.flags.items():
            flag = _FLAG_NAMES[key]
            words += [flag] if value is True else [flag, str(value)]
        return words

    def command(self) -> str:
        """The single-row command line that produces the same result file."""
        return shlex.join(["python", "other.py", *self.args()])


# RunConfig field → command-line flag (config.build_parser)
_FLAG_NAMES = {"default": "--default", "S0": "--S0", "two_buttons": "--binary", "short": "--short",
               "recency": "--recency", "partitions": "--partitions", "disable_short_term": "--disable_short_term",
               "trainer": "--trainer", "secs": "--secs", "equalize_test_with_non_secs": "--equalize_test_with_non_secs",
               "sched_penalties": "--sched_penalties", "with_same_day": "--with_same_day"}


def _family(base: str, *, disable_short_term: bool = False) -> list[Row]:
    """An FSRS version and its README variants."""
    rows = [Row(base, base), Row(f"{base}-recency", base, {"recency": True}),
            Row(f"{base}-preset", base, {"partitions": "preset"}), Row(f"{base}-deck", base, {"partitions": "deck"}),
            Row(f"{base}-binary", base, {"two_buttons": True}), Row(f"{base}-S0", base, {"S0": True}),
            Row(f"{base}-default", base, {"default": True})]
    if disable_short_term:
        rows.append(Row(f"{base}-disable_short_term", base, {"disable_short_term": True}))
    return rows


_RWKV = "trained once on 5,000 users and evaluated on the other 5,000 (not per user); not part of srs-bench"


def _fsrs7(table: str = "day") -> list[Row]:
    """FSRS-7 and its variants in upstream's current tables: in the day table its published (equalized) mode, in
    the same-day table its `--with_same_day` run."""
    variants = [{}, {"recency": True}, {"sched_penalties": True}, {"sched_penalties": True, "recency": True},
                {"partitions": "preset"}, {"partitions": "deck"}, {"default": True}]
    same_day = {"with_same_day": True} if table == "same-day" else {}
    return [Row(RunConfig(algo="FSRS-7", **flags, **same_day).name, "FSRS-7", {**flags, **same_day}, table=table)
            for flags in variants]


def _same_day(algo: str, **flags) -> Row:
    """A row of upstream's "With same-day reviews" table: the model's `--with_same_day` run (--short --secs)."""
    flags = {**flags, "with_same_day": True}
    return Row(RunConfig(algo=algo, **flags).name, algo, flags, table="same-day")


ROWS: list[Row] = [
    Row("RWKV-P", "RWKV-P", unsupported=_RWKV),
    Row("RWKV", "RWKV", unsupported=_RWKV),
    Row("LSTM", "LSTM"),
    Row("GRU-P-short", "GRU-P", {"short": True}),
    Row("GRU-P", "GRU-P"),
    *_fsrs7(),
    *_family("FSRS-6"),
    Row("FSRS-6-upstream-trainer", "FSRS-6", {"trainer": "upstream"}),  # srs-bench: FSRS-6 with upstream's trainer
    Row("FSRS-rs", "FSRS-rs"),
    Row("FSRS-6-one-step", "FSRS-6-one-step"),
    *_family("FSRS-5", disable_short_term=True),
    Row("FSRS-4.5", "FSRS-4.5"),
    Row("FSRSv4", "FSRSv4"),
    Row("FSRSv3", "FSRSv3"),
    Row("FSRSv2", "FSRSv2"),
    Row("FSRSv1", "FSRSv1"),
    Row("DASH-short", "DASH", {"short": True}),
    Row("DASH", "DASH"),
    Row("DASH[MCM]", "DASH[MCM]"),
    Row("DASH[ACT-R]", "DASH[ACT-R]"),
    Row("GRU", "GRU"),
    Row("Transformer", "Transformer"),
    Row("NN-17", "NN-17"),
    Row("ACT-R", "ACT-R"),
    Row("LogisticRegression", "LogisticRegression"),
    Row("AVG", "AVG"),
    Row("MOVING-AVG", "MOVING-AVG"),
    Row("90%", "90%"),
    Row("Anki", "Anki"),  # Anki-SM-2 trainable
    Row("Anki-default", "Anki", {"default": True}),  # Anki-SM-2
    Row("HLR", "HLR"),
    Row("HLR-short", "HLR", {"short": True}),
    Row("SM2-trainable", "SM2-trainable"),
    Row("SBD-recency", "SBD"),  # recency-weighted by construction (config.ALWAYS_RECENCY); README label "SBD"
    Row("Ebisu-v2", "Ebisu-v2"),
    Row("SM2-short", "SM2", {"short": True}),
    Row("SM2", "SM2"),
    Row("RMSE-BINS-EXPLOIT", "RMSE-BINS-EXPLOIT"),
    # upstream's current day table runs GRU on the secs pipeline, equalized to the day-mode test reviews
    Row("GRU-short-secs-equalize_test_with_non_secs", "GRU",
        {"short": True, "secs": True, "equalize_test_with_non_secs": True}),
    # upstream's "With same-day reviews" table: every row its --short --secs run
    _same_day("LSTM"),  # tests the reviews after a day's first only, as upstream's (models/lstm.same_day_targets)
    *_fsrs7("same-day"),
    _same_day("LogisticRegression"),
    _same_day("MOVING-AVG"),
    _same_day("DASH[MCM]"),
    _same_day("GRU-P"),
    _same_day("DASH"),
    _same_day("DASH[ACT-R]"),
    _same_day("FSRS-6", recency=True),
    _same_day("FSRS-6"),
    _same_day("AVG"),
    _same_day("FSRS-6", two_buttons=True),
    _same_day("FSRS-6", partitions="preset"),
    _same_day("ACT-R"),
    _same_day("FSRS-6", S0=True),
    _same_day("FSRS-6", partitions="deck"),
    _same_day("FSRS-4.5"),
    _same_day("FSRS-5"),
    _same_day("FSRS-6", default=True),
    _same_day("FSRSv4"),
    _same_day("GRU"),
    _same_day("FSRSv3"),
    _same_day("FSRSv2"),
    _same_day("HLR"),
    _same_day("FSRSv1"),
    _same_day("Ebisu-v2"),
    _same_day("RMSE-BINS-EXPLOIT"),
]

# Rows of the seeds' tables that upstream's current README no longer shows, and srs-bench's own rows
NOT_CURRENT = {"FSRS-6-upstream-trainer", "FSRS-6-one-step", "FSRS-5-recency", "FSRS-5-preset", "FSRS-5-deck",
               "FSRS-5-binary", "FSRS-5-S0", "FSRS-5-default", "FSRS-5-disable_short_term", "Transformer", "NN-17",
               "90%", "Anki", "Anki-default", "SM2-trainable", "SBD-recency", "SM2", "SM2-short",
               "GRU"}  # upstream's current GRU row is GRU-short-secs-equalize_test_with_non_secs

BY_NAME = {row.name: row for row in ROWS}


def skip_reason(row: Row) -> str | None:
    """None when the row can run now; else why not (read from the registry at call time)."""
    if row.unsupported:
        return row.unsupported
    if row.algo not in models.REGISTRY:
        return f"model {row.algo} is not in models.REGISTRY yet"
    cfg = dataclasses.replace(RunConfig(), algo=row.algo, **row.flags)
    if cfg.refused_secs_flags(getattr(models.model_class(row.algo), "accepts_secs", False)):
        return f"model {row.algo} does not run upstream's --secs mode yet"
    return None


def config_for(row: Row, base: RunConfig) -> RunConfig:
    """`base` (data, processes, executor, result folder, ...) with this row's model and flags."""
    cfg = dataclasses.replace(base, algo=row.algo, **row.flags)
    if cfg.name != row.name:
        raise ValueError(f"row {row.name}: model {row.algo} with {row.flags} writes {cfg.name}.jsonl")
    return cfg


def _display(name: str) -> str:
    from evaluate import display_name

    return display_name(name)


def select(spec: str | None) -> list[Row]:
    """Rows named in a comma-separated list, by result name ("FSRS-6-default") or README name ("FSRS-6 default
    param."), case-insensitive, in table order; None or "all": every row."""
    if spec is None or spec.strip().lower() == "all":
        return list(ROWS)
    lookup = {}
    for row in ROWS:
        lookup[row.name.lower()] = row
        lookup.setdefault(_display(row.name).lower(), row)
    wanted, unknown = set(), []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        row = lookup.get(part.lower())
        if row is None:
            unknown.append(part)
        else:
            wanted.add(row.name)
    if unknown:
        raise ValueError(f"unknown row(s): {', '.join(unknown)}; rows: {', '.join(r.name for r in ROWS)}")
    return [row for row in ROWS if row.name in wanted]
