"""runs: the table of runs under RUNS_DIR, from fake run directories (damaged ones included)."""

from __future__ import annotations

import json
import os

import pytest
from builders import write_run

from train.results.runs_table import format_runs, list_runs


def _run(root, name, config, manifest=None, metrics=None):
    return write_run(root / name, config, manifest, metrics)


TESTED = {"epoch": 2, "loss": 0.061, "accuracy": 0.98125}
CFG = {"epochs": 3, "monitor": "val_accuracy", "model": "cnn", "dataset": "mnist"}


def test_list_and_format_runs(tmp_path):
    root = tmp_path / "runs"
    _run(
        root,
        "20260101-000000-aaaa",
        CFG,
        {
            "status": "completed",
            "epochs_completed": 3,
            "best": {"value": 0.98765},
            "duration_seconds": 61.4,
            "test": {"weights": {"best": TESTED, "final": {"epoch": 3, "loss": 0.05, "accuracy": 0.97}}},
        },
    )
    _run(root, "20260102-000000-bbbb", CFG, "{not json", metrics="epoch,loss\n1,0.5\n2,0.4\n")
    _run(root, "20260103-000000-cccc", "{broken")  # config unreadable too
    (root / "not-a-run").mkdir()
    (root / "stray.txt").write_text("x")

    rows = list_runs(root)
    assert [r["id"] for r in rows] == ["20260101-000000-aaaa", "20260102-000000-bbbb", "20260103-000000-cccc"]
    assert rows[0] == {
        "id": "20260101-000000-aaaa",
        "status": "completed",
        "epochs": 3,
        "of": 3,
        "monitor": "val_accuracy",
        "best": 0.98765,
        "test": TESTED,
        "duration": 61.4,
        "model": "cnn",
        "dataset": "mnist",
        "smoke": False,
        "reason": None,
        "error": None,
        "copy_of": None,
        "data_version": None,
    }
    assert (rows[1]["status"], rows[1]["epochs"], rows[1]["best"]) == ("unreadable", None, None)
    assert "manifest.json is unreadable" in rows[1]["reason"]
    assert (rows[2]["status"], rows[2]["epochs"], rows[2]["of"]) == ("unreadable", None, None)

    lines = format_runs(rows).splitlines()
    assert lines[0].split() == ["ID", "STATUS", "EPOCHS", "BEST", "TEST", "DURATION", "MODEL", "DATASET"]
    assert lines[1].split() == [
        "20260101-000000-aaaa",
        "completed",
        "3/3",
        "val_accuracy=0.9877",
        "accuracy=0.9812",  # the best weights on the test split, apart from the validation value that chose them
        "61s",
        "cnn",
        "mnist",
    ]
    assert lines[2].split() == ["20260102-000000-bbbb", "unreadable", "-/-", "-", "-", "-"]
    assert lines[3].split() == ["20260103-000000-cccc", "unreadable", "-/-", "-", "-", "-"]
    assert lines[4].startswith("20260102-000000-bbbb: run 20260102-000000-bbbb:") and "backup" in lines[4]
    col = lines[0].index("STATUS")
    assert lines[1][col:].startswith("completed") and lines[2][col:].startswith("unreadable")  # aligned columns
    assert all(line == line.rstrip() for line in lines)


@pytest.mark.parametrize(
    "manifest",
    ["[1, 2]", "null", '{"best": [1], "status": "completed"}', '{"segments": 5, "status": "completed"}', b"\xff\xfe"],
)
def test_one_damaged_run_is_one_unreadable_row_and_never_takes_the_table_down(tmp_path, manifest):
    root = tmp_path / "runs"
    bad = _run(root, "20260101-000000-000001", CFG)
    (bad / "manifest.json").write_bytes(manifest if isinstance(manifest, bytes) else manifest.encode())
    _run(root, "20260101-000000-000002", CFG, {"status": "completed", "epochs_completed": 3})
    rows = list_runs(root)
    assert [r["status"] for r in rows] == ["unreadable", "completed"]
    text = format_runs(rows)
    assert "20260101-000000-000002  completed" in text and rows[0]["reason"] in text


