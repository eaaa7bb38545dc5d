"""rundir: the layout (RunDir), atomic writes, storage error messages, run ids, finding runs, cleaning temp files."""

from __future__ import annotations

import datetime as dt
import errno
import re
import types

import pytest

from train.errors import ReproduceRecordError, RunRecordError, StorageError
from train.run.files import (
    TMP_MARK,
    atomic_write,
    clean_stale_temp,
    ensure_writable,
    read_json,
    storage_error,
    write_json,
    write_text,
)
from train.run.find import RunNotFound, create_run_dir, list_run_dirs, new_run_id, resolve_run
from train.run.rundir import read_record


def test_atomic_write_replaces_the_file(tmp_path):
    from pathlib import Path

    target = tmp_path / "a.json"
    write_json(target, {"b": 1, "a": [1], "p": Path("/x")})  # sorted, indented, paths as text: diffable by hand
    assert target.read_text() == '{\n  "a": [\n    1\n  ],\n  "b": 1,\n  "p": "/x"\n}\n'
    assert read_json(target) == {"a": [1], "b": 1, "p": "/x"}
    write_text(target, "new\n")
    assert target.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_temp_name_keeps_the_suffix_and_the_mark(tmp_path):
    seen = []
    atomic_write(tmp_path / "best.weights.h5", lambda p: (seen.append(p), p.write_bytes(b"x")))
    assert seen[0].name.startswith("best" + TMP_MARK) and seen[0].name.endswith(".weights.h5")
    assert seen[0].parent == tmp_path  # beside the target: os.replace is atomic only within one file system


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), RuntimeError("writer bug")])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, failure):
    target = tmp_path / "config.json"
    target.write_text("old")

    def write(p):
        p.write_text("half")
        raise failure

    with pytest.raises(StorageError if isinstance(failure, OSError) else RuntimeError) as info:
        atomic_write(target, write)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    if isinstance(failure, OSError):
        assert str(target) in str(info.value) and "disk is full" in str(info.value)


def test_size_hint_larger_than_free_space_is_refused_before_writing(tmp_path):
    calls = []
    with pytest.raises(StorageError) as info:
        atomic_write(tmp_path / "w.weights.h5", calls.append, size_hint=1 << 62)
    assert str(info.value) == (
        f"cannot write {tmp_path / 'w.weights.h5'}: the disk is full: free space or point RUNS_DIR at a larger volume"
    )
    assert calls == [] and list(tmp_path.iterdir()) == []


def test_size_hint_equal_to_free_space_is_enough(tmp_path, monkeypatch):
    from train.run import files as rundir

    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=1000))
    atomic_write(tmp_path / "w.bin", lambda p: p.write_bytes(b"x"), size_hint=1000)
    assert (tmp_path / "w.bin").read_bytes() == b"x"


def test_without_a_size_hint_free_space_is_not_checked(tmp_path, monkeypatch):
    """Small files (config, pointer, manifest) are written even on a nearly full disk; ENOSPC still reports it."""
    from train.run import files as rundir

    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: (_ for _ in ()).throw(AssertionError("asked")))
    write_text(tmp_path / "LATEST", "ckpt-000000004.npz\n")
    assert (tmp_path / "LATEST").read_text() == "ckpt-000000004.npz\n"


@pytest.mark.parametrize(
    "failure, expected",
    [(OSError(errno.ENOSPC, "No space left"), StorageError), (RuntimeError("writer bug"), RuntimeError)],
)
def test_a_writer_that_removed_its_temp_file_still_reports_its_own_error(tmp_path, failure, expected):
    def write(p):
        p.unlink()
        raise failure

    with pytest.raises(expected):
        atomic_write(tmp_path / "config.json", write)
    assert list(tmp_path.iterdir()) == []


PERMISSION = "permission denied: run as the owner of RUNS_DIR or point RUNS_DIR at a folder you can write"


@pytest.mark.parametrize(
    "code, reason",
    [
        (errno.ENOSPC, "the disk is full: free space or point RUNS_DIR at a larger volume"),
        (errno.EDQUOT, "the disk quota is exceeded: free space or point RUNS_DIR elsewhere"),
        (errno.EFBIG, "the file size limit was hit: raise `ulimit -f` or point RUNS_DIR elsewhere"),
        (errno.EROFS, "the file system is read-only: mount the runs volume read-write or set RUNS_DIR"),
        (errno.EACCES, PERMISSION),
        (errno.EPERM, PERMISSION),
        (errno.EISDIR, "a folder stands where this file is written: move the folder out of the way"),
    ],
)
def test_storage_error_explains_each_errno(code, reason):
    exc = storage_error("/runs/x", OSError(code, "raw"), in_docker=False)
    assert isinstance(exc, StorageError) and exc.exit_code == 7
    assert str(exc) == f"cannot write /runs/x: {reason}"


