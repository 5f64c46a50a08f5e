"""Every run option in one place: the flags, their defaults, and the result-file name they imply.

Both command-line entry points (`script.py`, `other.py`) build a `RunConfig` with `build_parser`, so a new flag is
added here once and is seen by the runner, the feature pipeline and the models alike. This module imports no other
module of the project (the models import it): what the result name needs to know of a model is in the tables below,
which the model classes read, and a model file's NAME is read from its text (`declared_name`).
"""

from __future__ import annotations

import argparse
import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent
DEFAULT_DATA = REPO_ROOT.parent / "anki-revlogs-10k"
EMBEDDED_DATA = REPO_ROOT / "data" / "embedded"

# Models whose histories always include same-day reviews (upstream: FSRS-5, FSRS-6 and FSRS-rs "IL, G, SR").
ALWAYS_SHORT = {"FSRS-5", "FSRS-6", "FSRS-rs", "LSTM", "FSRS-7"}  # LSTM, FSRS-7: their published --short
# Models whose published run is recency-weighted, built into the model (its RECIPE): the result name carries
# "-recency" with or without the flag (SBD: upstream publishes `--algo SBD --recency`, file SBD-recency)
ALWAYS_RECENCY = {"SBD"}
# The flags that are a model's published mode, always on: they add no suffix to the result name (the model class's
# `builtin_flags` is its entry here, so the name is known without importing the model)
BUILTIN_FLAGS = {
    "FSRS-7": ("secs", "equalize_test_with_non_secs"),
    "FSRS-6-one-step": ("short",),
    "LSTM": ("secs", "duration", "equalize_test_with_non_secs"),
    "LogisticRegression": ("short", "secs", "recency", "equalize_test_with_non_secs"),
}
# Models on upstream's general --secs feature pipeline (features.py step 5): the model class's `accepts_secs`.
# With the FSRS-7 and Logistic Regression rows, the rows of upstream's "With same-day reviews" table
# (`--short --secs`, `--with_same_day`; s_min 1e-4 for the FSRS family)
ACCEPTS_SECS = {"FSRS-7", "LogisticRegression",
                "FSRS-6", "FSRS-5", "FSRS-4.5", "FSRSv4", "FSRSv3", "FSRSv2", "FSRSv1",
                "DASH", "DASH[MCM]", "DASH[ACT-R]", "ACT-R", "HLR", "AVG", "Ebisu-v2", "RMSE-BINS-EXPLOIT",
                "MOVING-AVG", "GRU", "GRU-P"}
# Of those, the models whose --secs mode runs on the fast (compiled) trainer alone (runner.py refuses the torch
# trainers there)
SECS_FAST_ONLY = {"FSRS-6", "FSRS-5", "FSRS-4.5", "FSRSv4", "FSRSv3", "FSRSv2", "FSRSv1"}
# Models whose day-table row handles its secs inputs itself (the LSTM: models/lstm.py) and whose same-day row
# (--with_same_day) runs on the general secs pipeline
SECS_SAME_DAY_ONLY = {"LSTM"}


