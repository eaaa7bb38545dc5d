"""Finding runs: RUNS_DIR listed, an entry or RUNS_DIR that cannot be read, `latest` and its line, a run not found."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from train.errors import RunNotFound, RunRecordError, StorageError
from train.run import find


def _runs(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text("{}\n")
    return root


@pytest.fixture
def warnings(monkeypatch, caplog):
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="train")
    return caplog


@pytest.mark.parametrize(
    "error, reason", [(PermissionError(13, "Permission denied"), "Permission denied"), (OSError(), "OSError")]
)
def test_an_entry_that_cannot_be_read_is_one_exact_warning_and_left_out(tmp_path, monkeypatch, warnings, error, reason):
    root = _runs(tmp_path / "runs", "20260101-000000-000001", "20260101-000000-000002")
    locked = root / "lost+found"
    locked.mkdir()
    is_run_dir = find.is_run_dir

    def looks(path):
        if Path(path) == locked:
            raise error
        return is_run_dir(path)

    monkeypatch.setattr(find, "is_run_dir", looks)
    assert [p.name for p in find.list_run_dirs(root)] == ["20260101-000000-000001", "20260101-000000-000002"]
    assert [r.getMessage() for r in warnings.records] == [
        f"WARNING: {locked} in RUNS_DIR cannot be read ({reason}): left out; make it readable "
        "(chmod, or chown to this user) or move it out of RUNS_DIR"
    ]


def test_runs_dir_that_cannot_be_listed_is_one_exact_storage_error(tmp_path, monkeypatch):
    root = _runs(tmp_path / "runs", "20260101-000000-000001")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(StorageError) as info:
        find.scan_run_dirs(root)
    assert str(info.value) == (
        f"cannot list RUNS_DIR {root}: Permission denied; make it readable by this user (chmod u+rx) "
        "or point RUNS_DIR at another folder"
    )


@pytest.mark.parametrize(
    "newer, without",
    [
        (3, "r4, r3, r2"),
        (4, "r5, r4, r3 and 1 more"),
        (5, "r6, r5, r4 and 2 more"),
    ],
)
def test_latest_names_at_most_three_newer_runs_without_what_it_needs(newer, without):
    names = [f"r{i}" for i in range(1, newer + 2)]
    found, line = find.pick_latest(names, lambda name, rel: name == "r1", [find.WEIGHTS])
    assert (found, line) == ("r1", f"latest: run r1, the newest run with weights (newer, without: {without})")


def test_latest_when_no_run_has_what_it_needs_is_the_newest_run():
    found, line = find.pick_latest(["r1", "r2", "r3"], lambda name, rel: False, [find.WEIGHTS, find.EXPORT])
    assert (found, line) == ("r3", "latest: run r3 (no run has weights or an export)")


def test_a_run_that_cannot_be_looked_into_is_one_exact_error(tmp_path, monkeypatch):
    root = _runs(tmp_path / "runs", "20260101-000000-000001")

    def denied(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(find, "is_run_dir", denied)
    with pytest.raises(RunRecordError) as info:
        find.resolve_run(root, "20260101-000000-000001")
    assert str(info.value) == (
        f"run '20260101-000000-000001': {root / '20260101-000000-000001'} cannot be read (Permission denied); "
        "make it readable (chmod, or chown to this user) or run as its owner"
    )


@pytest.mark.parametrize(
    "run, hint",
    [
        ("20260101", "; did you mean '20260101-000000-000001'?"),
        ("nothing-like-it", ""),
    ],
)
def test_a_run_not_found_is_one_exact_line_with_the_run_its_name_starts(tmp_path, run, hint):
    root = _runs(tmp_path / "runs", "20260101-000000-000001")
    with pytest.raises(RunNotFound) as info:
        find.resolve_run(root, run)
    assert str(info.value) == (
        f"run {run!r} not found in {root} (no config.json){hint}; `python -m train runs --runs-dir {root}` lists the runs"
    )


@pytest.mark.parametrize(
    "names, run, hint",
    [
        # A name with a space, unquoted, arrives cut at the space: the names it may be cut from, at most three.
        (
            ["base a", "base b", "base c", "base d"],
            "base",
            "; did you mean 'base a' 'base b' 'base c'? (quote a name that has a space)",
        ),
        (["base a", "basex y"], "base", "; did you mean 'base a'? (quote a name that has a space)"),
        (["run-1", "run-2", "run-3", "run-4"], "run", "; did you mean 'run-1', 'run-2', 'run-3'?"),
        (["20260101-000000-000001", "x"], "20260101-000000-00001", "; did you mean '20260101-000000-000001'?"),
    ],
    ids=["cut-at-a-space", "space-right-after-it-only", "prefix", "closest"],
)
def test_did_you_mean_names_the_runs_a_name_may_have_meant(tmp_path, names, run, hint):
    root = _runs(tmp_path / "runs", *names)
    with pytest.raises(RunNotFound) as info:
        find.resolve_run(root, run)
    assert (
        str(info.value)
        == f"run {run!r} not found in {root} (no config.json){hint}; `python -m train runs --runs-dir {root}` lists the runs"
    )


def test_a_run_not_found_in_a_runs_dir_that_cannot_be_listed_suggests_nothing(tmp_path, monkeypatch):
    root = _runs(tmp_path / "runs", "nope-1")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(RunNotFound) as info:
        find.resolve_run(root, "nope")
    assert str(info.value) == (
        f"run 'nope' not found in {root} (no config.json); `python -m train runs --runs-dir {root}` lists the runs"
    )


@pytest.mark.parametrize("given", ["s3://bkt/runs", "staging"])
def test_a_run_not_found_in_a_store_names_the_store_not_its_staging_copy(tmp_path, monkeypatch, given):
    from types import SimpleNamespace

    from train.run import remote

    staging = _runs(tmp_path / "cache" / "s3" / "bkt" / "runs", "other-1")
    monkeypatch.setitem(remote._OPEN, "s3://bkt/runs", SimpleNamespace(root=staging, url="s3://bkt/runs"))
    with pytest.raises(RunNotFound) as info:
        find.resolve_run(staging if given == "staging" else given, "nope")
    assert str(info.value).startswith("run 'nope' not found in s3://bkt/runs (no config.json)")
    assert str(staging) not in str(info.value) and "`python -m train runs --runs-dir s3://bkt/runs`" in str(info.value)
