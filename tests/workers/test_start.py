"""start: every worker of a run trains in the chief's precision.

Only the chief measures PRECISION=auto's bfloat16 probe; a worker whose own choice differs takes
the chief's at the join. The real collective between two worker processes runs in the slow tests
of test_worker.py; here a stand-in strategy of one worker's replicas (test_sync.py) carries it.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import keras
import pytest
from helpers import git
from test_sync import ReplicasOfOneWorker

from train.errors import ConfigError
from train.run.manifest import git_info
from train.setup import hardware
from train.workers import start, sync


def _setup(precision: str, reason: str, strategy=None):
    keras.mixed_precision.set_global_policy(precision)
    return SimpleNamespace(strategy=strategy, precision=precision, precision_reason=reason, compute_capabilities=[])


def test_a_worker_whose_own_choice_differs_takes_the_chiefs_and_says_so(monkeypatch):
    monkeypatch.setattr(sync, "text_from_chief", lambda strategy, text: "float32")
    setup = _setup("mixed_bfloat16", "CPU has native bfloat16 (avx512_bf16)")
    start.take_the_chiefs_precision(setup)
    assert setup.precision == "float32" and keras.mixed_precision.global_policy().name == "float32"
    assert setup.precision_reason == (
        "the chief's choice; this worker alone would run mixed_bfloat16 (CPU has native bfloat16 (avx512_bf16))"
    )


def test_a_worker_whose_onednn_cap_crashes_on_the_chiefs_bfloat16_is_refused(monkeypatch):
    monkeypatch.setattr(sync, "text_from_chief", lambda strategy, text: "mixed_bfloat16")
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    setup = _setup("float32", "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN below its bfloat16 kernels")
    with pytest.raises(ConfigError, match="ONEDNN_MAX_CPU_ISA=AVX2"):
        start.take_the_chiefs_precision(setup)
    assert keras.mixed_precision.global_policy().name == "float32"


def test_a_worker_with_a_gpu_takes_the_chiefs_bfloat16_whatever_its_cpus_onednn_cap(monkeypatch):
    """The GPU runs bfloat16: the CPU's cap is no reason to refuse it."""
    monkeypatch.setattr(sync, "text_from_chief", lambda strategy, text: "mixed_bfloat16")
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    setup = _setup("float32", "the GPU's own choice")
    setup.compute_capabilities = [(8, 0)]
    start.take_the_chiefs_precision(setup)
    assert setup.precision == "mixed_bfloat16"


def test_the_chief_keeps_its_own_choice_and_its_reason():
    reason = "CPU has native bfloat16 (avx512_bf16), but its bfloat16 convolution ran 0.55x float32's (a probe)"
    setup = _setup("float32", reason, ReplicasOfOneWorker([0]))  # replica 0: the chief's own text comes back
    start.take_the_chiefs_precision(setup)
    assert (setup.precision, setup.precision_reason) == ("float32", reason)
    assert keras.mixed_precision.global_policy().name == "float32"


def test_only_the_chief_probes_and_a_bucket_runs_dir_not_opened_yet_is_measured_without_the_cache(
    monkeypatch, tmp_path
):
    """`train.train` opens a bucket RUNS_DIR's staging copy after the join: its chief measures, uncached
    (`python -m train fit` opens it before, and the chief then caches in the staging copy)."""
    from train.training import flops

    asked = []
    monkeypatch.setattr(flops, "cached_bf16_speedup", lambda cache: asked.append(cache) or (0.5, "a probe"))
    assert start.chiefs_probe(SimpleNamespace(runs_dir=str(tmp_path)), is_chief=False) is None
    assert start.chiefs_probe(SimpleNamespace(runs_dir="s3://bucket/runs"), is_chief=True)() == (0.5, "a probe")
    assert start.chiefs_probe(SimpleNamespace(runs_dir=str(tmp_path)), is_chief=True)() == (0.5, "a probe")
    assert asked == [None, tmp_path / ".cache"]


def _checkout(path, text: str | None):
    path.mkdir()
    (path / "model.py").write_text("units = 1\n")
    git(path, "init", "-q")
    git(path, "add", "model.py")
    git(path, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "c")
    if text is None:
        (path / "model.py").unlink()
    else:
        (path / "model.py").write_text(text)
    return path


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (the image has none)")
def test_the_uncommitted_changes_are_one_hash_alike_for_the_same_edit_on_two_hosts(tmp_path):
    """What the join compares: the same commit with one edit on one host and not on the other trained
    together (a model changed on one machine)."""
    edits = {"one": "units = 2\n", "two": "units = 2\n", "other": "units = 3\n", "clean": "units = 1\n", "gone": None}
    hashes = {}
    for name, text in edits.items():
        path = _checkout(tmp_path / name, text)
        if name == "two":  # another host's git config writes `git diff` otherwise; the contents are the same
            git(path, "config", "diff.noprefix", "true")
            git(path, "config", "core.abbrev", "20")
        hashes[name] = start.changes(git_info(path), path)
    assert hashes["clean"] == "clean"
    assert hashes["one"] == hashes["two"] and len(hashes["one"]) == 12, hashes
    assert len({hashes["one"], hashes["other"], hashes["gone"], "clean", "?"}) == 5, hashes
    # An image's commit comes with no dirty flag: its build context may have held changes, unknown.
    assert start.changes({"commit": "abc123", "dirty": None}) == "?"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (the image has none)")
def test_an_edit_staged_then_undone_in_the_files_is_no_uncommitted_change(tmp_path):
    """git status calls such a checkout dirty, but its files are the commit's: a worker there was refused
    beside a clean one, for changes `git diff HEAD` does not show."""
    path = _checkout(tmp_path / "undone", "units = 2\n")
    git(path, "add", "model.py")
    (path / "model.py").write_text("units = 1\n")
    assert git_info(path)["dirty"] is True
    assert start.changes(git_info(path), path) == "clean"


def test_uncommitted_changes_are_unknown_where_git_cannot_list_them(tmp_path, monkeypatch):
    dirty = {"commit": "a" * 40, "dirty": True}
    assert start.changes(dirty, tmp_path) == "?"  # not a checkout: git diff fails
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
    assert start.changes(dirty, tmp_path) == "?"