@dataclass
class RunConfig:
    algo: str = "FSRS-6"
    data: Path | str | None = None  # None: ../anki-revlogs-10k if present, else the embedded data set; str: a URL
    processes: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_user_id: int | None = None
    users: list[int] | None = None  # explicit subset (testing, cluster sharding)
    partitions: str = "none"  # none | preset | deck
    recency: bool = False
    default: bool = False  # Era A --dry: no training, default parameters
    S0: bool = False  # Era A --pretrain: fit only the initial stabilities
    sched_penalties: bool = False  # FSRS-7: upstream's scheduling penalties in the training loss
    two_buttons: bool = False  # Era A --binary: Hard and Easy become Good
    short: bool = False  # same-day reviews stay in histories (never targets)
    disable_short_term: bool = False  # FSRS-5: w17 = w18 = 0 and frozen (with S0), as upstream script.py
    # upstream's secs-mode flags: --secs and --equalize_test_with_non_secs for the models that accept them
    # (`accepts_secs`), --duration only where it is a model's built-in mode (the LSTM); see secs_mode
    secs: bool = False
    duration: bool = False
    equalize_test_with_non_secs: bool = False
    # the row of upstream's "With same-day reviews" table: --short --secs, and a model whose published mode
    # equalizes its test set to the day-mode table's (FSRS-7, LSTM, LogisticRegression) runs without it
    with_same_day: bool = False
    # upstream's split flags (split.protocol_folds)
    no_test_same_day: bool = False
    no_train_same_day: bool = False
    train_equals_test: bool = False
    # srs-bench's leak-free protocol (not upstream's): each fold's outlier rule and continuity cut from its past
    # alone (split.causal_folds, docs/causal.md); suffix -causal, last
    causal: bool = False
    n_splits: int = 5
    batch_size: int = 512
    max_seq_len: int = 64
    n_epoch: int = 5
    precision: str = ""  # the LSTM's compiled arithmetic, "float32" or "float64" ("": the model's default, float32)
    trainer: str = "fast"  # fast: compiled full-sequence gradients (engine/seq_engine.py); upstream: srs-benchmark's
    torch_num_threads: int = 1
    raw: bool = False
    file: bool = False
    result_dir: Path = REPO_ROOT / "result"
    raw_dir: Path = REPO_ROOT / "raw"
    evaluation_dir: Path = REPO_ROOT / "evaluation"
    quiet: bool = False
    executor: str = "local"  # local: process pool on this machine; dask: a Dask cluster (dask_executor.run_dask)
    scheduler: str | None = None  # with executor dask: tcp://host:8786; None starts a LocalCluster on loopback
    device: str = "cpu"  # cpu | cuda | cuda:N (docs/gpu.md); the result file name does not depend on it
    gpus: str | None = None  # "0,1" or "all": one worker per CUDA device, chunks of users go to the next free one
    batch_users: int | None = None  # users fine-tuned together (batched trainers); None: 64 on CUDA, 1 (per user) on CPU

    @property
    def on_cuda(self) -> bool:
        return self.gpus is not None or self.device.startswith("cuda")

    def __post_init__(self):
        if self.with_same_day:  # upstream's same-day rows are `--short --secs` runs
            self.short = True
            self.secs = True

    @property
    def users_per_chunk(self) -> int:
        return self.batch_users if self.batch_users is not None else (64 if self.on_cuda else 1)

    @property
    def include_short(self) -> bool:
        """Same-day reviews kept inside histories (targets never include them in day mode)."""
        return self.short or self.algo in ALWAYS_SHORT or "short" in self.builtin_flags

    @property
    def builtin_flags(self) -> tuple:
        """The flags that are the model's published mode, always on (BUILTIN_FLAGS, the model class's
        `builtin_flags`; e.g. the LSTM's secs/duration/equalized test rows). They add no suffix to the result
        name. With --with_same_day the equalized test set is not one of them (upstream's same-day rows test on
        every secs target)."""
        flags = BUILTIN_FLAGS.get(self.algo, ())
        if self.with_same_day:
            flags = tuple(f for f in flags if f != "equalize_test_with_non_secs")
        return flags

    def refused_secs_flags(self, accepts_secs: bool) -> list[str]:
        """The secs-family flags of this config that its model does not run (runner.py refuses them, rows.py skips
        such a row): --secs and --equalize_test_with_non_secs need a model that declares `accepts_secs` unless they
        are its built-in mode; --duration is only ever a built-in mode (the LSTM's)."""
        return [f for f in ("secs", "duration", "equalize_test_with_non_secs")
                if getattr(self, f) and f not in self.builtin_flags and not (accepts_secs and f != "duration")]

    @property
    def secs_mode(self) -> bool:
        """The general --secs feature pipeline (features.py step 5): for a model that declares `accepts_secs`
        (ACCEPTS_SECS), when --secs is given or is one of its built-in flags. The LSTM's day row handles its secs
        inputs itself (its own target hook); its same-day row (--with_same_day) is on it (SECS_SAME_DAY_ONLY)."""
        if self.algo in SECS_SAME_DAY_ONLY:
            return self.with_same_day
        return self.algo in ACCEPTS_SECS and (self.secs or "secs" in self.builtin_flags)

    @property
    def equalize_mode(self) -> bool:
        """--equalize_test_with_non_secs on the general secs pipeline: the test rows of the day-mode pipeline, the
        secs rows before them for training (split.equalized_folds)."""
        return self.secs_mode and (self.equalize_test_with_non_secs
                                   or "equalize_test_with_non_secs" in self.builtin_flags)

    @property
    def model_name(self) -> str:
        """The model's name: --algo, or the NAME a model file declares (its stem if none)."""
        if is_model_path(self.algo):
            return declared_name(self.algo)
        return self.algo

    @property
    def name(self) -> str:
        """Result-file base name: algorithm plus upstream's suffixes, in upstream's order (a model's built-in
        flags add none: its published row keeps the model's name)."""
        # A same-day row is named as upstream names it: its built-in flags spelled out ("FSRS-7-short-secs",
        # "LSTM-short-secs-duration", "LogisticRegression-short-secs-recency"). A secs row of a model whose
        # histories always hold same-day reviews spells "short" too ("FSRS-6-short-secs"), as upstream's names do.
        builtin = () if self.with_same_day else self.builtin_flags
        secs_spelled = (self.secs or "secs" in self.builtin_flags) and "secs" not in builtin
        parts = [self.model_name]
        if self.default:
            parts.append("default")
        if self.S0:
            parts.append("S0")
        if self.sched_penalties:
            parts.append("sched_penalties")
        if self.two_buttons:
            parts.append("binary")
        if (secs_spelled and self.include_short) or (self.short and self.algo not in ALWAYS_SHORT
                                                     and "short" not in builtin):
            parts.append("short")
        if secs_spelled:
            parts.append("secs")
        if "duration" in self.builtin_flags and "duration" not in builtin:
            parts.append("duration")
        if (self.recency or self.algo in ALWAYS_RECENCY or "recency" in self.builtin_flags) \
                and "recency" not in builtin:
            parts.append("recency")
        if self.no_test_same_day:
            parts.append("no_test_same_day")
        if self.no_train_same_day:
            parts.append("no_train_same_day")
        if self.equalize_test_with_non_secs and "equalize_test_with_non_secs" not in builtin:
            parts.append("equalize_test_with_non_secs")
        if self.train_equals_test:
            parts.append("train_equals_test")
        if self.trainer != "fast":
            parts.append(f"{self.trainer}-trainer")
        if self.precision == "float64" and self.algo == "LSTM":
            parts.append("float64")
        if self.partitions != "none":
            parts.append(self.partitions)
        if self.disable_short_term:
            parts.append("disable_short_term")
        if self.causal:  # srs-bench's own flag: after everything upstream spells
            parts.append("causal")
        return "-".join(parts)


