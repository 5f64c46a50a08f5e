"""Bring-your-own-model: a one-file torch model (examples/exp4.py, the docs' worked example) loaded from its path,
its forward values by hand, a run through `other.py --model path` named after the file's NAME, both trainers, the
registry's module entries, and one clear error (exit 2) for a missing or broken file."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import models
from check_users import check_features
from config import REPO_ROOT, RunConfig, build_parser, config_from_args
from models.base import ReviewData
from engine.own_model import ModelFileError, declared_name, load, model_class
from runner import read_results, run

EXP4 = REPO_ROOT / "examples" / "exp4.py"


def one_card(dts, gs, target_t) -> ReviewData:
    rows = pd.DataFrame({"card_id": [0], "delta_t": [float(target_t)], "y": [1], "i": [len(dts) + 1],
                         "seq_start": [0], "seq_pos": [len(dts)]})
    return ReviewData(rows, np.array(dts, dtype=np.float64), np.array(gs, dtype=np.int8))


def test_exp4_forward_by_hand():
    """Good (day 0), Good after 2 days, Again after 5 days, target 4 days later; w = [1, 0.7, 3, 0.3]:
    S0 = 1·e^0 = 1; R = 0.9^(2/1) = 0.81, S1 = 1·(1 + e^3·0.19); fail: S2 = 0.3·S1; p = 0.9^(4/S2)."""
    cls = model_class(EXP4)
    model = cls(RunConfig(algo=str(EXP4)))
    s1 = 1.0 * (1 + math.exp(3.0) * (1 - 0.81))
    s2 = 0.3 * s1
    p = model.predict(one_card([0, 2, 5], [3, 3, 1], 4))
    assert p[0] == pytest.approx(0.9 ** (4 / s2), rel=1e-13)
    # an Easy first review: S0 = e^0.7, target after 3 days
    assert model.predict(one_card([0], [4], 3))[0] == pytest.approx(0.9 ** (3 / math.exp(0.7)), rel=1e-13)


def test_loaded_model_class():
    cls = models.model_class(str(EXP4))
    assert cls is models.model_class(str(EXP4))  # one class per file
    assert cls.name == "EXP-4" == declared_name(EXP4)
    assert cls(RunConfig(algo=str(EXP4))).n_params == 4
    assert cls(RunConfig(algo=str(EXP4), default=True)).n_params == 0


def test_training_lowers_the_loss_on_a_real_user():
    model = model_class(EXP4)(RunConfig(algo=str(EXP4)))
    data = check_features(12, False)
    before = model.engine.loss_and_grad(model.default_w, data)[0]
    model.fit(data)
    assert model.engine.loss_and_grad(model.w, data)[0] < before * 0.97


def test_command_line_name_and_run(tmp_path):
    args = build_parser("t", "FSRS-6", sorted(models.REGISTRY)).parse_args(["--model", str(EXP4), "--recency"])
    cfg = config_from_args(args)
    assert cfg.algo == str(EXP4.resolve()) and cfg.name == "EXP-4-recency"
    cfg = RunConfig(algo=str(EXP4), processes=1, users=[1], result_dir=tmp_path, quiet=True)
    assert run(cfg).done == 1
    line = read_results(tmp_path / "EXP-4.jsonl")[0][0]
    assert 0 < line["metrics"]["LogLoss"] < 1 and len(line["parameters"]["0"]) == 4


def test_upstream_trainer_runs_the_same_file(tmp_path):
    cfg = RunConfig(algo=str(EXP4), processes=1, users=[1], result_dir=tmp_path, quiet=True, trainer="upstream")
    assert run(cfg).done == 1
    assert (tmp_path / "EXP-4-upstream-trainer.jsonl").exists()


def test_registry_entry_may_name_a_contract_module(monkeypatch):
    monkeypatch.setitem(models.REGISTRY, "EXP-4-registered", "examples.exp4")
    cls = models.model_class("EXP-4-registered")
    assert cls.name == "EXP-4-registered" and len(cls.module.DEFAULT_W) == 4  # the registry names it


@pytest.mark.parametrize("text, message", [
    (None, "not found"),
    ("def broken(:\n", "importing it failed: SyntaxError"),
    ("DEFAULT_W = []\n", "DEFAULT_W must be a non-empty list"),
    ("DEFAULT_W = [1.0]\ndef init(w, g, t): pass\ndef curve(w, s, t): pass\n", "no function step"),
    ("DEFAULT_W = [1.0]\nLOWER = [0, 0]\ndef init(w, g, t): pass\ndef step(w, s, t, g): pass\n"
     "def curve(w, s, t): pass\n", "LOWER must be a list of 1"),
    ("DEFAULT_W = [1.0]\nRECIPE = {'optimiser': 'sgd'}\ndef init(w, g, t): pass\ndef step(w, s, t, g): pass\n"
     "def curve(w, s, t): pass\n", "unknown key"),
])
def test_broken_files_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "mine.py"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ModelFileError, match=message):
        load(path)


def test_other_py_exits_2_with_one_line_for_a_missing_file(tmp_path):
    proc = subprocess.run([sys.executable, "other.py", "--model", str(tmp_path / "nope.py")], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "nope.py not found" in proc.stderr and "Traceback" not in proc.stderr


def test_a_file_breaking_the_contract_is_one_line_without_the_usage_block(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("DEFAULT_W = [1.0]\ndef init(w, g, t): pass\ndef curve(w, s, t): pass\n")
    proc = subprocess.run([sys.executable, "other.py", "--model", str(path)], cwd=REPO_ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {path}: no function step(...) (or torch_step)"]


def test_an_if_on_a_tensor_is_refused_before_any_user_naming_its_line(tmp_path):
    """A step that steers Python with a tensor value cannot run on either engine (the autograd engine steps a
    batch of cards, where the value is ambiguous): exit 2, the file and line named, no user run."""
    text = EXP4.read_text().replace(
        "    return (torch.clamp(torch.where(g > 1, s_pass, s_fail), S_MIN, S_MAX),)",
        "    if g > 1:\n        return (torch.clamp(s_pass, S_MIN, S_MAX),)\n    return (torch.clamp(s_fail, S_MIN, S_MAX),)")
    path = tmp_path / "branchy.py"
    path.write_text(text)
    line = text.splitlines().index("    if g > 1:") + 1
    proc = subprocess.run([sys.executable, "other.py", "--model", str(path), "--result-dir", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}:{line} (`if g > 1:`): Python control flow on a traced value (bool()/if/and/or); use "
        "torch.where"]
    assert not (tmp_path / "EXP-4.jsonl").exists()


def test_an_edited_model_file_does_not_reuse_its_old_results(tmp_path, capsys):
    """Results carry the file's content digest: after an edit, the old version's lines are moved to a file of their
    own (named after that digest) and every user runs again; the unedited file resumes as before."""
    from engine.own_model import file_version

    path = tmp_path / "mine.py"
    path.write_text(EXP4.read_text())
    first = file_version(path)
    cfg = RunConfig(algo=str(path), processes=1, users=[3], result_dir=tmp_path / "result", quiet=True)
    assert run(cfg).done == 1
    assert run(cfg).already == 1  # same file: resumed
    old = read_results(tmp_path / "result" / "EXP-4.jsonl")[0]
    assert [line["model_sha1"] for line in old] == [first]
    path.write_text(EXP4.read_text().replace("DEFAULT_W = [1.0, 0.7, 3.0, 0.3]", "DEFAULT_W = [1.0, 0.7, 3.0, 0.4]"))
    summary = run(cfg)
    assert summary.done == 1 and summary.already == 0
    assert f"1 result(s) in EXP-4.jsonl came from another version of {path}: moved to EXP-4.jsonl.{first}" \
        in capsys.readouterr().err
    assert read_results(tmp_path / "result" / f"EXP-4.jsonl.{first}")[0] == old
    new = read_results(tmp_path / "result" / "EXP-4.jsonl")[0]
    assert [line["model_sha1"] for line in new] == [file_version(path)] != [first]


def test_runner_reports_a_broken_file_as_a_data_error(tmp_path):
    from data_loader import DataError

    path = tmp_path / "mine.py"
    path.write_text("DEFAULT_W = 3\n")
    with pytest.raises(DataError, match="DEFAULT_W"):
        run(RunConfig(algo=str(path), processes=1, users=[1], result_dir=tmp_path, quiet=True))


def test_example_is_documented():
    doc = (REPO_ROOT / "docs" / "own-model.md").read_text()
    assert "examples/exp4.py" in doc and Path(EXP4).exists()
