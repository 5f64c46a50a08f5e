"""The page report.py writes: its content from the result files, then the same content as HTML and as Markdown.

It computes no metric of its own: the ranking numbers are the result files' (evaluate.py's tables for several
collections), intervals and head-to-head shares come from resample.py, calibration bins from analysis.py. The
content is a list of sections of plain blocks (paragraphs, tables, images, code), so `index.html` (one file, images
inline as data: URIs, no request leaves the page) and `report.md` (images beside it in img/) say the same.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

import analysis
import evaluate
import resample
from features import NOT_TARGETS

ANKI_DEFAULT, FSRS6 = "Anki-default", "FSRS-6"  # the two models the headline always speaks of
FEW_REVIEWS = 1000  # below this a collection's calibration is too noisy to say much (the essay's rule of thumb)
PRIVACY = ("Nothing of your cards' text was read or written: only card ids, review times and ratings. Everything "
           "was computed on this computer; this page loads nothing from the internet.")


@dataclass
class Section:
    title: str
    # ("p", text) | ("table", header, rows) | ("img", path, alt) | ("code", text) | ("markdown", text)
    blocks: list = field(default_factory=list)

    def p(self, text):
        self.blocks.append(("p", text))

    def table(self, header, rows):
        self.blocks.append(("table", header, rows))

    def img(self, path, alt):
        self.blocks.append(("img", Path(path), alt))

    def code(self, text):
        self.blocks.append(("code", text))


@dataclass
class Page:
    headline: str
    html_path: Path
    md_path: Path
    data: dict


# ------------------------------------------------------------------------------------------------- reading

def test_rows(work: Path, name: str, user: int) -> pd.DataFrame | None:
    """A model's evaluated reviews of one user (the runner's per-user file): card, review, y, p, bin features."""
    path = work / "evaluation" / name / f"{user}.tsv"
    if not path.exists():
        return None
    return pd.read_csv(path, sep="\t", usecols=["card_id", "review_th", "y", "p", "elapsed_days", "i",
                                                 "rmse_bins_lapse"])


def result_lines(work: Path, name: str) -> dict[int, dict]:
    import runner

    lines, _ = runner.read_results(work / "result" / f"{name}.jsonl")
    return {int(x["user"]): x for x in lines}


def collection_facts(inputs, user: int) -> dict:
    """Reviews, cards, span and where the reviews went (conversion rules, then the feature pipeline of FSRS-6,
    then the split's first block), counted per reason."""
    from config import RunConfig
    from data_loader import load_revlogs
    from features import FeatureConfig, NotEnoughData, build_features
    from split import evaluated_size

    import build_dataset

    revlogs = load_revlogs(inputs.root, user)
    meta = inputs.collections.get(user, {})
    facts = {"name": meta.get("name", f"user {user}"), "reviews": len(revlogs),
             "cards": int(revlogs["card_id"].nunique()), "dates": meta.get("dates"), "reasons": [],
             "days": int(revlogs["day_offset"].max()) + 1 if len(revlogs) else 0}
    for key, n in (meta.get("dropped") or {}).items():
        if n:
            facts["reasons"].append((build_dataset.DROPPED[key] + " (at conversion)", int(n)))
    counts: dict = {}
    try:
        build_features(revlogs, FeatureConfig.from_run(RunConfig(algo="FSRS-6")), accounting=counts)
    except NotEnoughData:
        pass
    for key, label in NOT_TARGETS.items():
        if counts.get(key):
            facts["reasons"].append((label, counts[key]))
    targets = counts.get("targets", 0)
    evaluated = evaluated_size(targets) if targets >= 6 else 0
    if targets - evaluated:
        facts["reasons"].append(("training only (the first of the 6 time-ordered blocks is never tested)",
                                 targets - evaluated))
    facts["evaluated"] = evaluated
    return facts


# ----------------------------------------------------------------------------------------------- formatting

def _f(x, digits=4) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


SMECE_TEXT = ("smECE (smoothed expected calibration error) sums the picture up in one number: how far predicted "
              "recall is, on average over your reviews, from the recall measured among reviews with similar "
              "predictions, looked at through a smooth window instead of fixed bins. 0 is perfect; 0.02 is about 2 "
              "percentage points off. Lower is better.")


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float | None:
    """Mean over the collections that have the value (result lines written before smECE lack it), or None."""
    have = ~np.isnan(values)
    return float(np.average(values[have], weights=weights[have])) if have.any() else None


def _points(mae: float) -> str:
    return f"{100 * mae:.1f}"


def _label(name: str) -> str:
    return evaluate.display_name(name)


def _n_params(name: str, line: dict) -> str:
    known = evaluate.known_model(name)
    if known:
        return str(known[0])
    params = line.get("parameters")
    return str(evaluate._count_parameters(params) or 0)


# ---------------------------------------------------------------------------------------------- one collection

def single(inputs, names, runs, params, args, sections, data) -> str:
    user = next(iter(inputs.collections))
    facts = collection_facts(inputs, user)
    data["collection"] = facts
    img = args.out / "img"
    lines = {n: result_lines(inputs.work, n).get(user) for n in names}
    done = [n for n in names if lines[n] is not None]
    rows = {n: test_rows(inputs.work, n, user) for n in done}
    done = [n for n in done if rows[n] is not None]
    if not done:
        why = [runs[n]["skipped"].get(user) or runs[n]["failed"].get(user) or runs[n]["error"] for n in names]
        why = next((w for w in why if w), "no model produced a result")
        headline = (f"Too little data to compare algorithms on {facts['name']}: {facts['reviews']:,} reviews, of "
                    f"which {facts['evaluated']:,} could be evaluated ({why}). At least a few hundred evaluated "
                    f"reviews, ideally {1000:,}, are needed.")
        return headline

    # card resamples: one matrix product per model and metric, chunk by chunk
    card_index = pd.Index(pd.unique(np.concatenate([rows[n]["card_id"].to_numpy() for n in done])))
    common = set.intersection(*(set(rows[n]["review_th"]) for n in done))
    keyed = {}  # per model: card index, y, p, its rows, and which of its reviews every model evaluated
    for n in done:
        r = rows[n]
        keyed[n] = (card_index.get_indexer(r["card_id"]), r["y"].to_numpy(np.int64), r["p"].to_numpy(np.float64), r,
                    r["review_th"].isin(common).to_numpy())
    stats = {n: {"LogLoss": [], "RMSE(bins)": [], "AUC": []} for n in done}
    common_ll = []
    for W in resample.card_multiplicities(len(card_index), args.resamples):
        cols = []
        for n in done:
            card, y, p, r, m = keyed[n]
            stats[n]["LogLoss"].append(resample.log_loss(W, card, y, p))
            stats[n]["RMSE(bins)"].append(resample.rmse_bins(W, card, y, p, r["elapsed_days"], r["i"],
                                                             r["rmse_bins_lapse"]))
            stats[n]["AUC"].append(resample.auc(W, card, y, p))
            cols.append(resample.log_loss(W, card[m], y[m], p[m]))
        common_ll.append(np.stack(cols, axis=1))
    order = sorted(done, key=lambda n: lines[n]["metrics"]["LogLoss"])
    ll = np.concatenate(common_ll)[:, [done.index(n) for n in order]]
    share = resample.head_to_head(ll)

    cals = {n: analysis.calibration_bins(rows[n]["p"].to_numpy(), rows[n]["y"].to_numpy()) for n in order}
    ranking = []
    for n in order:
        metrics = lines[n]["metrics"]
        entry = {"model": n, "label": _label(n), "parameters": _n_params(n, lines[n]), "size": lines[n]["size"],
                 "seconds": lines[n].get("time_ms", 0) / 1000, "mae": cals[n]["mae"], "rmse_cal": cals[n]["rmse"]}
        for key in ("LogLoss", "RMSE(bins)", "AUC"):
            entry[key] = metrics.get(key)
            entry[key + " interval"] = resample.interval(np.concatenate(stats[n][key]))
        entry["smECE"] = metrics.get("smECE")  # None in a result line written before smECE was added
        ranking.append(entry)
    data.update(ranking=ranking, head_to_head={"models": order, "share": share.tolist(),
                                               "reviews": len(common)})

    best = ranking[0]
    by = {e["model"]: e for e in ranking}
    parts = [f"{best['label']} predicts the reviews of {facts['name']} best: Log Loss {_f(best['LogLoss'])}; its "
             f"predicted recall is off by {_points(best['mae'])} percentage points on average."]
    for name, who in ((FSRS6, "FSRS-6's"), (ANKI_DEFAULT, "Anki's default scheduler (SM-2)'s")):
        if name in by and name != best["model"]:
            parts.append(f"{who} predictions are off by {_points(by[name]['mae'])} points.")
    close = [order[k] for k in range(1, len(order)) if share[0, k] < 99]
    if close:
        parts.append(f"The data cannot tell {best['label']} apart from {', '.join(_label(n) for n in close[:4])}"
                     f"{' and others' if len(close) > 4 else ''}: in more than 1% of card resamples "
                     f"{'they do' if len(close) > 1 else 'it does'} better.")
    if best["size"] < FEW_REVIEWS:
        parts.append(f"Only {best['size']:,} reviews could be evaluated: with fewer than {FEW_REVIEWS:,} the "
                     "ranking is rough.")
    headline = " ".join(parts)

    s = Section("Ranking")
    s.p(f"Lower Log Loss and RMSE (bins) are better, higher AUC is better. Each value is the model's result on the "
        f"{facts['evaluated']:,} evaluated reviews (the benchmark's protocol: trained on the past, tested on the "
        f"future, 5 times); the brackets hold a 99% interval from {args.resamples:,} resamples of whole cards (a "
        f"card's reviews depend on each other, so cards are resampled, not single reviews). \"Off by\" is the "
        f"calibration error: predicted vs measured recall in 5% bins, weighted by reviews.")
    s.table(["#", "Model", "Log Loss", "RMSE (bins)", "AUC", "Off by (points)", "Parameters", "Reviews",
             "Time (s)"],
            [[str(k + 1), e["label"]] + [f"{_f(e[m])} ({_f(e[m + ' interval'][0])}–{_f(e[m + ' interval'][1])})"
                                         for m in ("LogLoss", "RMSE(bins)", "AUC")]
             + [_points(e["mae"]), e["parameters"], f"{e['size']:,}", f"{e['seconds']:.1f}"]
             for k, e in enumerate(ranking)])
    sections.append(s)

    s = Section("Calibration")
    s.p("For every model: its predictions grouped in bins of 5% (x), against the share of those reviews you "
        "actually recalled (y). A perfect model lies on the dashed diagonal. Bars: reviews per bin (right axis).")
    s.img(analysis.calibration_grid({_label(n): cals[n] for n in order}, img / "calibration.png",
                                    f"Calibration on {facts['name']}"),
          "calibration of every model")
    if ANKI_DEFAULT in cals and ANKI_DEFAULT != order[0]:
        s.img(analysis.calibration_overlay({_label(order[0]): cals[order[0]], _label(ANKI_DEFAULT): cals[ANKI_DEFAULT]},
                                           img / "calibration-best-vs-anki.png",
                                           f"{_label(order[0])} against Anki's default scheduler"),
              "the best model against Anki's default scheduler")
    s.p(SMECE_TEXT)
    s.table(["Model", "smECE"], [[e["label"], _f(e["smECE"])] for e in ranking])
    sections.append(s)

    s = Section("Head to head")
    s.p(f"Row model against column model: the % of {args.resamples:,} card resamples in which the row model's "
        f"Log Loss is lower (each pair adds up to 100), on the {len(common):,} reviews every model evaluated.")
    s.img(analysis.head_to_head_plot(share, [_label(n) for n in order], img / "head-to-head.png",
                                     "Head to head: % of card resamples where A beats B"), "head-to-head shares")
    sections.append(s)
    data_section(sections, [facts])
    return headline


# ------------------------------------------------------------------------------------------ several collections

def several(inputs, names, runs, params, args, sections, data) -> str:
    import warnings

    img = args.out / "img"
    have = [n for n in names if (inputs.work / "result" / f"{n}.jsonl").exists()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = [evaluate.read_result_file(inputs.work / "result" / f"{n}.jsonl") for n in have]
    loaded = [m for m in loaded if len(m.users)]
    facts = [collection_facts(inputs, u) for u in inputs.collections]
    data["collections"] = facts
    if not loaded:
        return "Too little data: no model could evaluate any of these collections."
    models, info = evaluate.common_users(loaded)
    if info["users"] == 0:
        return "No collection was evaluated by every model; see the errors below."
    tables = evaluate.build_tables(models, info)
    data["tables"] = tables
    weighted = {m.name: float(np.average(m.metrics["LogLoss"], weights=m.size)) for m in models}
    order = sorted(weighted, key=weighted.get)
    by_name = {m.name: m for m in models}
    logloss = np.stack([by_name[n].metrics["LogLoss"] for n in order], axis=1)
    users = by_name[order[0]].users
    cals = {}
    for n in order:
        frames = [test_rows(inputs.work, n, int(u)) for u in users]
        frames = [f for f in frames if f is not None]
        if frames:
            pooled = pd.concat(frames)
            cals[n] = analysis.calibration_bins(pooled["p"].to_numpy(), pooled["y"].to_numpy())
    parts = [f"Over {info['users']:,} collections ({info['reviews']:,} evaluated reviews), {_label(order[0])} "
             f"predicts best (Log Loss {weighted[order[0]]:.4f}, weighted by reviews)."]
    for name, who in ((FSRS6, "FSRS-6's"), (ANKI_DEFAULT, "Anki's default scheduler (SM-2)'s")):
        if name in cals:
            parts.append(f"{who} predictions are off by {_points(cals[name]['mae'])} percentage points on average.")
    if info["users"] < 10:
        parts.append("With so few collections every interval is wide.")
    headline = " ".join(parts)
    s = Section("Ranking")
    s.p("The benchmark's tables over these collections (evaluate.py): means with 99% intervals from resampling "
        "collections.")
    s.blocks.append(("markdown", tables))
    sections.append(s)
    s = Section("Per collection")
    s.p("Each collection's Log Loss for every model (lower is better).")
    s.img(analysis.distribution_plot(logloss, [_label(n) for n in order], img / "logloss-per-collection.png"),
          "Log Loss per collection")
    sections.append(s)
    s = Section("Head to head")
    if info["users"] >= 2:
        s.img(analysis.superiority_plot(logloss, [_label(n) for n in order], img), "superiority")
        for path in analysis.significance_plots(logloss, [_label(n) for n in order], img):
            s.img(path, "significance")
    else:
        s.p("One collection only: no comparison across collections.")
    sections.append(s)
    smece = {n: _weighted_mean(by_name[n].metrics["smECE"], by_name[n].size) for n in order}
    if cals:
        s = Section("Calibration")
        s.p("Every model's predictions over all collections pooled, in bins of 5%, against measured recall.")
        s.img(analysis.calibration_grid({_label(n): c for n, c in cals.items()}, img / "calibration.png",
                                        "Calibration, all collections pooled"),
              "calibration of every model")
        s.p(SMECE_TEXT + " Here each collection's smECE, averaged weighted by its evaluated reviews.")
        s.table(["Model", "smECE"], [[_label(n), _f(smece[n])] for n in order])
        sections.append(s)
    data["ranking"] = [{"model": n, "label": _label(n), "weighted LogLoss": weighted[n],
                        "mae": cals[n]["mae"] if n in cals else None, "smECE": smece[n]} for n in order]
    data_section(sections, facts)
    return headline


# ----------------------------------------------------------------------------------------- common sections

MAX_LISTED = 100  # collections listed one by one in "The data"; a larger data set is summed


def data_section(sections, facts: list[dict]) -> None:
    s = Section("The data")
    if len(facts) > 1:
        s.p(f"{len(facts):,} collections, {sum(f['reviews'] for f in facts):,} reviews, "
            f"{sum(f['evaluated'] for f in facts):,} evaluated (FSRS-6's protocol).")
        s.table(["Collection", "Reviews", "Cards", "Dates", "Evaluated"],
                [[f["name"], f"{f['reviews']:,}", f"{f['cards']:,}",
                  f"{f['dates'][0]} to {f['dates'][1]}" if f.get("dates") else f"{f['days']:,} days",
                  f"{f['evaluated']:,}"] for f in facts[:MAX_LISTED]])
        if len(facts) > MAX_LISTED:
            s.p(f"… and {len(facts) - MAX_LISTED:,} more.")
        total: dict[str, int] = {}
        for f in facts:
            for why, n in f["reasons"]:
                total[why] = total.get(why, 0) + n
        s.p("Reviews not evaluated, all collections together:")
        s.table(["Reason", "Reviews"], [[why, f"{n:,}"] for why, n in total.items()] or [["(none)", "0"]])
        s.p(PRIVACY)
        sections.append(s)
        return
    for f in facts:
        span = f"{f['dates'][0]} to {f['dates'][1]}" if f.get("dates") else f"{f['days']:,} days"
        s.p(f"{f['name']}: {f['reviews']:,} reviews of {f['cards']:,} cards, {span}. {f['evaluated']:,} reviews "
            f"were evaluated (FSRS-6's protocol; SM-2 and Ebisu evaluate slightly fewer when cards are missing from "
            f"the card list). Where the others went:")
        s.table(["Reason", "Reviews"], [[why, f"{n:,}"] for why, n in f["reasons"]] or [["(none)", "0"]])
    s.p(PRIVACY)
    sections.append(s)


def parameter_section(sections, inputs, params: dict) -> None:
    s = Section("Your FSRS parameters")
    if len(params) < len(inputs.collections):
        s.p(f"Shown for the first {len(params):,} of {len(inputs.collections):,} collections; the command below "
            "prints them for all.")
    s.p("FSRS-6 fitted on all of the collection's reviews: paste the numbers into Anki's deck options (FSRS "
        "section, parameters field). Anki's own optimizer may give slightly different values.")
    for user, p in params.items():
        name = inputs.collections[user]["name"]
        if "error" in p:
            s.p(f"{name}: no parameters ({p['error']}).")
            continue
        s.p(f"{name}, all presets together ({p['reviews']:,} reviews):")
        s.code(anki_text(p["all"]))
        for preset, q in sorted(p["presets"].items(), key=lambda kv: int(kv[0])):
            s.p(f"{name}, {preset_name(preset)} ({q['reviews']:,} reviews):")
            s.code(anki_text(q["w"]))
        for preset, why in p.get("too_few", {}).items():
            s.p(f"{name}, {preset_name(preset)}: too few reviews to fit ({why}).")
    s.p("Reproduce them with:")
    s.code(inputs_command(inputs) + " --parameters")
    sections.append(s)


def anki_text(w: list[float]) -> str:
    """The comma-separated form Anki's deck options accept (FSRS parameters field)."""
    return ", ".join(f"{x:.4f}" for x in w)


def preset_name(preset) -> str:
    """Presets are numbered in the order the collection's decks use them (names are not kept); -1: cards whose
    deck has no preset (a filtered deck)."""
    return "cards of decks without a preset (filtered decks)" if int(preset) < 0 else f"preset {int(preset) + 1}"


def inputs_command(inputs) -> str:
    import shlex

    if inputs.work / "data" != inputs.root:
        return f"python report.py --data {shlex.quote(str(inputs.root))}"
    return "python report.py " + " ".join(shlex.quote(c.get("path", c["name"])) for c in inputs.collections.values())


def errors_section(sections, names, runs, unavailable) -> None:
    problems = []
    for n in names:
        r = runs.get(n, {})
        if r.get("error"):
            problems.append([_label(n), "did not run", r["error"]])
        for user, why in sorted(r.get("failed", {}).items()):
            problems.append([_label(n), f"user {user} failed", why])
        for user, why in sorted(r.get("skipped", {}).items()):
            problems.append([_label(n), f"user {user} skipped", why])
    problems += [[_label(n), "not available", why] for n, why in unavailable]
    if problems:
        s = Section("Models that did not run everywhere")
        s.table(["Model", "What happened", "Why"], problems)
        sections.append(s)


# ---------------------------------------------------------------------------------------------- the page

def build(inputs, names, runs, params, args, unavailable=()) -> Page:
    out = Path(args.out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    sections: list[Section] = []
    data: dict = {"models": names}
    if len(inputs.collections) == 1:
        headline = single(inputs, names, runs, params, args, sections, data)
        if not sections:
            facts = data["collection"]
            data_section(sections, [facts])
    else:
        headline = several(inputs, names, runs, params, args, sections, data)
    parameter_section(sections, inputs, params)
    errors_section(sections, names, runs, unavailable)
    s = Section("Models run")
    s.table(["Model", "Result file", "Command"], [[_label(n), f"{n}.jsonl", _command(n)] for n in names])
    sections.append(s)
    data["headline"] = headline
    title = "Which algorithm fits " + ", ".join(c["name"] for c in inputs.collections.values())[:120] + "?"
    md_path, html_path = out / "report.md", out / "index.html"
    md_path.write_text(render_markdown(title, headline, sections, out), encoding="utf-8")
    html_path.write_text(render_html(title, headline, sections), encoding="utf-8")
    (out / "report.json").write_text(json.dumps(data, indent=1, default=_jsonable), encoding="utf-8")
    return Page(headline, html_path, md_path, data)


def _command(name: str) -> str:
    import rows

    return rows.BY_NAME[name].command() if name in rows.BY_NAME else ""


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(type(x))


# ----------------------------------------------------------------------------------------------- renderers

def render_markdown(title: str, headline: str, sections: list[Section], out: Path) -> str:
    lines = [f"# {title}", "", f"**{headline}**", ""]
    for s in sections:
        lines += [f"## {s.title}", ""]
        for block in s.blocks:
            kind = block[0]
            if kind == "p":
                lines += [block[1], ""]
            elif kind == "code":
                lines += ["```", block[1], "```", ""]
            elif kind == "markdown":
                lines += [block[1], ""]
            elif kind == "img":
                lines += [f"![{block[2]}]({block[1].relative_to(out).as_posix()})", ""]
            elif kind == "table":
                header, rows = block[1], block[2]
                lines.append("| " + " | ".join(header) + " |")
                lines.append("|" + "---|" * len(header))
                lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
                lines.append("")
    return "\n".join(lines)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.headline{font-size:1.2em;background:#eef5fb;border-left:4px solid #1565c0;padding:.8em 1em}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}th,td{border:1px solid #ddd;padding:.3em .5em;
text-align:left;white-space:nowrap}th{background:#f4f4f4}tr:nth-child(even){background:#fafafa}
img{max-width:min(100%,900px);height:auto;display:block;margin:1em 0}
code,pre{background:#f6f8fa;padding:.6em;display:block;white-space:pre-wrap;word-break:break-all}
"""


def _inline(text: str) -> str:
    """Markdown's **bold** inside a table cell or paragraph, as HTML (text escaped first)."""
    parts = html.escape(text).split("**")
    return "".join(f"<b>{p}</b>" if k % 2 else p for k, p in enumerate(parts))


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table from cells that are already HTML (escaped text)."""
    return ("<table><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def _markdown_to_html(text: str) -> str:
    """evaluate.py's tables (headings, paragraphs, pipe tables) as HTML."""
    out, table = [], []

    def flush():
        if table:
            cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in table]
            out.append(_html_table([_inline(c) for c in cells[0]], [[_inline(c) for c in r] for r in cells[2:]]))
            table.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("### "):
            out.append(f"<h3>{_inline(line[4:])}</h3>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(out)


def render_html(title: str, headline: str, sections: list[Section]) -> str:
    body = [f"<h1>{html.escape(title)}</h1>", f'<p class="headline">{html.escape(headline)}</p>']
    for s in sections:
        body.append(f"<h2>{html.escape(s.title)}</h2>")
        for block in s.blocks:
            kind = block[0]
            if kind == "p":
                body.append(f"<p>{html.escape(block[1])}</p>")
            elif kind == "code":
                body.append(f"<pre><code>{html.escape(block[1])}</code></pre>")
            elif kind == "markdown":
                body.append(_markdown_to_html(block[1]))
            elif kind == "img":
                data = base64.b64encode(block[1].read_bytes()).decode("ascii")
                body.append(f'<img alt="{html.escape(block[2])}" src="data:image/png;base64,{data}">')
            elif kind == "table":
                body.append(_html_table([html.escape(h) for h in block[1]],
                                        [[html.escape(str(c)) for c in row] for row in block[2]]))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
            "style-src 'unsafe-inline'\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