def test_storage_error_in_a_stores_staging_copy_names_store_cache(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from train.run import remote

    staging = tmp_path / "cache" / "s3" / "bkt" / "runs"
    monkeypatch.setitem(remote._OPEN, "s3://bkt/runs", SimpleNamespace(root=staging))
    full = str(storage_error(staging / "run-1" / "manifest.json", OSError(errno.ENOSPC, "raw"), in_docker=False))
    assert full.endswith("point STORE_CACHE at a larger volume") and "RUNS_DIR" not in full, full
    denied = str(storage_error(staging, OSError(errno.EACCES, "raw"), in_docker=True))
    assert "owner of STORE_CACHE" in denied and "HOST_UID" not in denied, denied
    # Outside it, RUNS_DIR chose the folder.
    assert "point RUNS_DIR" in str(storage_error(tmp_path / "runs", OSError(errno.ENOSPC, "raw"), in_docker=False))


def test_storage_error_falls_back_to_strerror_then_to_the_exception():
    assert str(storage_error("p", OSError(errno.EIO, "Input/output error"))) == "cannot write p: Input/output error"
    assert str(storage_error("p", OSError("no errno here"))) == "cannot write p: no errno here"


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_permission_denied_in_a_container_points_at_the_host_folder_and_host_ids(code):
    # In the container RUNS_DIR is always the /runs volume: the fix is who owns its host folder.
    text = str(storage_error("/runs", OSError(code, "raw"), in_docker=True))
    assert "HOST_UID" in text and "HOST_GID" in text and "RUNS_HOST_DIR" in text and "mkdir -p runs" in text
    assert "point RUNS_DIR" not in text


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_write_respects_the_umask(tmp_path, umask, mode):
    # A teammate or a TensorBoard container running as another user must be able to read run files.
    import os

    old = os.umask(umask)
    try:
        write_text(tmp_path / "config.json", "{}\n")
        atomic_write(tmp_path / "best.weights.h5", lambda p: p.write_bytes(b"x"))
    finally:
        os.umask(old)
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {
        "config.json": mode,
        "best.weights.h5": mode,
    }


def test_temp_dirs_respect_the_umask_and_carry_the_mark(tmp_path):
    import os

    from train.run.files import make_temp_dir

    old = os.umask(0o022)
    try:
        d = make_temp_dir(tmp_path, "export")
    finally:
        os.umask(old)
    assert d.name.startswith("export" + TMP_MARK) and d.stat().st_mode & 0o777 == 0o755


def test_storage_error_falls_back_to_strerror():
    assert str(storage_error("p", OSError(errno.EIO, "Input/output error"))) == "cannot write p: Input/output error"


def test_new_run_id_format_and_sort_order():
    early = new_run_id(now=dt.datetime(2026, 1, 2, 3, 4, 5, 999999))
    late = new_run_id("exp_1", now=dt.datetime(2026, 11, 30, 6, 19, 59, 7))
    assert early == "20260102-030405-999999"
    assert late == "20261130-061959-000007-exp_1"
    assert sorted([late, early]) == [early, late]


def test_latest_is_the_run_created_last_even_within_one_second(tmp_path):
    root = tmp_path / "runs"
    for _ in range(40):  # back-to-back pairs: most fall within one second
        pair = []
        for _ in range(2):
            run = create_run_dir(root)
            (run / "config.json").write_text("{}")
            pair.append(run)
        assert resolve_run(root, "latest") == pair[1]
        assert list_run_dirs(root)[-2:] == pair


def test_runs_are_ordered_by_creation_old_ids_included(tmp_path):
    root = tmp_path / "runs"
    names = [
        "renamed-by-hand",
        "20260101-000000-ffff",
        "20260101-000000-000001-zz",
        "20260101-000000-500000",
        "20260101-000001-0aaa-named",
    ]
    for name in reversed(names):
        _run(root, name)
    assert [p.name for p in list_run_dirs(root)] == names


def _run(root, name):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return d


def test_resolve_run_by_id_path_and_latest(tmp_path):
    root = tmp_path / "runs"
    old = _run(root, "20260101-000000-aaaa")
    new = _run(root, "20260102-000000-bbbb")
    (root / "20260103-000000-cccc").mkdir()  # no config.json: not a run
    assert resolve_run(root, old.name) == old
    assert resolve_run(tmp_path / "elsewhere", str(new)) == new
    assert resolve_run(root, "latest") == new
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunNotFound) as info:  # any command's RUN, not only fit's --resume
        resolve_run(tmp_path / "empty", "latest")
    assert str(info.value) == f"run 'latest': no runs in {tmp_path / 'empty'}; train first or set RUNS_DIR"
    with pytest.raises(RunNotFound, match=f"RUNS_DIR {new} is a run itself: .* the folder that holds it, {root}$"):
        resolve_run(new, "latest")  # was "no runs in ...; train first"


