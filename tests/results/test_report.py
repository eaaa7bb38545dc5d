"""report: a self-contained report.html + curves.png, written by the run's hooks without ever failing it."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from builders import labelled_arrays, write_run_records
from helpers import near, screenshot, subprocess_env, tiny_settings

from train import cli
from train.results import report
from train.results.evaluation import Evaluation

pytest.importorskip("matplotlib")
RESUMED = ("2026-11-30 10:05:03 resuming at epoch 3, step 0 (global step 94)",)


@pytest.fixture
def train_log(caplog):
    """The package logger's lines (it does not propagate once a run has set up its handlers)."""
    logger, propagate = logging.getLogger("train"), logging.getLogger("train").propagate
    logger.addHandler(caplog.handler)
    logger.propagate = False  # each line once, whatever an earlier test set up
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.propagate = propagate


def pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_the_quick_report_is_one_self_contained_page(tmp_path):
    run = write_run_records(
        tmp_path / "r1",
        manifest={
            "status": "running",  # the epoch-end refresh
            "resumed_at": ["2026-11-30T10:05:03+00:00"],
            "export": {"max_abs_diff": 0.0, "tolerance": 1e-5},
        },
        log_lines=RESUMED,
    )
    written = report.write_report(run, full=False)
    page = (run / "report.html").read_text()
    assert written.path == run / "report.html" and written.missing == [
        "validation: not computed yet: it comes at the end of the run (REPORT=full), or now with `python -m train report r1`"
    ]
    # Nothing to fetch, nothing to run: every picture is inline, there is no script.
    assert "<script" not in page.lower() and not re.search(r"(?:src|href)=\"(?!data:)", page)
    assert "http" not in page.lower()
    assert pngs(page) == [(run / "curves.png").read_bytes()]
    for text in (
        "r1",
        '<span class="status running">running</span>',
        "best val_accuracy <b>0.9300</b> at epoch 5 after 50.0 s of training",
        "resumed 1x",
        "0123456789abcdef",
        "ab" * 32,
        "sha256 " + "cd" * 32,
        "mixed_bfloat16: CPU has native bfloat16",
        "Python 3.11.7, TensorFlow 2.21.0, Keras 3.15.1",
        "max |diff| 0.00e+00",
        "CPU only",
        "one process",
        "BATCH_SIZE",
        "not computed yet: it comes at the end of the run",
        "12.5 s over 1 segment(s)",
    ):
        assert text in page, text


def test_resume_note_and_image_row_follow_the_records(tmp_path):
    plain = report.render(report.load_records(write_run_records(tmp_path / "a")), b"", "")
    assert "dashed vertical line" not in plain and "none: run from a checkout" in plain
    git = {"commit": "feedbeef", "dirty": None, "source": "/app/BUILD_COMMIT"}
    run = write_run_records(tmp_path / "b", manifest={"git": git}, log_lines=RESUMED)
    page = report.render(report.load_records(run), b"", "")
    assert "dashed vertical line: the run was resumed there" in page
    assert "the project&#x27;s image (no .git inside; commit from BUILD_COMMIT)" in page
    assert "feedbeef from /app/BUILD_COMMIT" in page


def test_values_from_the_records_are_escaped(tmp_path):
    error = "DataError: <b>x</b> & y in caf\udce9"  # a path that is no UTF-8: json.dumps keeps it as \\udce9
    run = write_run_records(tmp_path / "r", manifest={"status": "failed", "error": error})
    page = report.render(report.load_records(run), b"", "")
    assert "DataError: &lt;b&gt;x&lt;/b&gt; &amp; y in caf?" in page and "<b>x</b>" not in page
    assert '<span class="status failed">failed</span>' in page
    # a folder name that is no UTF-8 (copied from another system): was a matplotlib traceback, and unwritable
    odd = report.load_records(write_run_records(tmp_path / os.fsdecode(b"bad\xffname")))
    assert odd.name == "bad\ufffdname" and "bad\ufffdname" in report.render(odd, b"", "").encode("utf-8").decode()


@pytest.mark.parametrize(
    "status, full", [("completed", True), ("failed", True), ("budget", True), ("interrupted", False)]
)
def test_the_end_of_run_report_is_quick_after_a_signal(tmp_path, monkeypatch, status, full):
    calls = []
    monkeypatch.setattr(report, "write_report", lambda run_dir, full: calls.append(full))
    report.write_final_report(write_run_records(tmp_path / "r"), status)
    report.refresh_after_epoch(tmp_path / "r")
    assert calls == [full, False]


