"""pretrain.py on a real folder in the anki-revlogs-10k layout (the upstream-check fixture: two real collections),
the way a researcher reproduces upstream's recipe (`python pretrain.py --model GRU --data ../anki-revlogs-10k
--users 1-500`): ids absent from the range, a damaged user and a user with too little data are each named in one
line and skipped, and the weights written are the shipped format (.pth state dict of the model's network, .npz with
the same arrays)."""

from pathlib import Path

import numpy as np
import pytest
import torch

import models

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tests" / "fixtures" / "upstream-check"
EMBEDDED = ROOT / "data" / "embedded"


def real_folder(tmp_path: Path) -> Path:
    """users 8 and 12 of the fixture, user 4 of data/embedded (too few reviews to train on) and a user 9 whose
    revlog file is not parquet; everything else in 1-500 absent."""
    root = tmp_path / "anki-revlogs-10k"
    for kind in ("revlogs", "cards", "decks"):
        (root / kind).mkdir(parents=True)
        for u in (8, 12):
            (root / kind / f"user_id={u}").symlink_to(CHECK / kind / f"user_id={u}")
        (root / kind / "user_id=4").symlink_to(EMBEDDED / kind / "user_id=4")
    broken = root / "revlogs" / "user_id=9"
    broken.mkdir()
    (broken / "data.parquet").write_bytes(b"this is not a parquet file")
    return root


@pytest.mark.parametrize("model", ["GRU", "Transformer"])
def test_pretrain_main_on_real_folder_writes_shipped_format(tmp_path, capsys, model):
    import pretrain

    root = real_folder(tmp_path)
    out = tmp_path / "w" / f"{model}.pth"
    assert pretrain.main(["--model", model, "--data", str(root), "--users", "1-500", "--epochs", "1",
                          "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "496 of the 500 requested user id(s) are not in" in err  # 4, 8, 9 and 12 are there
    assert "user 4: skipped (not enough data)" in err
    assert "user 9: skipped (" in err
    assert f"{model}: 2 user(s)," in err
    net = models.model_class(model).net_class()
    fresh = {k: v.shape for k, v in net.state_dict().items()}
    state = torch.load(out, weights_only=True)
    assert {k: v.shape for k, v in state.items()} == fresh
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in state.values())
    net.load_state_dict(state)  # strict: the model's own network takes the file as it is
    with np.load(out.with_suffix(".npz")) as npz:  # the torch-free runs' copy
        assert sorted(npz.files) == sorted(state)
        assert all(np.array_equal(npz[k], v.numpy()) for k, v in state.items())


def test_pretrain_mix_appends_copies_of_other_users(tmp_path, capsys):
    """--mix ROOT USERS TIMES (how the shipped files add the real collections to the simulated users): the cohort
    is --data's users, then TIMES copies of the mixed users; the target rows add up accordingly."""
    import pretrain
    from data_loader import load_revlogs
    from features import FeatureConfig, build_features

    rows = {u: len(build_features(load_revlogs(CHECK, u), FeatureConfig())) for u in (8, 12)}
    out = tmp_path / "GRU-P.pth"
    assert pretrain.main(["--model", "GRU-P", "--data", str(CHECK), "--users", "8", "--mix", str(CHECK), "12", "3",
                          "--epochs", "1", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"GRU-P: 1 user(s) + 3 x 1 of {CHECK} (12), {rows[8] + 3 * rows[12]} target rows" in err
    assert out.exists() and out.with_suffix(".npz").exists()


def test_simulate_retention_range_is_the_same_draw():
    """bench/simulate.py --retention LO HI (the wide-retention users of the shipped files): the default range given
    explicitly is the default user, bit for bit; a low range makes interval reviews fail more often."""
    from bench.simulate import simulate_user

    base = simulate_user(3000, seed=7)
    assert simulate_user(3000, seed=7, retention=(0.85, 0.95)).equals(base)

    def fail_rate(df):
        interval = df[df["elapsed_days"] > 0]
        return float((interval["rating"] == 1).mean())

    assert fail_rate(simulate_user(3000, seed=7, retention=(0.6, 0.61))) > fail_rate(base) + 0.1