def test_a_named_pipe_for_config_json_is_an_unreadable_row_naming_it(tmp_path):
    root = tmp_path / "runs"
    bad = _run(root, "20260101-000000-000001", CFG)
    (bad / "config.json").unlink()
    os.mkfifo(bad / "config.json")  # nobody writes it: it was no run at all, `report` said it had no config.json
    (row,) = list_runs(root)
    assert (
        row["status"] == "unreadable" and f"{bad / 'config.json'} is unreadable (NotRegularFileError" in row["reason"]
    )


def test_a_smoke_run_shows_the_one_epoch_it_trains(tmp_path):
    root = tmp_path / "runs"
    _run(
        root,
        "20260101-000000-000001",
        {**CFG, "epochs": 5, "smoke": True},
        {"status": "completed", "epochs_completed": 1, "segments": [{"epochs_planned": 1, "seconds": 3.0}]},
    )
    _run(root, "20260101-000000-000002", {**CFG, "smoke": True}, {"status": "completed", "epochs_completed": 1})
    rows = list_runs(root)
    assert [(r["epochs"], r["of"]) for r in rows] == [(1, 1), (1, 1)]
    assert format_runs(rows).splitlines()[1].split()[2:] == ["1/1", "-", "-", "3s", "cnn", "mnist", "(smoke)"]


def test_duration_is_the_training_time_of_every_segment(tmp_path):
    root = tmp_path / "runs"
    _run(
        root,
        "20260101-000000-000001",
        {**CFG, "epochs": 4},
        {
            "status": "completed",
            "epochs_completed": 4,
            "duration_seconds": 55.0,
            "segments": [
                {"seconds": 94.0, "status": "interrupted"},
                {"seconds": None, "status": "killed"},
                {"seconds": 55.0, "status": "completed", "epochs_planned": 4},
            ],
        },
    )
    (row,) = list_runs(root)
    assert row["duration"] == 149.0 and row["of"] == 4
    assert format_runs([row]).splitlines()[1].split()[5] == "149s"


def test_no_runs(tmp_path):
    assert list_runs(tmp_path / "missing") == []
    assert format_runs([]).startswith("no runs yet")


