"""GRU, GRU-P (and -short), NN-17 and the LSTM run without torch by default (neural/card_net.py's FlatNet twins): the process
never imports torch, the shipped .npz weights equal the .pth state dicts, each description's flat layout is its torch
module's parameters() order, and the torch-free fine-tune + prediction equals the torch module's on a real user."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import models
from config import EMBEDDED_DATA, RunConfig
from neural import neural_seq
from neural.card_net import FlatNet, epoch_orders

ROOT = Path(__file__).resolve().parents[1]
FLAT_ROWS = [("GRU", False), ("GRU-P", False), ("GRU-P", True), ("NN-17", False), ("LSTM", False)]
SECS_ROWS = [("GRU", True), ("GRU-P", True)]  # --short --secs: pretrain/<model>-short-secs


def weights_names() -> list[str]:
    return [models.model_class(a).weights_name(RunConfig(algo=a, short=s)) for a, s in FLAT_ROWS] + \
        [models.model_class(a).weights_name(RunConfig(algo=a, short=s, secs=True)) for a, s in SECS_ROWS]


@pytest.mark.parametrize("name", weights_names())
def test_shipped_npz_equals_pth(name):
    """Every shipped weight file a torch-free row reads: same keys, shapes, dtype and values as the .pth."""
    pth = torch.load(ROOT / "pretrain" / f"{name}.pth", map_location="cpu", weights_only=True)
    with np.load(ROOT / "pretrain" / f"{name}.npz") as npz:
        assert sorted(npz.files) == sorted(pth)
        for k, v in pth.items():
            assert npz[k].dtype == np.float32 and npz[k].shape == tuple(v.shape)
            np.testing.assert_array_equal(npz[k], v.numpy())


def test_shipped_lstm_optimizer_npz_equals_pth():
    """LSTM_opt.npz: the inner AdamW state of LSTM_opt.pth, flat in parameters() order (float32, its step)."""
    from neural.lstm_torch import LSTMNet, flat_opt_state

    m, v, step = flat_opt_state(LSTMNet(), torch.load(ROOT / "pretrain" / "LSTM_opt.pth", weights_only=True))
    with np.load(ROOT / "pretrain" / "LSTM_opt.npz") as npz:
        assert int(npz["step"]) == step > 0
        np.testing.assert_array_equal(npz["exp_avg"].astype(np.float64), m)
        np.testing.assert_array_equal(npz["exp_avg_sq"].astype(np.float64), v)


@pytest.mark.parametrize("algo", ["GRU", "GRU-P", "NN-17", "LSTM"])
def test_description_is_the_torch_layout(algo):
    """param_shapes() (the flat layout the kernels read) is the torch module's named_parameters() in order."""
    cls = models.model_class(algo)
    torch_net = cls.net_class()
    assert [(n, tuple(p.shape)) for n, p in torch_net.named_parameters()] == cls.flat_class().param_shapes()
    assert cls.flat_class().n_params() == torch_net.n_params()


def test_epoch_orders_equal_torch_randperm():
    generator = torch.Generator().manual_seed(2023)
    expected = np.stack([torch.randperm(50, generator=generator).numpy() for _ in range(3)])
    np.testing.assert_array_equal(epoch_orders(50, 3), expected)


def test_flat_net_stores_float32_like_torch():
    """set_theta rounds to float32 as copying float64 weights into a float32 torch parameter does."""
    flat = models.model_class("GRU").flat_class()
    theta = np.linspace(-1.0, 1.0, flat.n_flat()) / 3.0
    flat.set_theta(theta)
    np.testing.assert_array_equal(flat.theta(), torch.from_numpy(theta).float().double().numpy())


@pytest.mark.parametrize("algo,short", FLAT_ROWS[:4])
def test_flat_fit_and_predict_equal_torch_module(algo, short):
    """The default (torch-free) model and the same recipe on the torch module, on embedded user 3: equal
    predictions after the fine-tune, bit for bit."""
    from data_loader import load_revlogs
    from features import FeatureConfig, build_features

    data = build_features(load_revlogs(EMBEDDED_DATA, 3), FeatureConfig(short=short))
    n = len(data) * 2 // 3
    train, test = data.subset(np.arange(n)), data.subset(np.arange(n, len(data)))
    cfg = RunConfig(algo=algo, short=short)
    cls = models.model_class(algo)
    model = cls(cfg)
    assert isinstance(model.net, FlatNet)
    net = neural_seq.torch_net(cls.net_class, cls.weights_name(cfg), cls.pretrain_command(cfg))
    np.testing.assert_array_equal(model.net.theta(), net.theta())
    model.fit(train)
    neural_seq.fit_cards(net, train, n_epoch=cls.n_epoch, batch_size=cfg.batch_size, max_seq_len=cfg.max_seq_len)
    np.testing.assert_array_equal(model.net.theta(), net.theta())
    np.testing.assert_array_equal(model.predict(test), neural_seq.predict_cards(net, test))


def test_missing_npz_falls_back_to_pth_and_then_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SRS_BENCH_PRETRAIN_DIR", str(tmp_path))
    cls = models.model_class("GRU")
    with pytest.raises(FileNotFoundError, match=r"python pretrain.py --model GRU --data PATH"):
        cls(RunConfig(algo="GRU"))
    (tmp_path / "GRU.pth").write_bytes((ROOT / "pretrain" / "GRU.pth").read_bytes())
    with np.load(ROOT / "pretrain" / "GRU.npz") as npz:
        expected = {k: npz[k] for k in npz.files}
    got = cls(RunConfig(algo="GRU")).net.state_dict()
    assert all(np.array_equal(got[k], v) for k, v in expected.items())


@pytest.mark.parametrize("algo,short", FLAT_ROWS)
def test_cli_run_never_imports_torch_and_writes_the_torch_results(tmp_path, algo, short):
    """other.py's command line in a fresh process (one embedded user): torch is never imported; the result lines
    equal those of the same run (same compiled trainer) on the torch modules (NeuralModel.torch_free patched off)."""
    args = ["--model", algo, "--users", "3" if algo == "LSTM" else "2", "--processes", "1", "--quiet", "--data", str(EMBEDDED_DATA)]
    args += ["--short"] if short else []
    name = algo + ("-short" if short else "")
    code = ("import sys, runner, models\n"
            f"rc = runner.main({args + ['--result-dir', str(tmp_path / 'flat')]!r}, '', 'FSRS-6', None)\n"
            "assert rc == 0, rc\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)

    import runner
    from neural.card_net import NeuralModel

    orig = NeuralModel.torch_free
    NeuralModel.torch_free = lambda self: False  # the same run on the torch modules
    try:
        assert runner.main(args + ["--result-dir", str(tmp_path / "torch")], "", "FSRS-6", None) == 0
    finally:
        NeuralModel.torch_free = orig

    def lines(path):
        return [{k: v for k, v in json.loads(x).items() if k != "time_ms"} for x in path.read_text().splitlines()]

    flat, ref = lines(tmp_path / "flat" / f"{name}.jsonl"), lines(tmp_path / "torch" / f"{name}.jsonl")
    assert flat == ref and len(flat) == 1