def test_a_file_named_as_the_run_says_so(tmp_path):
    """`predict a.png b.png` (the run left out) and `--resume RUN/config.json` said `run ... not found in ./runs`."""
    root = tmp_path / "runs"
    run = _run(root, "20260101-000000-aaaa")
    image = tmp_path / "a photo.png"  # the command to paste quotes it
    image.write_bytes(b"png")
    with pytest.raises(RunNotFound) as info:
        resolve_run(root, str(image))
    assert str(info.value) == (
        f"run '{image}' is a file, not a run: name the run by its id, its folder or latest (predict takes it before "
        f"the images: `python -m train predict latest --runs-dir {root} '{image}'`)"
    )
    with pytest.raises(RunNotFound) as info:
        resolve_run(root, str(run / "config.json"))
    assert str(info.value) == f"run '{run / 'config.json'}' is a file, not a run: name its folder, {run}"
    (root / "20260102-000000-bbbb").write_text(
        "a file where a run folder was"
    )  # said `not found`, though `ls` shows it
    with pytest.raises(RunNotFound) as info:
        resolve_run(root, "20260102-000000-bbbb")
    assert str(info.value) == (
        f"run '20260102-000000-bbbb' is a file, not a run: a run is a folder of {root} with a config.json; "
        f"`python -m train runs --runs-dir {root}` lists them"
    )


def test_latest_for_a_command_that_needs_weights_or_an_export_is_the_newest_run_that_has_them(tmp_path):
    from train.run.find import EXPORT, WEIGHTS, WEIGHTS_OR_EXPORT

    root = tmp_path / "runs"
    exported = _run(root, "20260101-000000-aaaa")
    (exported / "export" / "savedmodel").mkdir(parents=True)
    (exported / "export" / "savedmodel" / "saved_model.pb").write_bytes(b"pb")
    trained = _run(root, "20260102-000000-bbbb")
    (trained / "final.weights.h5").write_bytes(b"w")
    failed = _run(root, "20260103-000000-cccc")  # failed before an epoch ended: nothing to export or serve
    lines = []
    assert resolve_run(root, "latest", needs=(WEIGHTS,), say=lines.append) == trained
    assert resolve_run(root, "latest", needs=(WEIGHTS_OR_EXPORT,), say=lines.append) == trained
    assert resolve_run(root, "latest", needs=(EXPORT, WEIGHTS), say=lines.append) == exported
    assert lines == [
        f"latest: run {trained.name}, the newest run with weights (newer, without: {failed.name})",
        f"latest: run {trained.name}, the newest run with weights or an export (newer, without: {failed.name})",
        f"latest: run {exported.name}, the newest run with an export (newer, without: {failed.name}, {trained.name})",
    ]
    assert resolve_run(root, "latest", say=lines.append) == failed and len(lines) == 3  # resume: the newest
    (failed / "best.weights.h5").write_bytes(b"w")
    assert resolve_run(root, "latest", needs=(WEIGHTS,), say=lines.append) == failed
    assert lines[-1] == f"latest: run {failed.name}"


def test_latest_when_no_run_has_what_the_command_needs_is_the_newest_and_the_line_says_so(tmp_path):
    from train.run.find import EXPORT, WEIGHTS

    root = tmp_path / "runs"
    _run(root, "20260101-000000-aaaa")
    newest = _run(root, "20260102-000000-bbbb")
    lines = []
    assert resolve_run(root, "latest", needs=(EXPORT, WEIGHTS), say=lines.append) == newest
    assert lines == [f"latest: run {newest.name} (no run has an export or weights)"]