def test_the_runs_command_lists_the_good_runs_beside_a_damaged_one(tmp_path, capsys):
    from train import cli

    root = tmp_path / "runs"
    _run(root, "20260101-000000-000001", CFG, "[]")
    _run(root, "20260101-000000-000002", CFG, {"status": "completed", "epochs_completed": 3})
    assert cli.main(["runs", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:2] == ["20260101-000000-000001", "unreadable"]
    assert out[2].split()[:3] == ["20260101-000000-000002", "completed", "3/3"]
    assert "holds list, not a JSON object" in out[3]


def test_runs_json_is_one_document_with_the_tables_fields(tmp_path, capsys):
    from train import cli

    root = tmp_path / "runs"
    _run(
        root,
        "20260101-000000-000001",
        {**CFG, "epochs": 4},
        {
            "status": "completed",
            "epochs_completed": 4,
            "best": {"value": 0.75},
            "test": {"examples": 10000, "weights": {"best": TESTED}},
            "segments": [
                {"seconds": 94.0, "status": "interrupted"},
                {"seconds": 55.5, "status": "completed", "epochs_planned": 4},
            ],
        },
    )
    _run(root, "20260101-000000-000002", {**CFG, "smoke": True}, '{"status": "failed", "best": {"value": NaN}}')
    _run(root, "20260101-000000-000003", CFG, "[]")
    assert cli.main(["runs", "--json", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    runs = json.loads(out)  # strict JSON: NaN would not load in other languages' parsers
    assert "NaN" not in out
    assert runs[0] == {
        "id": "20260101-000000-000001",
        "status": "completed",
        "epochs_completed": 4,
        "epochs_planned": 4,
        "monitor": "val_accuracy",
        "best": 0.75,
        "test": TESTED,
        "duration_seconds": 149.5,
        "model": "cnn",
        "dataset": "mnist",
        "smoke": False,
        "unreadable_reason": None,
        "error": None,
        "copy_of": None,
    }
    second = runs[1]
    assert (second["status"], second["best"], second["smoke"], second["epochs_planned"]) == ("failed", None, True, 1)
    assert runs[2]["status"] == "unreadable" and "holds list" in runs[2]["unreadable_reason"]
    assert [r["id"] for r in runs] == [r["id"] for r in list_runs(root)]


def test_runs_json_with_no_runs_is_an_empty_list(tmp_path, capsys):
    from train import cli

    assert cli.main(["runs", "--json", "--runs-dir", str(tmp_path / "none")]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_a_folder_that_cannot_be_read_is_one_warning_and_the_runs_beside_it_are_listed(tmp_path):
    from faults import file_modes_apply, run_python

    root = tmp_path / "runs"
    _run(root, "20260101-000000-000001", CFG, {"status": "completed", "epochs_completed": 3})
    _run(root, "20260101-000000-000003", CFG, {"status": "interrupted", "epochs_completed": 1})
    locked = root / "20260101-000000-000002"
    locked.mkdir()
    locked.chmod(0)
    try:
        for argv in (["runs"], ["runs", "--json"]):
            argv += ["--runs-dir", str(root), "--env-file", "/dev/null"]
            code = f"import sys; from train.cli import main; sys.exit(main({argv!r}))"
            proc = run_python(code, tmp_path, timeout=120, preexec_fn=file_modes_apply())
            assert proc.returncode == 0, proc.stderr
            listed = [r["id"] for r in json.loads(proc.stdout)] if "--json" in argv else proc.stdout.split()
            assert "20260101-000000-000001" in listed and "20260101-000000-000003" in listed
            assert locked.name not in proc.stdout
            (warning,) = proc.stderr.splitlines()
            assert warning.startswith(f"WARNING: {locked} in RUNS_DIR cannot be read (Permission denied)")
            assert "make it readable" in warning
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize(
    "manifest",
    [
        '{"status": "completed", "epochs_completed": NaN}',
        '{"status": "completed", "epochs_completed": 3, "duration_seconds": Infinity}',
        '{"status": "completed", "segments": [{"seconds": -Infinity, "epochs_planned": NaN}]}',
        '{"status": "completed", "segments": [{"seconds": 1e308}, {"seconds": 1e308}], "best": {"value": -Infinity}}',
        '{"status": "completed", "epochs_completed": "3", "best": {"value": "0.9"}, "duration_seconds": true}',
    ],
)
def test_a_number_that_is_not_finite_is_null_and_the_other_runs_are_listed(tmp_path, capsys, manifest):
    from train import cli

    root = tmp_path / "runs"
    for i in range(1, 201):
        name = f"20260101-000000-{i:06d}"
        good = {"status": "completed", "epochs_completed": 3, "best": {"value": 0.5}, "duration_seconds": 9.0}
        _run(root, name, CFG, manifest if i == 100 else good)
    assert cli.main(["runs", "--json", "--runs-dir", str(root)]) == 0
    out, err = capsys.readouterr()
    runs = json.loads(out)
    assert len(runs) == 200 and err == ""
    assert all(r["best"] == 0.5 and r["epochs_completed"] == 3 for i, r in enumerate(runs) if i != 99)
    damaged = runs[99]
    assert damaged["status"] == "completed"
    for key in ("best", "duration_seconds"):
        assert damaged[key] is None or isinstance(damaged[key], float) and damaged[key] < 1e300, key
    assert damaged["epochs_completed"] in (None, 3) and damaged["epochs_planned"] in (None, 3)
    assert cli.main(["runs", "--runs-dir", str(root)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 201 and not any(word in table[100].lower() for word in ("nan", "inf"))


def test_a_failed_run_shows_why_under_the_table_and_in_json(tmp_path, capsys):
    from train import cli

    root = tmp_path / "runs"
    error = "DataError: data/mnist.npz is truncated (12 of 11490434 bytes); download it again\nsecond line"
    _run(root, "20260101-000000-000001", CFG, {"status": "failed", "epochs_completed": 0, "error": error})
    _run(root, "20260101-000000-000002", CFG, {"status": "completed", "epochs_completed": 3, "error": None})
    assert cli.main(["runs", "--runs-dir", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["20260101-000000-000001", "failed"]
    assert lines[3:] == [
        "20260101-000000-000001: failed: DataError: data/mnist.npz is truncated (12 of 11490434 bytes); download it again"
    ]
    assert cli.main(["runs", "--json", "--runs-dir", str(root)]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert runs[0]["error"] == error.splitlines()[0] and runs[1]["error"] is None


def test_a_long_error_keeps_what_failed_and_the_fix_at_its_end(tmp_path):
    from train.results.runs_table import list_runs

    error = "DataError: mnist.npz not found " + "and the download failed because " * 12 + "; put mnist.npz in data/"
    _run(tmp_path, "20260101-000000-000001", CFG, {"status": "failed", "epochs_completed": 0, "error": error})
    (row,) = list_runs(tmp_path)
    assert len(error) > 300 >= len(row["error"])
    assert row["error"].startswith("DataError: mnist.npz not found and the download failed")
    assert row["error"].endswith(" ... " + error[-147:]) and row["error"].endswith("; put mnist.npz in data/")


# MONITOR, MONITOR_MODE -> the best epoch of builders.peaked_metrics and its value (never the last epoch)
PEAKS = [
    ("val_accuracy", "auto", 3, 0.91),
    ("val_accuracy", "max", 3, 0.91),
    ("val_loss", "auto", 2, 0.30),
    ("val_loss", "min", 2, 0.30),
    ("val_accuracy", "min", 1, 0.70),
]


@pytest.mark.parametrize("monitor, mode, epoch, value", PEAKS)
def test_runs_shows_the_best_epoch_not_the_last(tmp_path, capsys, monitor, mode, epoch, value):
    from builders import peaked_metrics, write_run_records

    from train import cli

    root = tmp_path / "runs"
    config = {"monitor": monitor, "monitor_mode": mode, "epochs": 5}
    # Killed before it closed its manifest: no best recorded there, so it comes from metrics.csv.
    write_run_records(root / "20260101-000000-000001", config, {"status": "running"}, metrics=peaked_metrics())
    recorded = {"status": "completed", "epochs_completed": 5, "best": {"monitor": monitor, "value": value}}
    write_run_records(root / "20260101-000000-000002", config, recorded, metrics=peaked_metrics())
    assert [r["best"] for r in list_runs(root)] == [value, value]
    assert cli.main(["runs", "--runs-dir", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[3] for line in lines[1:]] == [f"{monitor}={value:.4f}"] * 2
    # a metrics.csv that is no UTF-8: the run's row from its manifest, not "unreadable" for a bare decode error
    (root / "20260101-000000-000001" / "metrics.csv").write_bytes(b"\xff\x00\n1,2\n")
    assert [(r["status"], r["epochs"]) for r in list_runs(root)] == [("running", 1), ("completed", 5)]


def test_a_copy_of_a_run_in_runs_dir_is_named_as_one(tmp_path, capsys):
    from train import cli

    root = tmp_path / "runs"
    manifest = {"run_id": "20260101-000000-000001", "status": "interrupted", "epochs_completed": 1}
    original = _run(root, "20260101-000000-000001", CFG, manifest)
    _run(root, "base copy.bak", CFG, manifest)
    assert cli.main(["runs", "--runs-dir", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines[1:3]] == ["base copy.bak", original.name]
    assert lines[3:] == [
        f"base copy.bak: its manifest.json says it is run {original.name}: a copy or a renamed folder; "
        "keep backups outside RUNS_DIR (every command takes what is there for a run)"
    ]
    assert cli.main(["runs", "--json", "--runs-dir", str(root)]) == 0
    assert [r["copy_of"] for r in json.loads(capsys.readouterr().out)] == [original.name, None]
    # Unquoted, the name arrives cut at its space: the error says which run was meant.
    assert cli.main(["compare", original.name, "base", "--runs-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"RunNotFound: run 'base' not found in {root} (no config.json); did you mean 'base copy.bak'? "
        f"(quote a name that has a space); `python -m train runs --runs-dir {root}` lists the runs"
    )
    assert err.count("\n") == 1
    assert cli.main(["report", "20260101-000000-00001", "--runs-dir", str(root)]) == 2
    assert f"did you mean {original.name!r}?;" in capsys.readouterr().err


def _left_by_a_killed_holder(run_dir):
    """run.lock as a SIGKILLed fit leaves it: its holder's line, no lock on it (the kernel dropped it)."""
    import os
    import socket

    (run_dir / "run.lock").write_text(f"pid {os.getpid()} on host {socket.gethostname()}\n")


def test_a_running_run_whose_process_is_gone_is_listed_as_killed_with_how_to_continue(tmp_path, capsys):
    import os
    import socket

    from train import cli
    from train.run.lock import RunLock

    root = tmp_path / "my runs"  # the command to paste quotes it
    ids = [f"20260101-000000-00000{i}" for i in range(1, 5)]
    for i in ids:
        _run(root, i, CFG, {"status": "running", "epochs_completed": 1})
    held = RunLock(root / ids[0]).acquire()  # a run still training (this process holds its lock)
    _left_by_a_killed_holder(root / ids[1])  # its process ended without closing the manifest
    (root / ids[2] / "run.lock").write_text("pid 4242 on host another-machine\n")  # NFS: cannot tell from here
    # ids[3] has no lock file at all (written before runs held locks): cannot tell either
    try:
        assert [r["status"] for r in list_runs(root)] == ["running", "killed", "running", "running"]
        assert cli.main(["runs", "--runs-dir", str(root)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[2].split()[:2] == [ids[1], "killed"]
        assert lines[5:] == [
            f"{ids[1]}: killed: its process ended without closing the run (SIGKILL, out of memory, the machine "
            f"went down); `python -m train fit --resume {ids[1]} --runs-dir '{root}'` continues it"
        ]
        assert cli.main(["runs", "--json", "--runs-dir", str(root)]) == 0
        assert [r["status"] for r in json.loads(capsys.readouterr().out)] == ["running", "killed", "running", "running"]
        assert (root / ids[1] / "run.lock").read_text() == f"pid {os.getpid()} on host {socket.gethostname()}\n"
    finally:
        held.release()


@pytest.mark.parametrize("expired, status", [(False, "running"), (True, "killed")])
def test_a_run_of_a_runs_dir_in_object_storage_is_killed_by_its_lease_never_by_its_staging_copy(
    tmp_path, monkeypatch, expired, status
):
    # Its lease may be held by another machine: the local lock says nothing about that process.
    import types

    from train.run import remote

    root = tmp_path / "runs"
    _run(root, "20260101-000000-000001", CFG, {"status": "running", "epochs_completed": 1})
    _left_by_a_killed_holder(root / "20260101-000000-000001")
    assert [r["status"] for r in list_runs(root)] == ["killed"]
    asked = []
    store = types.SimpleNamespace(lease_expired=lambda run_dir: asked.append(run_dir.name) or expired)
    monkeypatch.setattr(remote, "for_run", lambda run_dir: store)
    assert [r["status"] for r in list_runs(root)] == [status]
    assert asked == ["20260101-000000-000001"]


def test_runs_json_holds_the_data_version_only_of_a_run_that_recorded_one(tmp_path):
    from train.results.runs_table import runs_json

    root = tmp_path / "runs"
    version = {"tool": "dvc", "path": "images", "commit": "c7" * 20, "hash": "16.dir", "password": "never listed"}
    _run(root, "20260101-000000-aaaa", CFG, {"status": "completed", "data": {"version": version}})
    _run(root, "20260102-000000-bbbb", CFG, {"status": "completed", "data": {"fingerprint": "ab"}})
    first, second = json.loads(runs_json(list_runs(root)))
    assert first["data_version"]["commit"] == "c7" * 20 and first["data_version"]["path"] == "images"
    assert "password" not in first["data_version"] and "data_version" not in second