def is_model_path(spec: str) -> bool:
    """Whether an --algo/--model value names a file rather than a registered model."""
    return str(spec).endswith(".py")


def declared_name(path: str | Path) -> str:
    """NAME = "..." of a model file, read without running it (the result-file name is needed before any model is
    imported); the file's stem if it declares none."""
    path = Path(path)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return path.stem
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NAME" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) and node.value.value:
                return node.value.value
    return path.stem


def build_parser(description: str, default_algo: str, algo_choices: list[str] | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algo", "--model", dest="algo", default=default_algo, type=algo_arg(algo_choices),
                   metavar="MODEL",
                   help="model to evaluate (--model is the seed README's name for the same flag): "
                        + (f"one of {', '.join(algo_choices)}, or ".replace("%", "%%") if algo_choices else "")
                        + "a model file path/to/my_model.py written to the own-model contract "
                          "(docs/own-model.md; result file named after its NAME)")
    p.add_argument("--rust", dest="algo", action="store_const", const="FSRS-rs", default=argparse.SUPPRESS,
                   help="upstream's script.py --rust: evaluate FSRS-rs (FSRS-6 trained by the Rust fsrs crate via "
                        "fsrs-rs-python's benchmark()); same as --algo FSRS-rs, result file FSRS-rs")
    p.add_argument("--data", type=data_arg, default=None,
                   help="dataset root in the anki-revlogs-10k layout (revlogs/user_id=N/data.parquet): a folder or "
                        "an fsspec URL (s3://bucket/prefix, gs://..., file://...); default: ../anki-revlogs-10k if "
                        "it exists, else the embedded data set in data/embedded")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="worker processes, one user each (1 runs in this process); default: all cores "
                        "(%(default)s on this machine)")
    p.add_argument("--max-user-id", dest="max_user_id", type=int, default=None, help="only users with id <= N")
    p.add_argument("--users", type=str, default=None,
                   help="comma-separated user ids or ranges (e.g. 1-100,250) to run; useful to shard over machines")
    p.add_argument("--partitions", choices=["none", "preset", "deck"], default="none",
                   help="train separate parameters per preset or per deck (suffix -preset / -deck)")
    p.add_argument("--recency", action="store_true",
                   help="weight training reviews by recency, 0.25 + 0.75*x^3 (suffix -recency)")
    p.add_argument("--dry", "--default", dest="default", action="store_true",
                   help="no training: evaluate the default parameters (suffix -default)")
    p.add_argument("--pretrain", "--S0", dest="S0", action="store_true",
                   help="fit only the initial stabilities w0-w3, keep the rest at defaults (suffix -S0)")
    p.add_argument("--sched_penalties", action="store_true",
                   help="FSRS-7: upstream's scheduling penalties in the training loss, 0.5 x (largest growth of a "
                        ">= 1-day interval over 10 Good reviews at 90%% retention)^2 + 0.0015 x max(1/x - 144, 0) for x "
                        "the mean sub-day interval at 99%% (days), beside the L2 prior; trains on the autograd engine "
                        "(suffix -sched_penalties)")
    p.add_argument("--binary", "--two_buttons", dest="two_buttons", action="store_true",
                   help="treat Hard and Easy as Good (suffix -binary)")
    p.add_argument("--short", action="store_true",
                   help="keep same-day reviews in histories (never as targets); always on for FSRS-5/FSRS-6")
    p.add_argument("--disable_short_term", action="store_true",
                   help="FSRS-5: no short-term stability term (w17 = w18 = 0, their gradients and S0's zeroed, as "
                        "upstream script.py's enable_short_term=False); same-day reviews stay in the histories "
                        "(suffix -disable_short_term)")
    p.add_argument("--secs", action="store_true",
                   help="upstream's --secs: intervals in fractional days (elapsed_seconds / 86400) in histories and "
                        "targets, same-day reviews as targets (with --short), no outlier filter (suffix -secs). For "
                        "the models that declare accepts_secs; built into the LSTM and LogisticRegression rows")
    p.add_argument("--equalize_test_with_non_secs", action="store_true",
                   help="with --secs: each fold tests on the day-mode pipeline's test reviews and trains on every "
                        "secs row before them, so the row sits in the day-mode table (suffix "
                        "-equalize_test_with_non_secs)")
    p.add_argument("--with_same_day", action="store_true",
                   help="the row of upstream's 'With same-day reviews' table: --short --secs (same-day reviews are "
                        "test targets) and, for the models whose published row is equalized to the day-mode test "
                        "set (FSRS-7, LSTM, LogisticRegression), without that; the result file is upstream's name "
                        "(DASH-short-secs, FSRS-6-short-secs, FSRS-7-short-secs, LSTM-short-secs-duration, ...)")
    p.add_argument("--duration", action="store_true",
                   help="upstream's --duration: answer durations as inputs. Built into the LSTM row (its published "
                        "mode); refused by other models")
    p.add_argument("--no_test_same_day", action="store_true",
                   help="upstream's --no_test_same_day: each fold's test reviews keep only those with elapsed_days "
                        "> 0 (changes a row only where same-day reviews are targets: --secs with --short, or a "
                        "model with them built in; suffix -no_test_same_day)")
    p.add_argument("--no_train_same_day", action="store_true",
                   help="upstream's --no_train_same_day: each fold's training reviews keep only those with "
                        "elapsed_days > 0 (same-day reviews stay in histories; suffix -no_train_same_day)")
    p.add_argument("--train_equals_test", action="store_true",
                   help="upstream's --train_equals_test (an overfitting probe): one fold that trains on all the "
                        "user's reviews and tests on every review from the first TimeSeriesSplit test block on "
                        "(replaces the equalized folds too; suffix -train_equals_test)")
    p.add_argument("--causal", action="store_true",
                   help="srs-bench's leak-free protocol (not upstream's): the folds come from the reviews before the "
                        "outlier filter, and each fold's outlier rule and continuity cut are computed from the "
                        "reviews before its test block alone, then applied to its training and test reviews "
                        "(docs/causal.md; suffix -causal)")
    p.add_argument("--n_splits", type=int, default=5,
                   help="TimeSeriesSplit folds: fold k trains on the first k+1 of n_splits+1 equal blocks (the "
                        "remainder in the first) and tests on the next")
    p.add_argument("--batch_size", type=int, default=512, help="training batch size")
    p.add_argument("--max_seq_len", type=int, default=64,
                   help="longest training history; each card keeps its first 2x this many reviews")
    p.add_argument("--n_epoch", type=int, default=5, help="training epochs")
    p.add_argument("--precision", choices=["float32", "float64"], default="",
                   help="the LSTM's compiled fine-tune and predictions in float32 (default; upstream's torch runs in "
                        "float32) or float64 (suffix -float64)")
    p.add_argument("--trainer", choices=["fast", "autograd", "upstream"], default="fast",
                   help="fast: the upstream objective minimised with compiled one-pass-per-card gradients; "
                        "autograd: the same batches and steps, gradients by torch autograd through one pass per "
                        "card (engine/autograd_engine.py; models with torch step functions; suffix "
                        "-autograd-trainer); "
                        "upstream: srs-benchmark's torch trainer (sorted-length batches of 512, randperm(2023) "
                        "order, best epoch), for comparison (suffix -upstream-trainer)")
    p.add_argument("--torch_num_threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--raw", action="store_true", help="also write raw predictions to raw/<name>.jsonl")
    p.add_argument("--file", action="store_true", help="also write per-user test rows with p to evaluation/<name>/")
    p.add_argument("--result-dir", dest="result_dir", type=Path, default=REPO_ROOT / "result",
                   help="where result/<name>.jsonl is written")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--executor", choices=["local", "dask"], default="local",
                   help="local: a process pool on this machine (a worker killed mid-user is replaced and its user "
                        "retried once); dask: users are tasks on a Dask cluster (see --scheduler)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="with --executor dask: the scheduler to connect to (tcp://host:8786); default: start a "
                        "LocalCluster of --processes single-threaded workers on 127.0.0.1")
    p.add_argument("--device", type=device_arg, default="cpu",
                   help="cpu, cuda or cuda:N. On CUDA, the neural models (GRU-P, GRU, NN-17, LSTM, Transformer) "
                        "fine-tune --batch-users users' folds in one batched float64 pass on the device (same "
                        "numbers as the CPU up to rounding, same result file name); the others, and any run with "
                        "--partitions, --trainer "
                        "upstream or --dry, stay on the CPU's per-user path (a message says so). --processes does "
                        "not apply on CUDA: one process per device (docs/gpu.md)")
    p.add_argument("--gpus", default=argparse.SUPPRESS, metavar="IDS",
                   help="CUDA device indices, e.g. 0,1, or all: one worker process per device, each chunk of "
                        "--batch-users users goes to the next free one (implies CUDA)")
    p.add_argument("--batch-users", dest="batch_users", type=int, default=argparse.SUPPRESS, metavar="K",
                   help="neural models: users whose fold fine-tunes are trained together in one batched pass "
                        "(neural/neural_batched.py); 1 on the CPU is the per-user path; K > 1 on the CPU runs the "
                        "batched path with --processes workers taking chunks (default: 64 on CUDA, 1 on the CPU)")
    return p