@pytest.mark.parametrize("run", ["latest", "nope"])
def test_resolve_run_missing_is_a_usage_error(tmp_path, run):
    with pytest.raises(RunNotFound) as info:
        resolve_run(tmp_path / "runs", run)
    assert info.value.exit_code == 2
    assert "runs" in str(info.value)


def test_clean_stale_temp_removes_only_marked_files(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    stale = [tmp_path / f"config{TMP_MARK}ab12.json", tmp_path / "checkpoints" / f"ckpt{TMP_MARK}x.weights.h5"]
    for p in stale:
        p.write_text("partial")
    keep = tmp_path / "config.json"
    keep.write_text("{}")
    assert sorted(clean_stale_temp(tmp_path)) == sorted(stale)
    assert keep.exists() and not any(p.exists() for p in stale)
    assert clean_stale_temp(tmp_path / "missing") == []


def test_read_record_names_the_run_the_file_and_the_fix(tmp_path):
    run = _run(tmp_path, "20260101-000000-000001")
    assert read_record(run, "config.json") == {}
    for content, words in (
        (b'{"a": ', "unreadable (JSONDecodeError"),
        (b"\xff\xfe", "unreadable (UnicodeDecodeError"),
        (b"null", "holds NoneType, not a JSON object"),
        (b"[" * 100_000, "unreadable (ValueError: nested too deeply"),  # was a RecursionError traceback
    ):
        (run / "manifest.json").write_bytes(content)
        with pytest.raises(RunRecordError) as info:
            read_record(run, "manifest.json")
        assert words in str(info.value) and run.name in str(info.value) and "backup" in str(info.value)
        assert info.value.exit_code == 4
    (run / "manifest.json").unlink()
    with pytest.raises(RunRecordError, match="has no manifest.json"):
        read_record(run, "manifest.json")


def test_create_run_dir_lays_out_subdirectories(tmp_path):
    run = create_run_dir(tmp_path / "runs", "demo")
    assert run.name.endswith("-demo")
    assert (run / "checkpoints").is_dir() and (run / "tensorboard").is_dir()
    assert not any(TMP_MARK in p.name for p in run.parent.iterdir())


def test_ensure_writable_under_a_file_is_a_storage_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError) as info:
        ensure_writable(tmp_path / "file" / "runs")
    assert str(info.value) == f"cannot write {tmp_path / 'file' / 'runs'}: Not a directory"


def test_atomic_write_fsyncs_the_data_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    """The order that survives a power loss: data on disk, then the name, then the name on disk."""
    import os
    import stat

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        info = os.fstat(fd)
        events.append(("fsync dir",) if stat.S_ISDIR(info.st_mode) else ("fsync file", info.st_size))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic_write(tmp_path / "state.npz", lambda p: (events.append(("write",)), p.write_bytes(b"12345")))
    assert events == [("write",), ("fsync file", 5), ("replace", "state.npz"), ("fsync dir",)]


def test_create_run_dir_without_a_name_is_a_bare_id(tmp_path):
    run = create_run_dir(tmp_path / "runs")
    assert re.fullmatch(r"\d{8}-\d{6}-\d{6}", run.name)


def test_create_run_dir_tries_a_hundred_ids_then_gives_up(tmp_path, monkeypatch):
    from train.run import find as rundir

    (tmp_path / "runs" / "taken").mkdir(parents=True)
    tried = []
    monkeypatch.setattr(rundir, "new_run_id", lambda name="": tried.append(name) or "taken")
    with pytest.raises(StorageError) as info:
        create_run_dir(tmp_path / "runs", "x")
    assert str(info.value) == f"could not create a unique run directory under {tmp_path / 'runs'}"
    assert tried == ["x"] * 100


def test_create_run_dir_that_cannot_be_made_names_it(tmp_path, monkeypatch):
    from train.run import find as rundir

    monkeypatch.setattr(rundir, "new_run_id", lambda name="": "missing-parent/run")
    with pytest.raises(StorageError) as info:
        create_run_dir(tmp_path / "runs")
    assert str(info.value) == f"cannot write {tmp_path / 'runs' / 'missing-parent' / 'run'}: No such file or directory"
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_a_runs_dir_where_no_folder_can_be_made_names_the_setting(tmp_path):
    with pytest.raises(StorageError) as info:
        ensure_writable("/proc/no-runs-here")
    assert str(info.value) == (
        "cannot write /proc/no-runs-here: No such file or directory: point RUNS_DIR at a folder that can be made"
    )
    with pytest.raises(StorageError) as info:  # permission denied there, even to root: no owner to change
        ensure_writable("/sys/no-runs-here")
    assert str(info.value).startswith("cannot write /sys/no-runs-here: ")
    assert str(info.value).endswith(": point RUNS_DIR at a folder that can be made")


