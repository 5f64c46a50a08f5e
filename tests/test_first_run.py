"""The first run: kernels compiled beforehand in units on every worker (warmup.py), the compiled-code folder in the
user's cache (engine/jit_cache.py), and the ICI's statsmodels loop while its kernel is not compiled."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import metrics
import warmup
from config import REPO_ROOT, RunConfig
from engine.jit_cache import Unit


PARTS = ["lane kernel part lane_kernels.fsrs6_lanes.group_forward", "lane kernel part lane_kernels.fsrs6_lanes.group_reverse"]


LOOPS = ["engine predictions of models.fsrs6_kernels", "engine trainer of models.fsrs6_kernels"]


def test_fsrs6_units_are_its_lane_kernel_after_its_parts_and_the_engine_loops():
    """The lane kernel after its two parts, and the engine's predictions and trainer apart, so that two workers
    compile them side by side; a row that only predicts has the predictions' unit alone."""
    units = warmup.units(RunConfig(algo="FSRS-6"))
    assert [u.label for u in units] == PARTS + ["lane kernel lane_kernels.fsrs6_lanes", *LOOPS]
    assert units[2].after == tuple(PARTS) and all(u.after == () for u in units[:2] + units[3:])
    assert [u.label for u in warmup.units(RunConfig(algo="FSRS-6", default=True))] == LOOPS[:1]
    assert [u.label for u in warmup.units(RunConfig(algo="AVG"))] == ["toy run of AVG"]