@pytest.mark.parametrize("mode, calls_made", [("full", [True, False]), ("quick", [False, False]), ("off", [])])
def test_the_report_setting(tmp_path, monkeypatch, mode, calls_made):
    calls = []
    monkeypatch.setattr(report, "write_report", lambda run_dir, full: calls.append(full))
    report.write_final_report(write_run_records(tmp_path / "r"), "completed", mode)
    report.refresh_after_epoch(tmp_path / "r", mode)
    assert calls == calls_made


def test_a_failing_report_is_a_warning_and_leaves_the_last_one(tmp_path, train_log):
    run = write_run_records(tmp_path / "r")
    report.write_report(run, full=False)
    before = (run / "report.html").read_bytes(), (run / "curves.png").read_bytes()
    (run / "metrics.csv").write_text("epoch,loss\n1,abc\n")
    report.refresh_after_epoch(run)
    report.write_final_report(run, "completed")
    assert ((run / "report.html").read_bytes(), (run / "curves.png").read_bytes()) == before
    warnings = [r.getMessage() for r in train_log.records if "report.html not updated" in r.getMessage()]
    assert len(warnings) == 2 and "RunRecordError" in warnings[0] and "line 2: loss='abc'" in warnings[0]
    assert not list(run.glob("*.tmp-*"))


def test_the_hooks_do_nothing_where_there_is_no_run(tmp_path, train_log):
    report.refresh_after_epoch(tmp_path)
    report.refresh_after_epoch(None)  # a worker that writes no run directory
    report.write_final_report(None, "completed")
    assert not (tmp_path / "report.html").exists() and not train_log.records