def test_ensure_writable_creates_missing_parents_and_leaves_no_probe(tmp_path):
    target = ensure_writable(tmp_path / "a" / "b" / "runs")
    assert target.is_dir() and list(target.iterdir()) == []


def test_permission_denied_in_a_container_exactly(monkeypatch):
    from train.run import files as rundir

    monkeypatch.setattr(rundir, "in_container", lambda root=None: True)  # the default asks the machine
    assert str(storage_error("/runs", OSError(errno.EACCES, "raw"))) == (
        "cannot write /runs: permission denied: the container runs as HOST_UID:HOST_GID, which must own the host "
        "folder mounted at /runs (RUNS_HOST_DIR, default ./runs): create it as yourself (`mkdir -p runs`) and put "
        "HOST_UID=<`id -u`> and HOST_GID=<`id -g`> in .env (`invoke train` passes them)"
    )


def test_make_temp_dir_names_and_gives_up_after_a_hundred_taken_names(tmp_path, monkeypatch):
    from train.run import files as rundir
    from train.run.files import make_temp_dir

    assert re.fullmatch(rf"export{re.escape(TMP_MARK)}[0-9a-f]{{8}}", make_temp_dir(tmp_path, "export").name)
    drawn = []
    monkeypatch.setattr(rundir.secrets, "token_hex", lambda n: drawn.append(n) or "taken")
    (tmp_path / f"export{TMP_MARK}taken").mkdir()
    with pytest.raises(StorageError) as info:
        make_temp_dir(tmp_path, "export")
    assert str(info.value) == f"cannot write {tmp_path}: no free temporary name" and drawn == [4] * 100


def test_temp_files_are_named_and_give_up_after_a_hundred_taken_names(tmp_path, monkeypatch):
    from train.run import files as rundir

    seen = []
    atomic_write(tmp_path / "config.json", lambda p: (seen.append(p.name), p.write_text("{}")))
    assert re.fullmatch(rf"config{re.escape(TMP_MARK)}[0-9a-f]{{8}}\.json", seen[0])
    drawn = []
    monkeypatch.setattr(rundir.secrets, "token_hex", lambda n: drawn.append(n) or "taken")
    (tmp_path / f"config{TMP_MARK}taken.json").write_text("")
    with pytest.raises(StorageError) as info:
        atomic_write(tmp_path / "config.json", lambda p: p.write_text("{}"))
    assert str(info.value) == f"cannot write {tmp_path / 'config.json'}: no free temporary name in {tmp_path}"
    assert drawn == [4] * 100


def test_a_temp_file_that_cannot_be_created_names_the_target(tmp_path):
    with pytest.raises(StorageError) as info:
        atomic_write(tmp_path / "missing" / "config.json", lambda p: p.write_text("{}"))
    assert str(info.value) == f"cannot write {tmp_path / 'missing' / 'config.json'}: No such file or directory"
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_read_record_messages_exactly(tmp_path):
    run = _run(tmp_path, "20260101-000000-000001")
    path = run / "manifest.json"
    with pytest.raises(RunRecordError) as info:
        read_record(run, "manifest.json")
    assert str(info.value) == (
        f"run {run.name} has no manifest.json ({path}): it is not a complete run directory; "
        "start a new run, or restore the file from a backup"
    )
    path.write_text('{"a": ')
    with pytest.raises(RunRecordError) as info:
        read_record(run, "manifest.json")
    assert str(info.value).startswith(f"run {run.name}: {path} is unreadable (JSONDecodeError: ")
    assert str(info.value).endswith("); restore it from a backup, or move the run directory out of RUNS_DIR")
    path.write_text("[1]")
    with pytest.raises(RunRecordError) as info:
        read_record(run, "manifest.json")
    assert str(info.value) == (
        f"run {run.name}: {path} holds list, not a JSON object; "
        "restore it from a backup, or move the run directory out of RUNS_DIR"
    )