def test_a_model_whose_toy_run_compiles_long_starts_first(tmp_path, monkeypatch):
    """GRU-P's toy run (~22 s of compiling: Model.first_run_seconds) goes before AVG's and before FSRS-6's units,
    so that a first report does not end with one worker compiling it while the other waits."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))  # an empty cache: nothing marked done
    cfgs = [RunConfig(algo=a) for a in ("AVG", "FSRS-6", "GRU-P")]
    assert [u.label for u in warmup.pending(cfgs)] == [  # chains: 22, 2 + 2.5 (twice), 3, 2.5, 2.5, 1.5 s
        "toy run of GRU-P", *PARTS, "toy run of AVG", "lane kernel lane_kernels.fsrs6_lanes", LOOPS[1], LOOPS[0]]


@pytest.mark.parametrize("algo", ["FSRS-6", "FSRS-7"])
def test_after_the_warm_up_a_user_compiles_nothing(tmp_path, algo):
    """In an empty cache, warm_up builds the row's units on two workers (FSRS-6's: its hand lane kernel's parts, the
    kernel, the engine loops; FSRS-7's the same of its generated plug-in), and then evaluating a user starts no
    compilation (the units cover what the row needs), nothing is pending any more, and torch was never imported
    (FSRS-7's equations traced on engine/torch_standin.py)."""
    code = textwrap.dedent("""
        import sys
        import pipeline, warmup
        from numba.core import event
        from config import EMBEDDED_DATA, RunConfig
        cfg = RunConfig(algo=sys.argv[1], processes=2, quiet=True)
        if cfg.algo == "FSRS-6":
            assert sorted(u.label for u in warmup.pending([cfg])) == sorted(
                LOOPS + ["lane kernel lane_kernels.fsrs6_lanes", *PARTS])
        warmup.warm_up([cfg], processes=2, quiet=True)
        assert warmup.pending([cfg]) == []
        seen = []
        class L(event.Listener):
            def on_start(self, ev): seen.append(ev.data["dispatcher"].py_func.__qualname__)
            def on_end(self, ev): pass
        with event.install_listener("numba:compile", L()):
            outcome = pipeline.evaluate_user(warmup.TOY_USER, cfg, EMBEDDED_DATA)
        assert outcome.record is not None, outcome
        print(seen, "torch" in sys.modules)
    """)
    assert _fresh_cache_run(f"PARTS = {PARTS!r}\nLOOPS = {LOOPS!r}\n" + code, tmp_path, algo) == "[] False"


def test_fsrs7_units_are_its_generated_engines():
    """FSRS-7's generated plug-in has units like a package model's (its lane kernel after the two parts, the engine
    loops), not one toy run; a row trained on the autograd engine keeps the toy run."""
    labels = [u.label for u in warmup.units(RunConfig(algo="FSRS-7"))]
    assert [label.split(" traced")[0] for label in labels] == [
        "lane kernel part", "lane kernel part", "lane kernel", "engine predictions of", "engine trainer of"]
    assert labels[0].endswith(".group_forward") and labels[1].endswith(".group_reverse")
    default = [u.label for u in warmup.units(RunConfig(algo="FSRS-7", default=True))]
    assert len(default) == 1 and default[0].startswith("engine predictions of")
    assert [u.label for u in warmup.units(RunConfig(algo="FSRS-7", trainer="autograd"))] == [
        "toy run of FSRS-7-autograd-trainer"]


def _fresh_cache_run(code, tmp_path, *args):
    """`code`'s output, run in a new process with the compiled-code cache in tmp_path."""
    env = dict(os.environ, SRS_BENCH_CACHE=str(tmp_path))
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("algo", ["FSRS-6", "FSRSv4"])
def test_the_lane_kernel_loads_its_parts_compiled_apart(tmp_path, algo):
    """The parts' units compile the variants a lane kernel calls (FSRS-6's hand-written one, FSRS v4's generated by
    engine/traced_lanes.py), for the very types it passes: compiling the kernel afterwards in another process (as
    another worker of a first run does) compiles neither part again."""
    code = textwrap.dedent("""
        import sys
        from numba.core import event
        import warmup
        from config import RunConfig
        units = {u.label: u for u in warmup.units(RunConfig(algo=sys.argv[2]))}
        kernel = next(u for u in units.values() if u.label.startswith("lane kernel ") and u.after)
        assert [label.rpartition(".")[2] for label in kernel.after] == ["group_forward", "group_reverse"]
        if sys.argv[1] == "parts":
            for label in kernel.after:
                units[label].build()
        else:
            seen = []
            class L(event.Listener):
                def on_start(self, ev): seen.append(ev.data["dispatcher"].py_func.__qualname__)
                def on_end(self, ev): pass
            with event.install_listener("numba:compile", L()):
                kernel.build()
            print(sorted(set(seen)))
    """)
    _fresh_cache_run(code, tmp_path, "parts", algo)
    seen = eval(_fresh_cache_run(code, tmp_path, "kernel", algo))
    assert "lanes_loss_grad" in seen
    assert not any(name.startswith(("group_forward", "group_reverse")) for name in seen), seen


def _note(path):
    return Unit(f"note {path.name}", 1.0, lambda: path.write_text(str(os.getpid())))


def test_units_run_on_several_workers_once_and_leave_markers(tmp_path, monkeypatch):
    """warm_up runs each pending unit once, on a pool of workers when there are several, and marks it done; a unit
    that fails is reported in one line and not marked."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))  # where the markers go (engine/jit_cache.folder)
    done = [tmp_path / f"u{i}" for i in range(3)]

    def fails():
        raise ValueError("no luck")

    units = [_note(p) for p in done] + [Unit("bad", 2.0, fails)]
    monkeypatch.setattr(warmup, "units", lambda cfg: units)
    warmup.warm_up([RunConfig()], processes=2, quiet=True)
    pids = {p.read_text() for p in done}
    assert str(os.getpid()) not in pids and len(pids) >= 1  # built in the workers
    assert [u.label for u in warmup.pending([RunConfig()])] == ["bad"]
    for p in done:
        p.unlink()
    warmup.warm_up([RunConfig()], processes=2, quiet=True)
    assert not any(p.exists() for p in done)  # marked: not built again


def _stamp(path, seconds=0.0, after=()):
    """A unit that sleeps `seconds` and writes when it started and ended."""
    def build():
        start = time.time()
        time.sleep(seconds)
        path.write_text(f"{start} {time.time()}")
    return Unit(path.name, seconds, build, after=tuple(after))


@pytest.mark.parametrize("processes", [1, 2])
def test_a_unit_starts_after_the_units_it_loads_and_the_longest_chain_first(tmp_path, monkeypatch, processes):
    """The kernel waits for both of its parts; the parts (each with the kernel after it) start before the loops,
    which take longer than either part but have nothing after them."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    p1, p2, kernel, loops = (tmp_path / n for n in ("p1", "p2", "kernel", "loops"))
    units = [_stamp(loops, 1.0), _stamp(kernel, 0.5, after=["p1", "p2"]), _stamp(p1, 0.6), _stamp(p2, 0.55)]
    assert [u.label for u in warmup.pending([], units)] == ["p1", "p2", "loops", "kernel"]  # chains 1.1, 1.05, 1.0
    warmup.warm_up([], processes=processes, quiet=True, name="test", extra=units)
    times = {p.name: tuple(map(float, p.read_text().split())) for p in (p1, p2, kernel, loops)}
    assert times["kernel"][0] >= max(times["p1"][1], times["p2"][1])
    assert times["loops"][0] >= min(times["p1"][1], times["p2"][1])


def test_a_first_run_says_it_is_compiling(tmp_path):
    """A cold cache: the progress line names the model and says it compiles once; the next run has no such line."""
    env = dict(os.environ, SRS_BENCH_CACHE=str(tmp_path / "cache"))
    env.pop("NUMBA_CACHE_DIR", None)
    cmd = [sys.executable, "other.py", "--model", "AVG", "--users", "3", "--processes", "1", "--result-dir"]
    first = subprocess.run(cmd + [str(tmp_path / "r1")], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert first.returncode == 0 and "AVG: compiling, first run only" in first.stderr
    second = subprocess.run(cmd + [str(tmp_path / "r2")], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert second.returncode == 0 and "compiling" not in second.stderr


def _cache_folder(env_extra, tmp_path):
    code = "import models, os; print(os.environ['NUMBA_CACHE_DIR'])"
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "SRS_BENCH_CACHE", "XDG_CACHE_HOME")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_compiled_code_folder_is_in_the_users_cache_and_named_after_the_sources(tmp_path):
    from engine.jit_cache import version_digest

    name = f"numba-{version_digest()}"
    assert _cache_folder({"HOME": str(tmp_path)}, tmp_path) == str(tmp_path / ".cache" / "srs-bench" / name)
    assert _cache_folder({"XDG_CACHE_HOME": str(tmp_path / "x")}, tmp_path) == str(tmp_path / "x" / "srs-bench" /
                                                                                     name)
    assert _cache_folder({"SRS_BENCH_CACHE": str(tmp_path / "s")}, tmp_path) == str(tmp_path / "s" / name)
    assert _cache_folder({"NUMBA_CACHE_DIR": str(tmp_path / "n")}, tmp_path) == str(tmp_path / "n")


def test_the_folder_follows_every_compiled_source_and_old_ones_are_pruned(tmp_path):
    """A copy of the package with one kernel file edited gets another folder; folders of other versions unused
    for 30 days are removed, recent ones kept."""
    import shutil

    copy = tmp_path / "clone"
    from engine.jit_cache import PACKAGES

    for folder in PACKAGES:
        shutil.copytree(REPO_ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "lowess.py", copy / "lowess.py")
    code = textwrap.dedent("""
        import sys; sys.path.insert(0, sys.argv[1])
        from engine.jit_cache import version_digest; print(version_digest())
    """)
    digest = lambda: subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True,  # noqa
                                    check=True).stdout.strip()
    before = digest()
    seen = {before}
    for edited in ("lowess.py", "models/fsrs6_kernels.py", "engine/seq_engine.py", "neural/gru_kernels.py",
                   "lane_kernels/fsrs6_lanes.py", "upstream/torch_rng.py"):
        (copy / edited).write_text((copy / edited).read_text() + "\n# edited\n")
        seen.add(digest())
    assert len(seen) == 7  # every edit, in any of the compiled packages, moved to a new folder
    base = tmp_path / "cache"
    old, recent = base / "numba-000000000000", base / "numba-111111111111"
    old.mkdir(parents=True)
    recent.mkdir()
    os.utime(old, (0, 0))
    _cache_folder({"SRS_BENCH_CACHE": str(base)}, tmp_path)
    assert not old.exists() and recent.exists()


def test_the_ici_takes_statsmodels_loop_while_its_kernel_is_not_compiled(monkeypatch):
    """Below LOWESS_KERNEL_MIN_COLD predictions a run never compiles the kernel for the ICI (the same values from
    statsmodels' loop, tests/test_split_metrics.py); once it is at hand it is used from LOWESS_KERNEL_MIN on."""
    import lowess

    monkeypatch.setattr(lowess, "kernel_ready", lambda: False)
    assert not metrics._use_kernel(40_000) and metrics._use_kernel(metrics.LOWESS_KERNEL_MIN_COLD)
    monkeypatch.setattr(lowess, "kernel_ready", lambda: True)
    assert metrics._use_kernel(metrics.LOWESS_KERNEL_MIN) and not metrics._use_kernel(metrics.LOWESS_KERNEL_MIN - 1)
    x = np.sort(np.random.default_rng(0).random(3000))
    y = (np.random.default_rng(1).random(3000) < x).astype(float)
    monkeypatch.setattr(lowess, "kernel_ready", lambda: False)
    cold = metrics.ici(y, x)
    monkeypatch.setattr(lowess, "kernel_ready", lambda: True)
    assert metrics.ici(y, x) == cold


@pytest.mark.parametrize("script", ["other.py", "script.py", "report.py", "run_table.py"])
def test_processes_defaults_to_all_cores_as_the_readme_says(script):
    out = subprocess.run([sys.executable, script, "--help"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert f"default: all cores ({os.cpu_count()} on this machine)" in " ".join(out.split())
    assert "| `--processes N` | worker processes (default: all cores)" in (REPO_ROOT / "README.md").read_text()


def test_the_ici_unit_compiles_what_the_ici_calls(tmp_path):
    """After warmup.ici_unit in an empty cache, metrics.ici on 3,000 predictions takes the kernel and compiles
    nothing (the unit's signature is the call's)."""
    code = textwrap.dedent("""
        import numpy as np
        from numba.core import event
        import warmup, metrics, lowess
        assert not lowess.kernel_ready()
        warmup.ici_unit().build()
        seen = []
        class L(event.Listener):
            def on_start(self, ev): seen.append(ev.data["dispatcher"].py_func.__qualname__)
            def on_end(self, ev): pass
        x = np.random.default_rng(0).random(3000); y = (np.random.default_rng(1).random(3000) < x) * 1.0
        with event.install_listener("numba:compile", L()):
            assert metrics._use_kernel(len(x))
            metrics.ici(y, x)
        print(seen)
    """)
    assert _fresh_cache_run(code, tmp_path) == "[]"
