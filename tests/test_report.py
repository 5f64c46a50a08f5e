"""report.py: one command from an Anki export to a page. The page's numbers are the result files' (as evaluate.py
reads them), a rerun or a renamed copy reuses what was computed, bad input ends in one line and exit code 2, and a
real headless browser opens the page from disk with every image decoded and no request leaving it."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import evaluate
import report
import report_page

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "anki"
KANJI = FIXTURES / "illdepence-kanjiplot.anki2"
SAT = FIXTURES / "kedarmhaswade-SAT-math-formulas.colpkg"
VOCAB = FIXTURES / "kedarmhaswade-english-vocab-2023.apkg"
MODELS = ["FSRS-6", "AVG", "Anki-default", "SM2", "HLR"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    code = report.main([str(KANJI), "--out", str(out), "--models", ",".join(MODELS), "--processes", "1",
                        "--quiet", "--resamples", "400"])
    return out, code, json.loads((out / "report.json").read_text())


def work_dir(out: Path) -> Path:
    (work,) = (out / ".work").iterdir()
    return work


def test_page_files_and_every_model_listed(single):
    out, code, data = single
    assert code == 0
    md = (out / "report.md").read_text()
    html = (out / "index.html").read_text()
    for name in MODELS:
        label = evaluate.display_name(name)
        assert f"| {label} | {name}.jsonl |" in md  # the "Models run" table
        assert label in html
    for img in ("calibration.png", "calibration-best-vs-anki.png", "head-to-head.png"):
        assert (out / "img" / img).stat().st_size > 1000
        assert f"img/{img}" in md
    assert "http://" not in html and "https://" not in html
    assert "only card ids, review times and ratings" in md


def test_ranking_numbers_are_evaluates(single):
    out, _, data = single
    models = {m.name: m for m in evaluate.load_models(work_dir(out) / "result", MODELS)}
    md = (out / "report.md").read_text()
    for entry in data["ranking"]:
        m = models[entry["model"]]
        assert list(m.users) == [1]
        for key in ("LogLoss", "RMSE(bins)", "AUC", "smECE"):
            assert entry[key] == m.metrics[key][0]
        assert entry["size"] == m.size[0]
        row = f"| {entry['label']} | {entry['LogLoss']:.4f} ("
        assert row in md
        assert f"| {entry['label']} | {entry['smECE']:.4f} |" in md  # the calibration section's smECE table
    assert "smECE (smoothed expected calibration error)" in md.split("## Calibration")[1].split("## ")[0]
    lls = [e["LogLoss"] for e in data["ranking"]]
    assert lls == sorted(lls)  # best first
    assert data["headline"].startswith(f"{data['ranking'][0]['label']} predicts the reviews")


def test_head_to_head_shares_add_up_to_100(single):
    _, _, data = single
    share = np.array(data["head_to_head"]["share"], dtype=float)
    off = ~np.eye(len(share), dtype=bool)
    assert np.allclose((share + share.T)[off], 100)
    assert data["head_to_head"]["models"] == [e["model"] for e in data["ranking"]]


def test_data_section_accounts_for_every_review(single):
    _, _, data = single
    facts = data["collection"]
    # conversion drops and pipeline drops add up with the evaluated reviews to the collection's revlog (6,158 rows)
    assert facts["evaluated"] == 3055  # upstream's size for this collection
    assert sum(n for _, n in facts["reasons"]) + facts["evaluated"] == 6158


def test_rerun_and_renamed_copy_reuse_the_results(single, tmp_path, capsys):
    out, _, _ = single
    copy = tmp_path / "renamed.anki2"
    shutil.copy(KANJI, copy)
    before = {p.name: p.read_text() for p in (work_dir(out) / "result").glob("*.jsonl")}
    capsys.readouterr()
    code = report.main([str(copy), "--out", str(out), "--models", ",".join(MODELS), "--processes", "1", "--quiet",
                        "--resamples", "400"])
    err = capsys.readouterr().err
    assert code == 0
    assert err.count("0 user(s) to run, 1 already in") == len(MODELS)
    assert {p.name: p.read_text() for p in (work_dir(out) / "result").glob("*.jsonl")} == before
    assert "renamed.anki2" in (out / "report.md").read_text()


def test_parameters_command(single, capsys):
    out, _, data = single
    assert report.main([str(KANJI), "--out", str(out), "--parameters"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if "all reviews" in x)
    values = [float(v) for v in line.split(":", 1)[1].split(",")]
    assert len(values) == 21
    assert report_page.anki_text(values) in (out / "report.md").read_text()


def test_unreadable_file_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "broken.colpkg"
    bad.write_bytes(b"not a zip file at all")
    assert report.main([str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}:")
    assert report.main([str(tmp_path / "missing.apkg"), "--out", str(tmp_path / "r")]) == 2


def test_too_little_data_is_a_page_not_a_traceback(tmp_path):
    out = tmp_path / "r"
    assert report.main([str(VOCAB), "--out", str(out), "--models", "AVG,FSRS-6", "--quiet"]) == 0
    md = (out / "report.md").read_text()
    assert "Too little data" in md and "94 reviews" in md


def test_several_collections_show_evaluates_tables(tmp_path):
    out = tmp_path / "r"
    assert report.main([str(KANJI), str(SAT), "--out", str(out), "--models", "AVG,SM2", "--processes", "1",
                        "--quiet"]) == 0
    models, info = evaluate.common_users(evaluate.load_models(work_dir(out) / "result", ["AVG", "SM2"]))
    md = (out / "report.md").read_text()
    assert evaluate.build_tables(models, info) in md
    data = json.loads((out / "report.json").read_text())
    for entry in data["ranking"]:  # smECE per collection from the result lines, averaged weighted by reviews
        m = next(m for m in models if m.name == entry["model"])
        assert entry["smECE"] == pytest.approx(np.average(m.metrics["smECE"], weights=m.size), rel=1e-12)
        assert f"| {entry['label']} | {entry['smECE']:.4f} |" in md
    assert (out / "img" / "Superiority-2.png").exists()


# ------------------------------------------------------------------------------------------ a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_SCRIPT = r"""
import json, sys
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=sys.argv[1], args=["--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"])
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(sys.argv[2])
    page.wait_for_load_state("load")
    sizes = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    page.screenshot(path=sys.argv[3], full_page=False)
    browser.close()
print(json.dumps({"requests": requests, "images": sizes}))
"""


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary: apt-get install chromium (Debian's package)")
def test_page_in_a_real_browser(single, tmp_path):
    pytest.importorskip("playwright", reason="pip install -r requirements.txt (playwright drives the browser)")
    out, _, _ = single
    shot = tmp_path / "shot.png"
    url = (out / "index.html").resolve().as_uri()
    proc = subprocess.run([sys.executable, "-c", BROWSER_SCRIPT, CHROMIUM, url, str(shot)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["requests"] == [url]  # the page itself, nothing else: images are inline, no network
    assert len(seen["images"]) == 3
    for complete, width, height in seen["images"]:
        assert complete and width > 0 and height > 0
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape[0] > 500 and pixels.std() > 10  # text, tables and plots: not a blank page