# -- RunDir: the layout, one source for the class names ------------------------------------------
def test_run_dir_names_are_the_documented_layout(tmp_path):
    """The names are the contract with users, scripts and CI: spelled out here on purpose."""
    from train.run.rundir import RunDir

    run = RunDir(str(tmp_path / "20260101-000000-000001"))
    names = {
        "config": "config.json",
        "manifest": "manifest.json",
        "labels": "labels.txt",
        "log": "train.log",
        "metrics": "metrics.csv",
        "tensorboard": "tensorboard",
        "checkpoints": "checkpoints",
        "best_weights": "best.weights.h5",
        "final_weights": "final.weights.h5",
        "report": "report.html",
        "curves": "curves.png",
        "reproduce": "reproduce.json",
        "lock": "run.lock",
    }
    assert {k: getattr(run, k) for k in names} == {k: run.path / v for k, v in names.items()}
    export = run.export
    assert (export.path, export.savedmodel, export.keras, export.labels, export.parity) == (
        run.path / "export",
        run.path / "export/savedmodel",
        run.path / "export/model.keras",
        run.path / "export/labels.txt",
        run.path / "export/parity.json",
    )
    assert run.name == "20260101-000000-000001"
    with pytest.raises(AttributeError):
        run.path = tmp_path  # frozen: a run's place never changes under its users


def test_the_class_names_come_from_the_manifest_and_labels_txt_is_derived(tmp_path):
    import json

    from train.run.rundir import RunDir

    run = RunDir(_run(tmp_path, "20260101-000000-000001"))
    run.manifest.write_text(json.dumps({"status": "running"}))
    with pytest.raises(RunRecordError, match="no data description"):
        run.data_description()
    with pytest.raises(RunRecordError):
        run.write_labels()
    assert not run.labels.exists()
    for damaged in ("x", {"class_names": ["cat"], "input_shape": ["a", 8, 3]}):  # were tracebacks in predict
        run.manifest.write_text(json.dumps({"data": damaged}))
        with pytest.raises(
            RunRecordError,
            match=r"records data(\.input_shape \['a'.*)? .*: not an input shape of whole numbers and a list of class names",
        ):
            run.data_description()
    run.manifest.write_text(json.dumps({"data": {"class_names": ["cat", "dog"], "input_shape": [8, 8, 3]}}))
    run.labels.write_text("stale\n")  # a copy is never read back: the manifest wins
    assert run.data_description() == (["cat", "dog"], (8, 8, 3))
    run.write_labels()
    assert run.labels.read_text() == "cat\ndog\n"
    before = run.labels.stat().st_ino
    run.write_labels()  # unchanged: not rewritten
    assert run.labels.stat().st_ino == before


# -- one test of "is a run", the same everywhere -------------------------------------------------
@pytest.fixture
def runs_with_strays(tmp_path):
    """One real run, interrupted, and two folders that are not runs, both newer by name."""
    from builders import write_run_records

    from train.config import Settings

    root = tmp_path / "runs"
    settings = Settings(runs_dir=str(root)).to_dict()
    real = write_run_records(root / "20260101-000000-000001", config=settings, manifest={"status": "interrupted"})
    (real / "checkpoints").mkdir()
    (real / "checkpoints" / "ckpt-000000004.npz").write_bytes(b"a state")
    half = root / "20260102-000000-000001"  # killed between mkdir and config.json
    (half / "checkpoints").mkdir(parents=True)
    (half / "tensorboard").mkdir()
    (half / "manifest.json").write_text('{"status": "running"}')
    stray = root / "20260103-000000-000001-notes"
    stray.mkdir()
    (stray / "metrics.csv").write_text("epoch,loss\n1,0.5\n")
    return root, real, [half, stray]


def test_a_folder_without_config_json_is_no_run_for_any_command(runs_with_strays, capsys):
    from train import cli
    from train.config import load_settings
    from train.reproduce.rerun import run_and_find
    from train.reproduce.worktree import Stop
    from train.results.report import write_final_report
    from train.results.runs_table import list_runs
    from train.run.resume import auto_resume

    root, real, strays = runs_with_strays
    assert list_run_dirs(root) == [real]
    assert [r["id"] for r in list_runs(root)] == [real.name]
    assert resolve_run(root, "latest") == real
    assert auto_resume(load_settings({"runs_dir": str(root)}, env_file=None, environ={})) == str(real)
    for stray in strays:
        with pytest.raises(RunNotFound):
            resolve_run(root, stray.name)
        write_final_report(stray, "completed", "quick")
        assert not (stray / "report.html").exists()
        for argv in (
            ["report", stray.name, "--quick"],
            ["compare", real.name, stray.name],
            ["export", stray.name],
            ["predict", stray.name, "x.png"],
        ):
            assert cli.main([*argv, "--runs-dir", str(root)]) == 2
            assert capsys.readouterr().err.startswith(f"RunNotFound: run {stray.name!r} not found")
    assert cli.main(["runs", "--runs-dir", str(root)]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]] == [real.name]
    assert cli.main(["report", "latest", "--quick", "--runs-dir", str(root)]) == 0
    assert (real / "report.html").is_file()
    # A command that only leaves a half-made folder made no run.
    import sys

    made = root / "20260104-000000-000001"
    cmd = [sys.executable, "-c", f"import pathlib; pathlib.Path({str(made)!r}, 'checkpoints').mkdir(parents=True)"]
    with pytest.raises(Exception, match="left no run directory"):
        run_and_find(cmd, root, Stop())