def algo_arg(choices: list[str] | None):
    """--algo/--model: a registered name (one of `choices` when given) or a model file (*.py), kept as an absolute
    path so that worker processes find it. The file is loaded and checked by runner.run before any work: a missing
    or broken one is one line, "error: path:line: what", and exit code 2 (not argparse's usage block)."""
    def parse(value: str) -> str:
        if is_model_path(value):
            return str(Path(value).expanduser().resolve())
        if choices is not None and value not in choices:
            raise argparse.ArgumentTypeError(f"unknown model {value!r} (choose from {', '.join(choices)}, or give "
                                             "a model file path/to/my_model.py)")
        return value
    parse.__name__ = "model"
    return parse


def device_arg(value: str) -> str:
    """--device: cpu, cuda or cuda:N."""
    import re

    if not re.fullmatch(r"cpu|cuda(:\d+)?", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not cpu, cuda or cuda:N")
    return value


def data_arg(value: str) -> Path | str:
    """--data: URLs (anything with "://") stay strings for fsspec; everything else is a local path."""
    return value if "://" in value else Path(value)


def parse_users(spec: str | None) -> list[int] | None:
    if not spec:
        return None
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return sorted(set(out))


def config_from_args(args: argparse.Namespace) -> RunConfig:
    values = vars(args).copy()
    values["users"] = parse_users(values.get("users"))
    cfg = RunConfig(**values)
    cfg.raw_dir = cfg.result_dir.parent / "raw"
    cfg.evaluation_dir = cfg.result_dir.parent / "evaluation"
    return cfg
