"""download_data.py without the network: snapshot_download is replaced by a fake."""

from __future__ import annotations

import huggingface_hub
import huggingface_hub.errors
import pytest

import download_data as dd


class Recorder:
    def __init__(self, exc: BaseException | None = None):
        self.calls: list[dict] = []
        self.exc = exc

    def __call__(self, repo_id, **kwargs):
        self.calls.append({"repo_id": repo_id, **kwargs})
        if self.exc is not None:
            raise self.exc
        return kwargs["local_dir"]


@pytest.fixture
def fake(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", rec)
    return rec


def test_parse_users():
    assert dd.parse_users("1-3,250") == [1, 2, 3, 250]
    assert dd.parse_users(" 5 , 2-2,5") == [2, 5]
    for bad in ("", "a", "3-1", "0", "1-x"):
        with pytest.raises(ValueError):
            dd.parse_users(bad)


def test_subset_allow_patterns(fake, tmp_path, capsys):
    rc = dd.main(["--out", str(tmp_path / "ds"), "--users", "1-2,250"])
    assert rc == 0
    (call,) = fake.calls
    assert call["repo_id"] == "open-spaced-repetition/anki-revlogs-10k"
    assert call["repo_type"] == "dataset"
    assert call["local_dir"] == str(tmp_path / "ds")
    expected = {f"{t}/user_id={u}/*" for u in (1, 2, 250) for t in ("revlogs", "cards", "decks")}
    assert set(call["allow_patterns"]) == expected and len(call["allow_patterns"]) == 9
    assert "3 user(s)" in capsys.readouterr().out


def test_all_users_patterns(fake, tmp_path):
    assert dd.main(["--out", str(tmp_path)]) == 0
    patterns = fake.calls[0]["allow_patterns"]
    assert {"revlogs/*", "cards/*", "decks/*"} <= set(patterns)


def test_default_out_is_next_to_repo():
    assert dd.DEFAULT_OUT.name == "anki-revlogs-10k"
    assert dd.DEFAULT_OUT.parent == __import__("pathlib").Path(dd.__file__).resolve().parent.parent


@pytest.mark.parametrize("exc", [
    huggingface_hub.errors.LocalEntryNotFoundError("cannot reach the hub and nothing cached"),
    ConnectionError("Name or service not known"),
    TimeoutError("timed out"),
    OSError("network is unreachable"),
], ids=["local-entry", "connection", "timeout", "oserror"])
def test_unreachable_hub_exit_2(monkeypatch, tmp_path, capsys, exc):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", Recorder(exc))
    rc = dd.main(["--out", str(tmp_path), "--users", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot download open-spaced-repetition/anki-revlogs-10k")


def test_http_error_exit_2(monkeypatch, tmp_path, capsys):
    httpx = pytest.importorskip("httpx2")  # the HTTP client of huggingface_hub 2.x

    response = httpx.Response(401, request=httpx.Request("GET", "https://huggingface.co/api/datasets/x"))
    exc = huggingface_hub.errors.HfHubHTTPError("401 Unauthorized", response=response)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", Recorder(exc))
    assert dd.main(["--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_raw_transport_error_exit_2(monkeypatch, tmp_path, capsys):
    httpx = pytest.importorskip("httpx2")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", Recorder(httpx.ConnectError("connection refused")))
    assert dd.main(["--out", str(tmp_path), "--users", "3"]) == 2
    assert "ConnectError" in capsys.readouterr().err


def test_bad_users_argument(fake, tmp_path, capsys):
    assert dd.main(["--out", str(tmp_path), "--users", "10-1"]) == 1
    assert fake.calls == []
    assert capsys.readouterr().err.startswith("error: --users")