def test_shared_writes_cleans_stale_temps_only_when_no_other_writer_is_inside(tmp_path):
    from train.run.files import shared_writes

    folder = tmp_path / ".cache" / "abc"
    stale = folder / f"x{TMP_MARK}dead.npy"
    folder.mkdir(parents=True)
    stale.write_bytes(b"left by a kill")
    with shared_writes(folder) as removed:
        assert removed == [stale] and not stale.exists()
        live = folder / f"y{TMP_MARK}live.npy"  # this writer's temp file, being written
        live.write_bytes(b"in progress")
        with shared_writes(folder) as removed_by_other:  # a second process (its own lock file description)
            assert removed_by_other == [] and live.exists()
    with shared_writes(folder) as removed:  # everybody left: now it is stale
        assert removed == [live]
    assert [p.name for p in folder.iterdir()] == [".writers.lock"]


def test_a_folder_that_cannot_be_read_never_hides_the_stopped_run_from_resume_auto(runs_with_strays, tmp_path):
    from faults import file_modes_apply, run_python

    root, real, _ = runs_with_strays
    locked = root / "20251231-000000-000001"  # older than the stopped run; mode 000
    locked.mkdir()
    locked.chmod(0)
    code = (
        "from train.config import load_settings; from train.run.resume import auto_resume; "
        "from train.run.find import resolve_run; from train.errors import RunRecordError\n"
        f"print(auto_resume(load_settings({{'runs_dir': {str(root)!r}}}, env_file=None, environ={{}})))\n"
        f"print(resolve_run({str(root)!r}, 'latest'))\n"
        f"try: resolve_run({str(root)!r}, {locked.name!r})\n"
        "except RunRecordError as exc: print(exc.exit_code, exc)"
    )
    try:
        proc = run_python(code, tmp_path, timeout=120, preexec_fn=file_modes_apply())
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    resumed, latest, refused = proc.stdout.splitlines()
    assert resumed == str(real) and latest == str(real)
    assert refused.startswith(f"4 run {locked.name!r}: {locked} cannot be read (Permission denied)")
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 2 and all(w.startswith(f"WARNING: {locked} in RUNS_DIR cannot be read") for w in warnings)


def test_runs_dir_that_cannot_be_listed_is_a_storage_error_not_no_runs(tmp_path):
    from faults import file_modes_apply, run_python

    root = tmp_path / "runs"
    root.mkdir()
    root.chmod(0o300)  # writable, not listable
    code = f"from train.cli import main; print(main(['runs', '--runs-dir', {str(root)!r}, '--env-file', '/dev/null']))"
    try:
        proc = run_python(code, tmp_path, timeout=120, preexec_fn=file_modes_apply())
    finally:
        root.chmod(0o755)
    assert proc.stdout.split() == ["7"]
    assert proc.stderr.startswith(f"StorageError: cannot list RUNS_DIR {root}: Permission denied")
    assert proc.stderr.count("\n") == 1


