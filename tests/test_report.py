"""report: a self-contained report.html + curves.png, written by the run's hooks without ever failing it."""

from __future__ import annotations

import base64
import json
import logging
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import subprocess_env, tiny_settings, write_run_records

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
    run = write_run_records(tmp_path / "r", manifest={"status": "failed", "error": "DataError: <b>x</b> & y"})
    page = report.render(report.load_records(run), b"", "")
    assert "DataError: &lt;b&gt;x&lt;/b&gt; &amp; y" in page and "<b>x</b>" not in page
    assert '<span class="status failed">failed</span>' in page


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
        "  not included: validation: not computed: `python -m train report 20261130-000000-abcd` (without --quick) "
        "computes it from the best weights"
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


def screenshot(page, out, size=(1280, 2600)):
    from PIL import Image

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); CI installs it")
    profile = out.parent / "chromium-profile"
    profile.mkdir()
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--screenshot={out}",
            f"--window-size={size[0]},{size[1]}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.is_file(), proc.stderr[-3000:]
    return np.asarray(Image.open(out).convert("RGB")).astype(int)


def near(img, colour: str, tol: int = 40):
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return np.abs(img - rgb).sum(axis=2) < tol


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
    monkeypatch.setattr(evaluation, "evaluate_best", lambda run_dir: calls.append(run_dir) or ev or fake_evaluation())
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

    def moved(run_dir):
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
    from helpers import peaked_metrics

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
    from helpers import peaked_metrics

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
    from train.training.fit import train

    calls, write = [], report.write_report
    monkeypatch.setattr(report, "write_report", lambda run_dir, full: calls.append(full) or write(run_dir, full))
    # Ten overlapping classes: two epochs leave mistakes for the most-wrong grid.
    settings = tiny_settings(tmp_path, dataset=f"npz:{make_npz(n_train=600, n_test=200)}", export=False)
    result = train(settings)
    assert result.status == "completed" and calls == [False, False, True]
    page = (result.run_dir / "report.html").read_text()
    pictures = pngs(page)
    assert len(pictures) == 3 and pictures[0] == (result.run_dir / "curves.png").read_bytes()
    wrong = len(re.findall(r"<h3>The (\d+) most wrong", page))
    assert wrong == 1 and "on 200 validation examples" in page and "most often taken for" in page
    accuracy = float(re.search(r"accuracy <b>([\d.]+)%</b> on 200", page).group(1)) / 100
    assert accuracy == pytest.approx(max(r["val_accuracy"] for r in result.history), abs=1e-4)


@pytest.mark.slow
def test_a_report_that_cannot_be_drawn_never_changes_the_run(tmp_path, monkeypatch):
    from train.results import plots
    from train.training.fit import train

    monkeypatch.setattr(plots, "curves_png", lambda records: 1 / 0)
    result = train(tiny_settings(tmp_path, epochs=1, export=False))
    assert result.status == "completed" and not (result.run_dir / "report.html").exists()
    log = (result.run_dir / "train.log").read_text()
    assert log.count("WARNING: report.html not updated: ZeroDivisionError") == 2  # the epoch end and the end
    assert json.loads((result.run_dir / "manifest.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_a_failed_run_gets_a_report_that_says_why(tmp_path, monkeypatch):
    from train import models
    from train.errors import DataError
    from train.training.fit import train

    def broken(*args):
        raise DataError("broken <on purpose>")

    monkeypatch.setattr(models, "build_model", broken)
    with pytest.raises(DataError, match="broken <on purpose>"):
        train(tiny_settings(tmp_path))
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]  # .cache holds the measured peak
    page = (run / "report.html").read_text()
    assert '<span class="status failed">failed</span>' in page and "DataError: broken &lt;on purpose&gt;" in page
    assert "not available: NoWeightsError:" in page and "best.weights.h5 is missing" in page
    assert len(pngs(page)) == 1  # the curves (empty: no epoch finished)
