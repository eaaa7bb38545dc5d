"""reproduce_record: a record reproduce cannot use is refused before any rerun, in one line naming file, field, value."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from builders import write_run_records

from train.errors import ReproduceError, ReproduceRecordError
from train.reproduce.record import check_comparable, check_record
from train.reproduce.rerun import reproduce
from train.run.lock import RunLock

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHA = "ab" * 32


def _run(tmp_path: Path, config: dict | None = None, manifest: dict | None = None, **kw) -> Path:
    return write_run_records(
        tmp_path / "runs" / "20240101-000000-000000-ab12",
        config={"deterministic": True, "epochs": 5, **(config or {})},
        manifest={
            "git": {"commit": COMMIT, "dirty": False, "source": "git"},
            "final_weights_sha256": SHA,
            "epochs_completed": 5,
            **(manifest or {}),
        },
        **kw,
    )


def _refused(run: Path, epochs: int | None = None) -> str:
    """The one line reproduce gives for `run`, in a folder that is no git checkout (so nothing could rerun)."""
    with pytest.raises(ReproduceRecordError) as info:
        reproduce(run, run.parent, epochs=epochs, say=lambda _line: None)
    line = str(info.value)
    assert "\n" not in line
    return line


def _set(path: Path, **fields) -> None:
    record = json.loads(path.read_text())
    record.update(fields)
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    "entry, value, field, bad",
    [
        ("git", "git", "git", "git"),
        ("git", {"commit": 12345, "dirty": False}, "git.commit", 12345),
        ("git", {"commit": "HEAD", "dirty": False}, "git.commit", "HEAD"),
        ("git", {"commit": "main", "dirty": False}, "git.commit", "main"),
        ("git", {"commit": COMMIT[:12], "dirty": False}, "git.commit", COMMIT[:12]),
        ("git", {"commit": COMMIT, "dirty": "no"}, "git.dirty", "no"),
        ("requirements_lock", {"file": "requirements/cpu.lock", "sha256": 7}, "requirements_lock.sha256", 7),
        ("data", ["cd"], "data", ["cd"]),
        ("precision", "float32", "precision", "float32"),
        ("gpus", "none", "gpus", "none"),
        ("tensorflow", 2.21, "tensorflow", 2.21),
        ("final_weights_sha256", "abc", "final_weights_sha256", "abc"),
        ("epochs_completed", "5", "epochs_completed", "5"),
    ],
)
def test_a_manifest_field_of_the_wrong_kind_is_refused_naming_file_field_and_value(tmp_path, entry, value, field, bad):
    run = _run(tmp_path)
    _set(run / "manifest.json", **{entry: value})
    assert _refused(run).startswith(f"{run / 'manifest.json'}: {field}={bad!r} is not ")


def test_only_a_full_40_hex_commit_is_a_commit(tmp_path):
    for commit in ("HEAD", "HEAD~1", "v1.0", COMMIT[:39], COMMIT + "0", "g" * 40):
        run = _run(tmp_path / commit.replace("~", "_"), manifest={"git": {"commit": commit, "dirty": False}})
        assert f"git.commit={commit!r} is not a full 40-hex commit hash" in _refused(run)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("epochs", "abc", "is not a whole number"),
        ("epochs", 2.5, "is not a whole number"),
        ("deterministic", "false", "is not true or false"),
        ("batch_size", True, "is not a whole number"),
        ("learning_rate", "0.1", "is not a number"),
        ("epochs", 0, "is not valid"),
        ("model", "no_such_model", "is not valid"),
    ],
)
def test_a_config_value_of_the_wrong_type_or_out_of_range_is_refused(tmp_path, field, value, says):
    run = _run(tmp_path)
    _set(run / "config.json", **{field: value})
    line = _refused(run)
    assert line.startswith(f"{run / 'config.json'}: {field}={value!r} {says}"), line


def test_a_metrics_cell_that_is_not_a_number_is_refused_before_the_rerun(tmp_path):
    run = _run(tmp_path)
    text = (run / "metrics.csv").read_text().splitlines()
    header = text[0].split(",")
    cells = text[2].split(",")
    cells[header.index("val_loss")] = "abc"
    text[2] = ",".join(cells)
    (run / "metrics.csv").write_text("\n".join(text) + "\n")
    line = _refused(run)
    assert line.startswith(f"{run / 'metrics.csv'}: line 3, column val_loss='abc' is not a number"), line


@pytest.mark.parametrize(
    "row, says",
    [
        ("x,0.5,0.5,0.5,0.5,0.001,128,10.0,6000.0", "column epoch='x' is not a number"),
        ("1.5,0.5,0.5,0.5,0.5,0.001,128,10.0,6000.0", "column epoch='1.5' is not an epoch number"),
        ("6,0.5,0.5", "line 7=3 cells where the header has 9"),
        ("6,0.5,0.5,0.5,0.5,0.001,128,10.0,6000.0,9", "line 7=10 cells where the header has 9"),
    ],
)
def test_a_damaged_metrics_row_is_refused(tmp_path, row, says):
    run = _run(tmp_path)
    with (run / "metrics.csv").open("a") as f:
        f.write(row + "\n")
    assert says in _refused(run)


def test_the_verdict_needs_what_it_compares_with(tmp_path):
    run = _run(tmp_path)
    manifest, config = json.loads((run / "manifest.json").read_text()), json.loads((run / "config.json").read_text())
    rows = check_record(run, manifest, config)
    check_comparable(run, manifest, config, 3, rows)  # a row for epoch 3 is there
    check_comparable(run, manifest, config, None, rows)  # the final weights' hash is there
    with pytest.raises(ReproduceRecordError, match="metrics.csv: epoch=3 has no row"):
        check_comparable(run, manifest, config, 3, {1: {}, 2: {}})
    with pytest.raises(ReproduceRecordError, match="status='interrupted' is not 'completed'.*--epochs 2"):
        constant = dict(config, lr_schedule="constant")  # a cosine schedule's --epochs is refused
        check_comparable(run, dict(manifest, status="interrupted", epochs_completed=2), constant, None, rows)
    with pytest.raises(ReproduceRecordError, match="final_weights_sha256=None is missing"):
        check_comparable(run, dict(manifest, final_weights_sha256=None), config, None, rows)
    with pytest.raises(ReproduceRecordError, match="metrics.csv: epoch=5 has no row"):
        check_comparable(run, manifest, dict(config, deterministic=False), None, {1: {}})


def test_epochs_beyond_the_runs_own_are_refused(tmp_path):
    with pytest.raises(ReproduceError, match="--epochs 6: the run has EPOCHS=5"):
        reproduce(_run(tmp_path), tmp_path, epochs=6, say=lambda _line: None)


def test_a_shorter_rerun_of_a_cosine_schedule_is_refused_before_the_commit_is_looked_for(tmp_path):
    # tmp_path is no git checkout: without the refusal the next check would fail for that instead.
    run = _run(tmp_path, config={"lr_schedule": "cosine"})
    with pytest.raises(ReproduceError, match="--epochs with LR_SCHEDULE=cosine"):
        reproduce(run, tmp_path, epochs=2, say=lambda _line: None)
    with pytest.raises(ReproduceError, match="is not a git checkout"):
        reproduce(run, tmp_path, epochs=5, say=lambda _line: None)  # the whole run: no refusal


def _why(run, manifest, config, epochs, rows) -> str:
    with pytest.raises(ReproduceRecordError) as exc:
        check_comparable(run, manifest, config, epochs, rows)
    return str(exc.value)


def test_each_refusal_of_check_comparable_in_full(tmp_path):
    from train.reproduce.record import RESTORE

    run = _run(tmp_path)
    manifest, config = json.loads((run / "manifest.json").read_text()), json.loads((run / "config.json").read_text())
    m, j = run / "metrics.csv", run / "manifest.json"
    assert _why(run, manifest, config, 3, {1: {}, 2: {}}) == (
        f"{m}: epoch=3 has no row (epochs 1..2): the rerun would have nothing to compare with; "
        "choose --epochs among the epochs recorded"
    )
    assert _why(run, manifest, config, 3, {}).startswith(f"{m}: epoch=3 has no row (no rows): ")
    stopped = dict(manifest, status="interrupted", epochs_completed=None)
    assert _why(run, stopped, config, None, {}) == (
        f"{j}: status='interrupted' is not 'completed': the run has no final result; it never finished an epoch"
    )
    killed = dict(manifest, status="running", epochs_completed=None)  # a SIGKILL: only metrics.csv knows
    assert _why(run, killed, dict(config, lr_schedule="constant"), None, {1: {}, 2: {}, 3: {}}).endswith(
        "is not 'completed': the run has no final result; reproduce its first 3 epoch(s) with --epochs 3"
    )
    assert _why(run, killed, dict(config, lr_schedule="cosine"), None, {1: {}}).endswith(
        "no final result; --epochs cannot stop a cosine schedule early: finish the run first "
        f"(`python -m train fit --resume {run.name}`), then reproduce it"  # was told to use --epochs, then refused
    )
    with RunLock(run):  # still training: was taken for killed, and told to reproduce its first epochs
        assert _why(run, killed, config, None, {1: {}}) == (
            f"{j}: status='running' is not 'completed': the run is still training; reproduce it once it ends"
        )
    # --epochs equal to the run's own is the whole run: its status still counts.
    assert _why(run, dict(stopped, epochs_completed=2), config, 5, {5: {}}).startswith(f"{j}: status='interrupted'")
    assert _why(run, dict(manifest, final_weights_sha256=None), config, None, {}) == (
        f"{j}: final_weights_sha256=None is missing: a DETERMINISTIC run is judged by it; {RESTORE}"
    )
    assert _why(run, dict(manifest, epochs_completed=None), dict(config, deterministic=False), None, {}) == (
        f"{m}: epoch=5 has no row: the rerun's final metrics would have nothing to compare with; {RESTORE}"
    )


def test_what_each_run_is_judged_by_is_enough(tmp_path):
    run = _run(tmp_path)
    manifest, config = json.loads((run / "manifest.json").read_text()), json.loads((run / "config.json").read_text())
    assert config["deterministic"] and config["epochs"] == 5
    check_comparable(run, manifest, config, None, {})  # judged by the final weights' hash: no row needed
    # Stopped early after 3 of 5 epochs: its last row is epoch 3.
    early = dict(manifest, epochs_completed=3)
    check_comparable(run, early, dict(config, deterministic=False), None, {1: {}, 2: {}, 3: {}})


def test_the_epochs_refusals_are_whole_lines_and_no_epochs_is_the_whole_run(tmp_path):
    run = _run(tmp_path, config={"lr_schedule": "cosine"})
    with pytest.raises(ReproduceError) as exc:
        reproduce(run, tmp_path, epochs=0, say=lambda _line: None)
    assert str(exc.value) == "--epochs 0: give a number of epochs of at least 1"
    with pytest.raises(ReproduceError) as exc:
        reproduce(run, tmp_path, epochs=2, say=lambda _line: None)
    assert str(exc.value) == (
        "--epochs with LR_SCHEDULE=cosine: the schedule spans all EPOCHS, so a shorter rerun follows another "
        "learning rate; reproduce the whole run instead"
    )
    with pytest.raises(ReproduceError, match="is not a git checkout"):  # past every --epochs check
        reproduce(run, tmp_path, epochs=None, say=lambda _line: None)


def test_a_run_from_a_dirty_tree_is_refused_unless_allowed(tmp_path):
    run = _run(tmp_path, manifest={"git": {"commit": COMMIT, "dirty": True, "source": "git"}})
    with pytest.raises(ReproduceError, match="^the run was made from a tree with uncommitted changes on top of "):
        reproduce(run, tmp_path, say=lambda _line: None)
    with pytest.raises(ReproduceError, match="is not a git checkout"):  # allowed: on to the next check
        reproduce(run, tmp_path, allow_dirty=True, say=lambda _line: None)


def _refusal(run: Path, manifest: dict | None = None, config: dict | None = None) -> str:
    """check_record's one line for the run's own record with `manifest` and `config` merged in."""
    saved_manifest = json.loads((run / "manifest.json").read_text())
    saved_config = json.loads((run / "config.json").read_text())
    with pytest.raises(ReproduceRecordError) as info:
        check_record(run, {**saved_manifest, **(manifest or {})}, {**saved_config, **(config or {})})
    return str(info.value)


def test_each_refusal_of_a_record_field_in_full_with_its_fix(tmp_path):
    from train.reproduce.record import RESTORE, UNTRACEABLE

    run = _run(tmp_path)
    j, c = run / "manifest.json", run / "config.json"
    # The code a run was made with is named by git's fields alone: only those cannot be restored by a rerun.
    assert _refusal(run, {"git": {"commit": "HEAD"}}) == (
        f"{j}: git.commit='HEAD' is not a full 40-hex commit hash (a branch, a tag or HEAD moves); {UNTRACEABLE}"
    )
    assert _refusal(run, {"git": "abc"}) == f"{j}: git='abc' is not a JSON object; {UNTRACEABLE}"
    assert _refusal(run, {"gpus": "none"}) == f"{j}: gpus='none' is not a JSON list; {RESTORE}"
    assert _refusal(run, config={"epochs": "abc"}) == f"{c}: epochs='abc' is not a whole number; {RESTORE}"
    assert _refusal(run, config={"epochs": 0}).startswith(f"{c}: epochs=0 is not valid: ")
    assert _refusal(run, config={"epochs": 0}).endswith(f"; {RESTORE}")


@pytest.mark.parametrize("name", ["model", "dataset"])
def test_a_name_the_checkout_does_not_register_points_to_the_runs_commit(tmp_path, name):
    """MODEL=retired registered by the run's commit and dropped (or renamed) since: no "restore the file",
    which the run did write, but the checkout of that commit, whose registry has the name."""
    run = _run(tmp_path)
    message = _refusal(run, {"git": {"commit": COMMIT, "dirty": False, "source": "git"}}, {name: "retired"})
    assert message.startswith(f"{run / 'config.json'}: {name}='retired' is not valid: one of ")
    assert message.endswith(
        f"; not registered in this checkout, whose code checks the record and the data: if the run's commit {COMMIT} "
        "registers it, run reproduce from a checkout of that commit; else restore the file from a backup"
    )
    from train.reproduce.record import RESTORE

    assert _refusal(run, config={"precision": "float8"}).endswith(f"; {RESTORE}")  # any other setting: as before


def test_a_manifest_field_under_something_that_is_no_object_is_absent(tmp_path):
    run = _run(tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    config = json.loads((run / "config.json").read_text())
    check_record(run, dict(manifest, requirements_lock=None, data=None), config)  # an older or unfinished run
    assert _refusal(run, {"data": ["cd"]}).startswith(f"{run / 'manifest.json'}: data=['cd'] is not a JSON object")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_setting_that_is_not_a_finite_number_is_refused_as_not_a_number(tmp_path, value):
    from train.reproduce.record import RESTORE

    run = _run(tmp_path)
    assert _refusal(run, config={"learning_rate": value}) == (
        f"{run / 'config.json'}: learning_rate={value!r} is not a number; {RESTORE}"
    )


def test_a_setting_missing_from_config_json_leaves_the_others_checked(tmp_path):
    from dataclasses import fields

    from train.config import Settings

    run = _run(tmp_path)
    config = json.loads((run / "config.json").read_text())
    del config[fields(Settings)[0].name]  # an older version's config.json: a setting it did not have
    with pytest.raises(ReproduceRecordError) as info:
        check_record(run, json.loads((run / "manifest.json").read_text()), dict(config, epochs="abc"))
    assert str(info.value).startswith(f"{run / 'config.json'}: epochs='abc' is not a whole number; ")


def _metrics(run: Path, *rows: str) -> Path:
    path = run / "metrics.csv"
    header = path.read_text().splitlines()[0]
    path.write_bytes(("\n".join([header, *rows]) + "\n").encode("utf-8", "surrogateescape"))
    return path


def test_each_refusal_of_a_metrics_row_in_full_with_its_fix(tmp_path):
    from train.reproduce.record import RESTORE

    run = _run(tmp_path)
    m = _metrics(run, "1,0.5,0.5")
    assert _refusal(run) == f"{m}: line 2=3 cells where the header has 9; {RESTORE}"
    _metrics(run, "1,0.5,0.5,0.5,0.5,0.001,abc,10.0,6000.0")
    assert _refusal(run) == f"{m}: line 2, column batch_size='abc' is not a number; {RESTORE}"
    _metrics(run, "0,0.5,0.5,0.5,0.5,0.001,128,10.0,6000.0")
    assert _refusal(run) == f"{m}: line 2, column epoch='0' is not an epoch number (1, 2, ...); {RESTORE}"
    m.unlink()
    os.mkfifo(m)  # a traceback, exit 1
    with pytest.raises(ReproduceError) as info:
        check_record(
            run, json.loads((run / "manifest.json").read_text()), json.loads((run / "config.json").read_text())
        )
    assert (
        str(info.value)
        == f"{m} is unreadable (NotRegularFileError: a named pipe (FIFO), not a regular file); {RESTORE}"
    )


def test_bytes_that_are_not_utf8_in_metrics_csv_are_a_cell_that_is_not_a_number(tmp_path):
    run = _run(tmp_path)
    m = _metrics(run, "1,0.5,\udcff,0.5,0.5,0.001,128,10.0,6000.0")
    assert _refusal(run).startswith(f"{m}: line 2, column accuracy='\ufffd' is not a number; ")


def test_an_empty_metrics_cell_is_left_out_and_the_cells_after_it_are_read(tmp_path):
    from train.reproduce.record import read_metrics

    run = _run(tmp_path)
    m = _metrics(run, "1,0.5,,0.25,0.75,0.001,128,10.0,6000.0", "2,0.4,0.8,,,0.001,128,,")
    assert read_metrics(m) == {
        1: {"epoch": 1.0, "loss": 0.5, "val_loss": 0.25, "val_accuracy": 0.75, "learning_rate": 0.001}
        | {"batch_size": 128.0, "epoch_seconds": 10.0, "samples_per_second": 6000.0},
        2: {"epoch": 2.0, "loss": 0.4, "accuracy": 0.8, "learning_rate": 0.001, "batch_size": 128.0},
    }