def test_a_config_key_this_version_does_not_know_is_named_a_warning_when_read_and_a_difference_on_resume(
    runs_with_strays, caplog
):
    import json
    import logging

    from train.config import load_settings
    from train.errors import ResumeMismatchError
    from train.run.resume import auto_resume, plan_run
    from train.run.rundir import read_run_settings

    root, real, _ = runs_with_strays
    config = json.loads((real / "config.json").read_text())
    (real / "config.json").write_text(json.dumps({**config, "label_smoothing": 0.1, "epoch": 9}))
    logger, propagate = logging.getLogger("train"), logging.getLogger("train").propagate
    logger.addHandler(caplog.handler)
    logger.propagate = False  # each line once, whatever an earlier test set up
    try:
        assert read_run_settings(real).epochs == config["epochs"]
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning == (
        f"WARNING: run {real.name}: {real / 'config.json'} holds EPOCH (did you mean EPOCHS?), LABEL_SMOOTHING, "
        "not a setting of this version (written by a newer version, or edited by hand): ignored here; use the "
        "version that wrote the run, or remove the key"
    )
    settings = load_settings({"runs_dir": str(root)}, env_file=None, environ={})
    assert auto_resume(settings) == ""  # its settings differ: a new run, as for any other difference
    with pytest.raises(ResumeMismatchError) as info:
        plan_run(settings, real.name)
    assert (  # as reproduce refuses it, with the fix: it asked only whether a newer version wrote it
        "LABEL_SMOOTHING: not a setting of this version (written by a newer version, or edited by hand: use the "
        "version that wrote the run, or remove the key)" in str(info.value)
    )
    assert "EPOCH (did you mean EPOCHS?): not a setting" in str(info.value) and "--force" in str(info.value)
    assert json.loads((real / "config.json").read_text())["label_smoothing"] == 0.1  # the record is unchanged


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("batch_size", "64", "BATCH_SIZE='64' is not valid: must be a whole number, written without quotes"),
        ("smoke", "false", "SMOKE='false' is not valid: must be true or false, written without quotes"),
        ("learning_rate", True, "LEARNING_RATE=True is not valid: must be a number"),
        ("model", 3, "MODEL=3 is not valid: must be text"),
    ],
)
def test_a_saved_setting_of_the_wrong_json_type_is_named_by_every_reader(runs_with_strays, key, value, says):
    """A hand-edited config.json: "false" would read as true in Python, "64" fails deep inside a command."""
    import json

    from train.reproduce.record import check_config
    from train.run.rundir import read_run_settings

    _root, real, _ = runs_with_strays
    config = {**json.loads((real / "config.json").read_text()), key: value}
    (real / "config.json").write_text(json.dumps(config))
    with pytest.raises(RunRecordError) as info:
        read_run_settings(real)
    assert f"config.json does not hold valid settings ({says}); restore it from a backup" in str(info.value)
    with pytest.raises(ReproduceRecordError, match=f"{key}={value!r} is not"):  # reproduce names the key as saved
        check_config(real / "config.json", config)


@pytest.mark.parametrize("name, ok", [("界" * 64, True), ("𠀀" * 58, True), ("𠀀" * 64, False), ("é" * 64, True)])
def test_run_name_is_checked_in_bytes_before_anything_starts(tmp_path, capsys, name, ok):
    from train import cli
    from train.config import load_settings
    from train.errors import ConfigError

    runs = tmp_path / "not" / "yet"  # RUNS_DIR need not exist: its nearest parent's file system decides
    if ok:
        assert load_settings({"run_name": name, "runs_dir": str(runs)}, env_file=None, environ={}).run_name == name
        assert create_run_dir(runs, name).name.endswith("-" + name)  # the longest that fits, for "𠀀" * 58
        return
    with pytest.raises(ConfigError):
        load_settings({"run_name": name, "runs_dir": str(runs)}, env_file=None, environ={})
    assert cli.main(["fit", "--run-name", name, "--runs-dir", str(runs), "--env-file", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ConfigError: RUN_NAME={name!r} is not valid: 256 bytes in UTF-8, more than the 232 ")
    assert "allows 255 bytes a name, the run id takes 23): shorten it" in err and err.count("\n") == 1
    assert not runs.exists()


def test_a_name_too_long_for_the_file_system_says_so(tmp_path):
    err = storage_error(tmp_path / ("x" * 300), OSError(errno.ENAMETOOLONG, "File name too long"), in_docker=False)
    assert str(err).endswith("a name in the path is longer than the file system allows: shorten RUN_NAME or RUNS_DIR")
    assert err.exit_code == 7


def test_a_run_missing_from_a_store_is_missing_from_the_store_not_from_its_staging_folder(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from train.run import remote

    staging = tmp_path / "cache" / "s3" / "bkt" / "runs"
    staging.mkdir(parents=True)
    monkeypatch.setitem(remote._OPEN, "s3://bkt/runs", SimpleNamespace(root=staging, url="s3://bkt/runs"))
    for run in ("20261203-000000-000000-gone", "latest"):
        with pytest.raises(RunNotFound) as err:
            resolve_run("s3://bkt/runs", run)
        assert "in s3://bkt/runs" in str(err.value) and str(staging) not in str(err.value), err.value