def test_report_command_quick_and_its_errors(tmp_path, capsys):
    runs = tmp_path / "runs"
    run = write_run_records(runs / "20261130-000000-abcd")
    assert cli.main(["report", "latest", "--quick", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"wrote {run / 'report.html'} and {run / 'curves.png'}"
    assert out[1] == (
        f"  not included: validation: not computed: `python -m train report 20261130-000000-abcd --runs-dir {runs}` "
        "(without --quick) computes it from the best weights"
    )
    assert cli.main(["report", "nope", "--runs-dir", str(runs)]) == 2
    assert capsys.readouterr().err.startswith("RunNotFound: run 'nope' not found")
    (run / "manifest.json").write_text("{")
    assert cli.main(["report", str(run), "--quick"]) == 4
    err = capsys.readouterr().err
    assert (
        err.startswith(f"RunRecordError: run {run.name}: {run / 'manifest.json'} is unreadable")
        and err.count("\n") == 1
    )


def test_report_of_a_run_in_use_is_refused_naming_the_holder_and_writes_nothing(tmp_path, capsys):
    from train.run.lock import RunLock

    run = write_run_records(tmp_path / "runs" / "20261130-000000-abcd")
    with RunLock(run):  # a fit writing the run: report.html and curves.png are its to write
        assert cli.main(["report", run.name, "--quick", "--runs-dir", str(run.parent)]) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"RunBusyError: run {run.name} is in use by another process (pid ") and err.count("\n") == 1
    assert err.rstrip().endswith("then report again")
    assert not (run / "report.html").exists() and not (run / "curves.png").exists()


def test_settings_and_a_bad_setting_never_import_matplotlib(tmp_path):
    code = (
        "import sys; from train.cli import main; a = main(['settings']); b = main(['--epochs', 'x']);"
        "print(a, b, 'matplotlib' in sys.modules, 'train.results.report' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=subprocess_env()
    )
    assert proc.stdout.splitlines()[-1] == "0 2 False False", proc.stderr[-2000:]


# --- in a real browser -----------------------------------------------------------------------------


def fake_evaluation(classes: int = 10) -> Evaluation:
    rng = np.random.default_rng(0)
    matrix = rng.integers(0, 3, (classes, classes)) + np.diag(rng.integers(40, 60, classes))
    wrong = rng.integers(0, 256, (12, 28, 28, 1), dtype=np.uint8)
    return Evaluation(
        [f"class {i}" for i in range(classes)],
        matrix,
        wrong,
        np.arange(12) % classes,
        (np.arange(12) + 1) % classes,
        np.full(12, 0.9),
    )


@pytest.mark.slow
def test_chromium_renders_the_pictures_at_their_size(tmp_path):
    from train.results import plots

    run = write_run_records(tmp_path / "r", log_lines=RESUMED)
    records = report.load_records(run)
    page = report.render(records, plots.curves_png(records), report.validation_html(fake_evaluation()))
    (run / "report.html").write_text(page)
    img = screenshot(run / "report.html", tmp_path / "shot.png")
    assert img.shape == (2600, 1280, 3) and img.std() > 20  # the whole window, not a blank page
    for colour in (plots.TRAIN, plots.VAL):  # the curves: colours the page's own style never uses
        ys, xs = np.nonzero(near(img, colour))
        assert len(xs) > 500, colour
        # Drawn at the picture's own width (1080 px: loss panel left edge to throughput panel right edge).
        assert xs.max() - xs.min() > 800 and xs.max() < 1280, colour
    assert near(img, "#08306b", 60).sum() > 300  # the confusion matrix's darkest blue: its diagonal


def _evaluated(monkeypatch, ev=None):
    """evaluate_best answers with a made-up evaluation (no data, no TensorFlow); returns the calls."""
    from train.results import evaluation

    calls = []
    monkeypatch.setattr(
        evaluation, "evaluate_best", lambda run_dir, runs_dir=None: calls.append(run_dir) or ev or fake_evaluation()
    )
    return calls


def test_a_quick_report_keeps_the_validation_part_of_the_full_one_while_the_best_weights_are_the_same(
    tmp_path, monkeypatch, capsys
):
    runs = tmp_path / "runs"
    run = write_run_records(runs / "20261130-000000-000001")
    (run / "best.weights.h5").write_bytes(b"weights of epoch 5")
    calls = _evaluated(monkeypatch)
    assert report.write_report(run, full=True).missing == []
    full = (run / "report.html").read_text()
    assert len(pngs(full)) == 3 and "most often taken for" in full
    section = full[full.index("<h2>Validation set") : full.index("<h2>Run</h2>")]
    assert cli.main(["report", run.name, "--quick", "--runs-dir", str(runs)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {run / 'report.html'} and {run / 'curves.png'}"]
    quick = (run / "report.html").read_text()
    assert quick[quick.index("<h2>Validation set") : quick.index("<h2>Run</h2>")] == section and len(calls) == 1
    report.refresh_after_epoch(run)  # the epoch-end hook of a resumed run, before a new best
    assert "most often taken for" in (run / "report.html").read_text()
    (run / "best.weights.h5").write_bytes(b"weights of a new best epoch")  # evaluated weights replaced
    written = report.write_report(run, full=False)
    page = (run / "report.html").read_text()
    assert "most often taken for" not in page and len(pngs(page)) == 1
    assert written.missing == [f"validation: {report.ENDED_NOTE.format(run=run.name)}"]
    from train.errors import DataError
    from train.results import evaluation

    def moved(run_dir, runs_dir=None):
        raise DataError("data/mnist.npz is missing")

    monkeypatch.setattr(evaluation, "evaluate_best", moved)
    assert report.write_report(run, full=True).missing == ["validation: DataError: data/mnist.npz is missing"]
    assert report.write_report(run, full=False).missing == written.missing  # a failure is not kept as a result


def test_a_quick_report_of_a_run_still_going_says_the_validation_part_comes_at_its_end(tmp_path):
    run = write_run_records(tmp_path / "r", manifest={"status": "running"})
    assert report.write_report(run, full=False).missing == [f"validation: {report.CHEAP_NOTE.format(run='r')}"]
    run = write_run_records(tmp_path / "s", manifest={"status": "interrupted"})
    (note,) = report.write_report(run, full=False).missing
    assert "comes at the end" not in note and "python -m train report s` (without --quick)" in note


def test_the_validation_accuracy_names_the_val_accuracy_training_logged_when_they_differ(tmp_path):
    ev = fake_evaluation()  # accuracy: not the 0.9300 training logged at the best epoch
    records = report.load_records(write_run_records(tmp_path / "r"))
    part = report.validation_html(ev, records)
    assert (
        f"training logged val_accuracy 0.9300 for these weights (epoch 5, under mixed_bfloat16); here the same "
        f"{ev.n} examples are predicted again in float32, hence {ev.accuracy:.4f}"
    ) in part
    rows = [dict(r, val_accuracy=ev.accuracy - 0.1 * (5 - r["epoch"])) for r in records.rows]  # best: epoch 5
    same = report.load_records(write_run_records(tmp_path / "s", metrics=rows))
    assert "training logged" not in report.validation_html(ev, same)


def test_class_names_with_tex_make_a_whole_report(tmp_path, monkeypatch):
    names = [r"$\foo$", "$x^2$", r"a_{b}\\", "$", "100% & <b>"]  # mathtext that does not parse
    ev = fake_evaluation(len(names))
    ev.class_names[:] = names
    run = write_run_records(tmp_path / "r")
    (run / "best.weights.h5").write_bytes(b"w")
    _evaluated(monkeypatch, ev)
    assert report.write_report(run, full=True).missing == []
    page = (run / "report.html").read_text()
    assert len(pngs(page)) == 3 and "<td>$\\foo$</td>" in page and "100% &amp; &lt;b&gt;" in page


@pytest.mark.parametrize(
    "monitor, mode, epoch, value, seconds",
    [
        ("val_accuracy", "auto", 3, 0.91, "60.0 s"),
        ("val_accuracy", "max", 3, 0.91, "60.0 s"),
        ("val_loss", "auto", 2, 0.30, "30.0 s"),
        ("val_loss", "min", 2, 0.30, "30.0 s"),
        ("val_loss", "max", 1, 0.60, "10.0 s"),
    ],
)
def test_the_report_and_compare_show_the_best_epoch_not_the_last(tmp_path, monitor, mode, epoch, value, seconds):
    from builders import peaked_metrics

    from train.results import compare, plots

    run = write_run_records(tmp_path / "r", {"monitor": monitor, "monitor_mode": mode}, metrics=peaked_metrics())
    report.write_report(run, full=False)
    page = (run / "report.html").read_text()
    assert f"best {monitor} <b>{value:.4f}</b> at epoch {epoch} after {seconds} of training" in page
    records = report.load_records(run)
    axes = {ax.get_title(): ax for ax in plots.curves_figure(records).axes}
    (star,) = [line for ax in axes.values() for line in ax.lines if line.get_label() == f"best {monitor}"]
    assert (list(star.get_xdata()), list(star.get_ydata())) == ([epoch], [value])
    rows = dict(compare.metric_rows([records, records]))
    assert rows["best"] == [f"{monitor}={value:.4f}"] * 2 and rows["best at epoch"] == [str(epoch)] * 2
    assert rows["time to best"] == [seconds.replace(" ", "")] * 2


def test_time_to_best_in_the_report_and_compare_includes_the_stopped_segment(tmp_path):
    from builders import peaked_metrics

    from train.results import compare

    segments = [
        {
            "status": "interrupted",
            "epoch_from": 0,
            "seconds": 30.0,
            "unfinished_epoch": {"epoch": 2, "train_seconds": 7.5},
        },
        {"status": "completed", "epoch_from": 1, "resumed_from": "ckpt-000000009.npz (epoch 1, step 4)"},
    ]
    run = write_run_records(tmp_path / "r", manifest={"segments": segments}, metrics=peaked_metrics())
    page = report.render(report.load_records(run), b"", "")
    assert "best val_accuracy <b>0.9100</b> at epoch 3 after 67.5 s of training" in page  # 60 + 7.5 s
    assert "<td>training time (every segment, no validation)</td><td>2.6 min</td>" in page  # 150 + 7.5 s
    rows = dict(compare.metric_rows([report.load_records(run)] * 2))
    assert rows["time to best"] == ["67.5s"] * 2


# --- wired into a real run -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_refreshes_its_report_each_epoch_and_writes_it_whole_at_the_end(tmp_path, monkeypatch, make_npz):
    from train import train

    calls, write = [], report.write_report
    monkeypatch.setattr(report, "write_report", lambda run_dir, full: calls.append(full) or write(run_dir, full))
    # Every fourth training label wrong: the validation split holds mistakes for the most-wrong grid.
    y = labelled_arrays(n_train=600, n_test=200, classes=10)["y_train"]
    y[::4] = (y[::4] + 1) % 10
    npz = make_npz(n_train=600, n_test=200, y_train=y)
    settings = tiny_settings(tmp_path, dataset=f"npz:{npz}", export=False, report="full")
    result = train(settings)
    assert result.status == "completed" and calls == [False, False, True]
    page = (result.run_dir / "report.html").read_text()
    pictures = pngs(page)
    assert len(pictures) == 3 and pictures[0] == (result.run_dir / "curves.png").read_bytes()
    wrong = len(re.findall(r"<h3>The (\d+) most wrong", page))
    n_val = json.loads((result.run_dir / "manifest.json").read_text())["data"]["n_val"]  # VAL_SPLIT of the 600
    assert wrong == 1 and f"on {n_val} validation examples" in page and "most often taken for" in page
    accuracy = float(re.search(rf"accuracy <b>([\d.]+)%</b> on {n_val}", page).group(1)) / 100
    assert accuracy == pytest.approx(max(r["val_accuracy"] for r in result.history), abs=1e-4)


@pytest.mark.slow
def test_a_report_that_cannot_be_drawn_never_changes_the_run(tmp_path, monkeypatch):
    from train import train
    from train.results import plots

    monkeypatch.setattr(plots, "curves_png", lambda records: 1 / 0)
    result = train(tiny_settings(tmp_path, epochs=1, export=False, report="full"))
    assert result.status == "completed" and not (result.run_dir / "report.html").exists()
    log = (result.run_dir / "train.log").read_text()
    assert log.count("WARNING: report.html not updated: ZeroDivisionError") == 2  # the epoch end and the end
    assert json.loads((result.run_dir / "manifest.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_a_failed_run_gets_a_report_that_says_why(tmp_path, monkeypatch):
    from train import models, train
    from train.errors import DataError

    def broken(*args):
        raise DataError("broken <on purpose>")

    monkeypatch.setattr(models, "build_model", broken)
    with pytest.raises(DataError, match="broken <on purpose>"):
        train(tiny_settings(tmp_path, report="full"))
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]  # .cache holds the measured peak
    page = (run / "report.html").read_text()
    assert '<span class="status failed">failed</span>' in page and "DataError: broken &lt;on purpose&gt;" in page
    assert "not available: NoWeightsError:" in page and "best.weights.h5 is missing" in page
    assert len(pngs(page)) == 1  # the curves (empty: no epoch finished)


# --- each row and part, exactly ----------------------------------------------------------------------


def test_the_run_table_of_a_manifest_that_records_nothing_says_so_in_every_row():
    from pathlib import Path

    from train.results.run_records import RunRecords

    assert report.summary_rows(RunRecords(Path("r"), {}, {})) == [
        ("status", "unknown"),
        ("ended because", "-"),
        ("started / ended", "- / -"),
        ("resumed", "never"),
        ("duration", "- over 1 segment(s)"),
        ("training time (every segment, no validation)", "-"),
        ("versions", "Python ?, TensorFlow ?, Keras ?"),
        ("image", "none: run from a checkout"),
        ("commit", "unknown"),
        ("lock", "? sha256 unknown"),
        ("data", "? from ?: ? train / ? val, 0 classes"),
        ("test split (evaluated once, at the end)", "-"),
        ("data fingerprint", "sha256 unknown"),
        ("precision", "?: ?"),
        ("devices", "CPU only"),
        ("cluster", "one process"),
        ("host", "? (?)"),
        ("seed", "?, deterministic ops: None"),
        ("export parity", "not exported"),
    ]


def test_the_run_table_of_a_manifest_edited_into_other_types_says_unknown_where_it_must():
    from pathlib import Path

    from train.results.run_records import RunRecords

    odd = {"precision": 5, "git": "abc", "data": [1], "export": 0.5, "build_info": None, "gpus": ["A100"]}
    rows = dict(report.summary_rows(RunRecords(Path("r"), odd, {})))
    assert (rows["precision"], rows["commit"], rows["devices"]) == ("?: ?", "unknown", "CPU only")


def test_the_run_table_of_a_full_manifest_shows_each_record_escaped():
    from pathlib import Path

    from train.results.run_records import RunRecords

    manifest = {
        "status": "failed",
        "error": "DataError: <x>",
        "ended_because": "early stopping",  # the error is why it ended
        "started_at": "2026-01-01T00:00:00",
        "ended_at": "2026-01-01T01:00:00",
        "resumed_at": ["a", "b"],
        "duration_seconds": 120,
        "segments": [{}, {}],
        "python": "3.11",
        "tensorflow": "2.21",
        "keras": "3.15",
        "build_info": {"cuda_version": "12.5", "cudnn_version": "9", "cpu_compiler": "clang"},
        "image": "img:tag",
        "git": {"commit": "abc", "dirty": True, "source": "/app/BUILD_COMMIT"},
        "requirements_lock": {"file": "/app/requirements/cpu.lock", "sha256": "ff"},
        "data": {
            "dataset": "mnist",
            "source": "d.npz",
            "n_train": 6,
            "n_val": 2,
            "n_test": 3,
            "val_from": "train",
            "fingerprint": "ee",
            "class_names": ["a", "b"],
        },
        "precision": {"policy": "float32", "reason": "no"},
        "gpus": [{"name": "T4", "memory_total_mb": 15000}, {"name": None}, {"name": "A100"}],
        "cluster": {"worker": ["h:1"], "chief": ["c:2"]},
        "host": "h",
        "platform": "linux",
        "seed": 7,
        "export": {"max_abs_diff": 1.5e-7, "tolerance": 1e-5},
        "test": {
            "examples": 3,
            "weights": {
                "best": {"epoch": 1, "loss": 0.25, "accuracy": 2 / 3},
                "final": {"epoch": 2, "loss": 0.5, "accuracy": 1 / 3},
            },
        },
    }
    records = RunRecords(Path("r"), {"deterministic": True}, manifest, [{"epoch": 1.0, "epoch_seconds": 300.0}])
    assert report.summary_rows(records) == [
        ("status", "failed: DataError: &lt;x&gt;"),
        ("ended because", "DataError: &lt;x&gt;"),
        ("started / ended", "2026-01-01T00:00:00 / 2026-01-01T01:00:00"),
        ("resumed", "a, b"),
        ("duration", "2.0 min over 2 segment(s)"),
        ("training time (every segment, no validation)", "5.0 min"),
        ("versions", "Python 3.11, TensorFlow 2.21, Keras 3.15; built for cuda 12.5, cudnn 9"),
        ("image", "img:tag"),
        ("commit", "abc (uncommitted changes) from /app/BUILD_COMMIT"),
        ("lock", "requirements/cpu.lock sha256 ff"),
        ("data", "mnist from d.npz: 6 train / 2 val (from the training split) / 3 test, 2 classes"),
        (
            "test split (evaluated once, at the end)",
            "accuracy=0.6667 loss=0.2500 (best weights, epoch 1); accuracy=0.3333 loss=0.5000 (final weights, epoch 2)",
        ),
        ("data fingerprint", "sha256 ee"),
        ("precision", "float32: no"),
        ("devices", "T4 (15000 MB); A100 (? MB)"),
        ("cluster", "{&quot;chief&quot;: [&quot;c:2&quot;], &quot;worker&quot;: [&quot;h:1&quot;]}"),
        ("host", "h (linux)"),
        ("seed", "7, deterministic ops: True"),
        ("export parity", "max |diff| 1.50e-07 (tolerance 1e-05)"),
    ]
    # Without an error: why the latest segment ended; an image built from a commit file; a git checkout.
    manifest.update(
        error=None, segments=[{"ended_because": "old"}, {"ended_because": "all epochs"}], image=None, gpus=None
    )
    manifest["git"] = {"commit": None, "source": "/app/BUILD_COMMIT"}
    rows = dict(report.summary_rows(records))
    assert rows["status"] == "failed" and rows["ended because"] == "all epochs" and rows["devices"] == "CPU only"
    assert rows["image"] == "the project&#x27;s image (no .git inside; commit from BUILD_COMMIT)"
    assert rows["commit"] == "unknown from /app/BUILD_COMMIT"
    manifest["git"] = {"commit": "abc", "dirty": False, "source": "git"}
    assert dict(report.summary_rows(records))["commit"] == "abc"


def _page_lines(page: str) -> list[str]:
    """The page's lines without its style sheet, the time it was written as a placeholder."""
    head, _, rest = page.partition("<style>")
    rest = rest.partition("</style>")[2]
    stamp = r"report written \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 from"
    return re.sub(stamp, "report written WHEN from", head + "<style></style>" + rest).splitlines()


def test_the_page_holds_each_part_of_the_records_in_its_place():
    from pathlib import Path

    from train.results.run_records import RunRecords

    rows = [{"epoch": 1.0, "val_accuracy": 0.8, "epoch_seconds": 10.0, "loss": None}]
    rows.append({"epoch": 2.0, "val_accuracy": 0.9, "epoch_seconds": 10.0, "loss": None})
    config = {"model": "cnn", "dataset": "mnist", "epochs": 3, "zeta": "<v>"}
    records = RunRecords(Path("r<1>"), config, {"ended_because": "early stopping"}, rows)
    lines = _page_lines(report.render(records, b"png", "<p>VAL</p>"))
    run_table = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in report.summary_rows(records))
    assert lines == [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>r&lt;1&gt;: unknown</title>',
        "<style></style></head><body>",
        '<h1>r&lt;1&gt; <span class="status unknown">unknown</span></h1>',
        '<p class="lead">model <b>cnn</b> on <b>mnist</b> &middot; 2 of 3 epochs &middot; best val_accuracy '
        "<b>0.9000</b> at epoch 2 after 20.0 s of training &middot; ended: early stopping</p>",
        '<p class="note">report written WHEN from the run directory; curves.png holds the same curves.</p>',
        "<h2>Curves</h2>",
        '<img alt="loss, accuracy, learning rate and throughput per epoch" src="data:image/png;base64,cG5n">',
        '<p class="note">star: the best val_accuracy (the weights in best.weights.h5).</p>',
        "<h2>Validation set, best weights</h2>",
        "<p>VAL</p>",
        "<h2>Run</h2>",
        f"<table>{run_table}</table>",
        "<h2>Settings</h2>",
        "<details><summary>config.json (4 settings)</summary><table><tr><td>DATASET</td><td>mnist</td></tr>"
        "<tr><td>EPOCHS</td><td>3</td></tr><tr><td>MODEL</td><td>cnn</td></tr><tr><td>ZETA</td><td>&lt;v&gt;</td></tr>"
        "</table></details>",
        "<h2>Epochs</h2>",
        "<details open><summary>metrics.csv (2 rows)</summary><table><tr><th>epoch</th><th>val_accuracy</th>"
        '<th>epoch_seconds</th></tr><tr><td class="num">1</td><td class="num">0.8000</td><td class="num">10</td></tr>'
        '<tr><td class="num">2</td><td class="num">0.9000</td><td class="num">10</td></tr></table></details>',
        "</body></html>",
    ]


def test_the_page_of_a_failed_resumed_run_leads_with_its_error_not_why_its_segment_ended():
    from pathlib import Path

    from train.results.run_records import Resume, RunRecords

    manifest = {"status": "failed", "error": "E: <x>", "ended_because": "early stopping"}
    records = RunRecords(Path("r"), {"epochs": 2}, manifest, [{"epoch": 1.0, "loss": 1e9}], [Resume(2, 5, "t")])
    lines = _page_lines(report.render(records, b"", ""))
    assert lines[3:5] == [
        '<h1>r <span class="status failed">failed</span></h1>',
        '<p class="lead">model <b>None</b> on <b>None</b> &middot; 1 of 2 epochs &middot; resumed 1x</p>'
        '<p class="error">E: &lt;x&gt;</p>',
    ]
    assert lines[8] == (
        '<p class="note">dashed vertical line: the run was resumed there; star: the best val_accuracy '
        "(the weights in best.weights.h5).</p>"
    )
    assert lines[-2] == (
        "<details open><summary>metrics.csv (1 rows)</summary><table><tr><th>epoch</th><th>loss</th></tr>"
        '<tr><td class="num">1</td><td class="num">1000000000.0000</td></tr></table></details>'
    )
    manifest.update(error=None, ended_because=None)  # neither: the lead says nothing of an end
    assert _page_lines(report.render(records, b"", ""))[4] == (
        '<p class="lead">model <b>None</b> on <b>None</b> &middot; 1 of 2 epochs &middot; resumed 1x</p>'
    )


def test_the_validation_part_shows_each_class_and_the_pictures_of_this_evaluation():
    from train.results import plots

    ev = Evaluation(
        ["a", "b<", "c"],
        np.array([[3, 2, 0], [0, 2, 0], [0, 0, 0]]),  # c: no example
        np.stack([np.zeros((4, 4, 1), np.uint8), np.full((4, 4, 1), 200, np.uint8)]),
        np.array([0, 0]),
        np.array([1, 2]),
        np.array([0.8, 0.6]),
    )
    part = report.validation_html(ev)
    table = (
        "<table><tr><th>class</th><th>examples</th><th>correct</th><th>accuracy</th><th>most often taken for</th></tr>"
        '<tr><td>a</td><td class="num">5</td><td class="num">3</td><td class="num">60.00%</td><td>b&lt; (2x)</td></tr>'
        '<tr><td>b&lt;</td><td class="num">2</td><td class="num">2</td><td class="num">100.00%</td><td>-</td></tr>'
        '<tr><td>c</td><td class="num">0</td><td class="num">0</td><td class="num">-</td><td>-</td></tr></table>'
    )
    assert re.sub(r'base64,[^"]+"', 'base64,PNG"', part).splitlines() == [
        '<p class="lead">accuracy <b>71.43%</b> on 7 validation examples</p>',
        '<img alt="confusion matrix and per-class accuracy" src="data:image/png;base64,PNG">',
        table,
        "<h3>The 2 most wrong (least probability on the true class)</h3>",
        '<img alt="validation images the model gets most wrong, with true and predicted class" '
        'src="data:image/png;base64,PNG">',
    ]
    grid = plots.grid_png(ev.wrong_images, ev.wrong_true, ev.wrong_pred, ev.wrong_prob, ev.class_names)
    assert pngs(part) == [plots.confusion_png(ev.matrix, ev.class_names), grid]
    right = Evaluation(["a"], np.array([[2]]), np.zeros((0, 4, 4, 1), np.uint8), *[np.array([])] * 3)
    assert report.validation_html(right).splitlines()[3:] == [
        '<p class="note">no validation image is misclassified</p>'
    ]


def test_the_accuracy_differs_from_the_logged_one_from_a_difference_of_5e_5(tmp_path):
    none_right = Evaluation(
        ["a", "b"], np.array([[0, 1], [0, 0]]), np.zeros((0, 4, 4, 1), np.uint8), *[np.array([])] * 3
    )
    rows = [{"epoch": 1, "val_accuracy": 5e-5}]
    records = report.load_records(write_run_records(tmp_path / "r", manifest={"precision": None}, metrics=rows))
    assert report.measured_differently(none_right, records) == (
        "training logged val_accuracy 0.0001 for these weights (epoch 1, under its precision policy); "
        "here the same 1 examples are predicted again in float32, hence 0.0000"
    )
    assert report.measured_differently(none_right, None) is None  # `report` of a run without records


def test_why_a_run_ended_is_its_latest_segment_s_reason_or_else_the_manifest_s():
    segments = [{"ended_because": "a stop"}, {"ended_because": "a stop again"}, {"ended_because": "all epochs"}]
    assert report.ended_because({"segments": segments, "ended_because": "old"}) == "all epochs"
    for segments in (None, [], ["not a segment"]):
        assert report.ended_because({"segments": segments, "ended_because": "early stopping"}) == "early stopping"


def test_the_warning_for_a_report_not_written_is_one_line_naming_the_error(tmp_path, train_log):
    run = write_run_records(tmp_path / "r")
    (run / "metrics.csv").write_text("epoch,loss\n1,abc\n")
    report.refresh_after_epoch(run)
    (line,) = [r.getMessage() for r in train_log.records]
    assert line.startswith("WARNING: report.html not updated: RunRecordError: ") and "\n" not in line


def test_the_full_report_evaluates_this_run_and_says_why_when_it_cannot(tmp_path, monkeypatch):
    from train.errors import DataError
    from train.results import evaluation

    run = write_run_records(tmp_path / "r")
    (run / "best.weights.h5").write_bytes(b"weights of epoch 5")
    calls = _evaluated(monkeypatch)  # an accuracy other than the 0.9300 training logged
    report.write_report(run, full=True)
    assert (
        calls == [run] and "training logged val_accuracy 0.9300 for these weights" in (run / "report.html").read_text()
    )

    def moved(run_dir, runs_dir=None):
        raise DataError("data/mnist.npz is missing")

    monkeypatch.setattr(evaluation, "evaluate_best", moved)
    written = report.write_report(run, full=True)  # the part computed before for these weights is not lost
    assert written.missing == [
        "validation: DataError: data/mnist.npz is missing (the validation part computed before for the same best "
        "weights is kept)"
    ]
    assert "training logged val_accuracy 0.9300 for these weights" in (run / "report.html").read_text()
    (run / "best.weights.h5").write_bytes(b"weights of a new best epoch")  # nothing computed for these yet
    report.write_report(run, full=True)
    assert (
        '<p class="note">not available: DataError: data/mnist.npz is missing</p>' in (run / "report.html").read_text()
    )


def test_a_report_is_full_unless_asked_otherwise(tmp_path, monkeypatch):
    run = write_run_records(tmp_path / "r")
    calls = _evaluated(monkeypatch)
    assert report.write_report(run).missing == [] and calls == [run]


def test_the_epochs_part_of_a_run_with_no_epoch_yet_says_so():
    from pathlib import Path

    from train.results.run_records import RunRecords

    lines = _page_lines(report.render(RunRecords(Path("r"), {}, {}), b"", ""))
    assert lines[-2] == (
        '<details open><summary>metrics.csv (0 rows)</summary><p class="note">no epoch finished yet</p></details>'
    )


def test_an_empty_cell_stays_empty_and_a_whole_number_is_written_whole():
    from pathlib import Path

    from train.results.run_records import RunRecords

    rows = [{"epoch": 1.0, "samples_per_second": 12345.0}, {"epoch": 2.0, "samples_per_second": None}]
    lines = _page_lines(report.render(RunRecords(Path("r"), {}, {}, rows), b"", ""))
    assert lines[-2].endswith(
        '<tr><td class="num">1</td><td class="num">12345</td></tr>'
        '<tr><td class="num">2</td><td class="num"></td></tr></table></details>'
    )


DATA_VERSION = {
    "tool": "dvc",
    "repository": "/data/repo",
    "git_remote": "https://***@git.example.com/data.git",
    "commit": "c7d0a16b0065abef66d223d814ca8da07a11971a",
    "path": "images",
    "read": "",
    "setting": "DATASET",
    "dvc_file": "images.dvc",
    "stage": None,
    "hash": "166b92740753f996441b137e01544e50.dir",
    "remote": "store",
    "remote_url": "s3://bucket/dvc",
    "dvc_file_committed": True,
    "workspace": "matches",
    "warning": None,
}


def test_a_data_version_is_a_row_only_when_the_run_recorded_one(tmp_path):
    from builders import write_run_records

    plain = report.render(report.load_records(write_run_records(tmp_path / "a")), b"", "")
    assert "data version" not in plain
    data = {"dataset": "images", "fingerprint": "cd" * 32, "version": DATA_VERSION}
    page = report.render(report.load_records(write_run_records(tmp_path / "b", manifest={"data": data})), b"", "")
    assert "data version" in page
    assert "dvc: images at commit c7d0a16b0065 of https://***@git.example.com/data.git" in page
    assert "images.dvc, md5 166b92740753..., remote s3://bucket/dvc" in page
