"""compare: settings that differ, metrics side by side, time to best, overlaid curves; one-line errors."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest
from builders import write_run_records

from train import cli
from train.results import compare
from train.results.run_records import load_records

pytest.importorskip("matplotlib")


def rows(lr: float, accuracies: list[float], seconds: float = 10.0) -> list[dict]:
    return [
        {
            "epoch": e,
            "loss": 1.0 - a,
            "accuracy": a,
            "val_loss": 1.1 - a,
            "val_accuracy": a,
            "learning_rate": lr,
            "epoch_seconds": seconds,
        }
        for e, a in enumerate(accuracies, start=1)
    ]


@pytest.fixture
def runs(tmp_path):
    """Two runs under tmp_path/runs: B has another learning rate, peaks earlier and was resumed once."""
    root = tmp_path / "runs"
    write_run_records(
        root / "20261130-100000-aaaa",
        {"learning_rate": 0.001, "epochs": 3, "progress": "bar"},
        metrics=rows(0.001, [0.80, 0.90, 0.95]),
    )
    write_run_records(
        root / "20261130-110000-bbbb",
        {"learning_rate": 0.01, "epochs": 3, "progress": "line"},
        manifest={"status": "interrupted"},
        metrics=rows(0.01, [0.85, 0.93, 0.91], seconds=7.5),
        log_lines=("2026-11-30 11:05:00 resuming at epoch 2, step 3 (global step 50)",),
    )
    return root


def test_the_text_names_what_differs_and_what_it_did(runs, capsys):
    assert cli.main(["compare", "20261130-100000-aaaa", "20261130-110000-bbbb", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    lines = [re.sub(r"\s+", " ", line).strip() for line in out.splitlines()]
    assert "settings that differ 20261130-100000-aaaa 20261130-110000-bbbb" in lines
    assert "LEARNING_RATE 0.001 0.01" in lines
    assert not any(line.startswith(("PROGRESS", "EPOCHS", "BATCH_SIZE")) for line in lines)  # same, or noise
    for expected in (
        "status completed interrupted",
        "epochs 3/3 3/3",
        "final val_accuracy 0.9500 0.9100",
        "best val_accuracy=0.9500 val_accuracy=0.9300",
        "best at epoch 3 2",
        "time to best 30.0s 15.0s",
        "training time 30.0s 22.5s",
        "resumed 0x 1x",
    ):
        assert expected in lines, expected


def test_identical_settings_say_none(tmp_path):
    a = load_records(write_run_records(tmp_path / "a"))
    b = load_records(write_run_records(tmp_path / "b"))
    assert compare.differing_settings([a, b]) == []
    assert "(none)" in compare.format_comparison([a, b])


def test_the_runs_own_names_are_the_columns_not_a_setting_that_differs(tmp_path):
    a = load_records(write_run_records(tmp_path / "a", {"run_name": "baseline"}))
    b = load_records(write_run_records(tmp_path / "b", {"run_name": "wider"}))
    assert compare.differing_settings([a, b]) == []
    # Two runs of one name (another folder's, named by its path): the shortest ends of their paths tell them apart.
    elsewhere = write_run_records(tmp_path / "home" / "a")
    text = compare.compare_runs(tmp_path, ["a", str(elsewhere)])
    assert text.splitlines()[0].split() == ["settings", "that", "differ", f"{tmp_path.name}/a", "home/a"]


def test_precision_auto_compares_as_the_policy_it_chose(tmp_path):
    """A `reproduce` rerun pins what auto chose: the same training, so no row; another choice is one."""
    auto = load_records(write_run_records(tmp_path / "a", {"precision": "auto"}))
    pinned = load_records(write_run_records(tmp_path / "b", {"precision": "mixed_bfloat16"}))
    assert compare.differing_settings([auto, pinned]) == []
    other = load_records(write_run_records(tmp_path / "c", {"precision": "float32"}))
    assert compare.differing_settings([auto, other]) == [("PRECISION", ["mixed_bfloat16 (auto)", "float32"])]


def test_a_setting_that_did_nothing_in_a_run_is_shown_as_not_used(tmp_path):
    """IMAGE_SIZE and CACHE between two MNIST runs, DATA_DIR between two image-folder runs: no difference;
    beside a run it acted in, the cell says it did nothing."""
    mnist = [
        load_records(
            write_run_records(tmp_path / n, {"dataset": "mnist", "image_size": size, "channels": 1, "cache": cache})
        )
        for n, size, cache in (("a", 64, "memory"), ("b", 32, "file"))
    ]
    assert compare.differing_settings(mnist) == []
    # One mnist.npz read from two places (a `reproduce` rerun records the clone's absolute DATA_DIR): no row;
    # other data there is one.
    here, moved = (write_run_records(tmp_path / n, {"data_dir": d}) for n, d in (("f", "./data"), ("g", "/clone/data")))
    assert compare.differing_settings([load_records(here), load_records(moved)]) == []
    other = write_run_records(tmp_path / "h", {"data_dir": "/other"}, manifest={"data": {"fingerprint": "ef" * 32}})
    assert compare.differing_settings([load_records(here), load_records(other)]) == [("DATA_DIR", ["./data", "/other"])]
    folders = [
        load_records(write_run_records(tmp_path / n, {"dataset": f"images:{tmp_path}", "data_dir": d}))
        for n, d in (("c", "./data"), ("d", "/elsewhere"))
    ]
    assert compare.differing_settings(folders) == []
    npz = load_records(
        write_run_records(tmp_path / "e", {"dataset": f"npz:{tmp_path}/x.npz", "data_dir": "/elsewhere"})
    )
    assert dict(compare.differing_settings([mnist[0], folders[1], npz])) == {
        "CACHE": ["(not used)", "memory", "(not used)"],
        "CHANNELS": ["(not used)", "3", "(not used)"],
        "DATASET": ["mnist", f"images:{tmp_path}", f"npz:{tmp_path}/x.npz"],
        "DATA_DIR": ["./data", "(not used)", "(not used)"],
        "IMAGE_SIZE": ["(not used)", "64", "(not used)"],
    }


def test_epochs_of_a_smoke_run_is_not_used(tmp_path):
    """A smoke run trains one epoch whatever EPOCHS says: two of them differ in nothing, and beside a run
    of one real epoch its EPOCHS reads as doing nothing rather than as 3 against 1."""
    smoke = [
        load_records(write_run_records(tmp_path / n, {"smoke": True, "epochs": e})) for n, e in (("a", 3), ("b", 5))
    ]
    assert compare.differing_settings(smoke) == []
    one = load_records(write_run_records(tmp_path / "c", {"smoke": False, "epochs": 1}))
    assert dict(compare.differing_settings([smoke[0], one])) == {
        "EPOCHS": ["(not used)", "1"],
        "SMOKE": ["true", "false"],
    }


def test_out_png_is_the_overlaid_curves(runs, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "cmp.png"
    assert cli.main(["compare", *map(str, sorted(runs.iterdir())), "--out", str(out)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"wrote {out}")
    img = np.asarray(Image.open(out).convert("RGB"))
    assert img.shape == (432, 1350, 3) and img.std() > 10


def test_out_html_is_a_self_contained_page(runs, tmp_path):
    out = tmp_path / "cmp.html"
    assert (
        cli.main(
            ["compare", "20261130-100000-aaaa", "20261130-110000-bbbb", "--runs-dir", str(runs), "--out", str(out)]
        )
        == 0
    )
    page = out.read_text()
    assert "<script" not in page and "http" not in page
    (png,) = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(png)[:4] == b"\x89PNG"
    assert "<td>LEARNING_RATE</td><td>0.001</td><td>0.01</td>" in page
    assert "<td>time to best</td><td>30.0s</td><td>15.0s</td>" in page


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["20261130-100000-aaaa", "nope"], 2, "RunNotFound: run 'nope' not found"),
        (
            ["20261130-100000-aaaa"],
            2,
            "ConfigError: RUN='20261130-100000-aaaa' is not valid: compare needs two or more runs",
        ),
        (
            ["20261130-100000-aaaa", "latest", "20261130-110000-bbbb"],
            2,
            "ConfigError: RUN='20261130-110000-bbbb' is not valid: names the same run as 'latest'",
        ),
        (
            ["20261130-100000-aaaa", "20261130-110000-bbbb", "--out", "x.pdf"],
            2,
            "ConfigError: --out='x.pdf' is not valid: must end in .png",
        ),
        (
            ["20261130-100000-aaaa", "20261130-110000-bbbb", "--out", "no/such/dir/x.png"],
            2,
            "ConfigError: --out='no/such/dir/x.png' is not valid: the directory no/such/dir does not exist",
        ),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(runs, capsys, argv, code, message):
    assert cli.main(["compare", *argv, "--runs-dir", str(runs)]) == code
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


@pytest.mark.parametrize(
    "name, content", [("metrics.csv", "epoch,loss\n1,x\n"), ("config.json", "{"), ("manifest.json", "null")]
)
def test_an_unreadable_record_is_exit_4_and_writes_nothing(runs, tmp_path, capsys, name, content):
    run = runs / "20261130-110000-bbbb"
    (run / name).write_text(content)
    out = tmp_path / "cmp.png"
    argv = ["compare", "20261130-100000-aaaa", str(run), "--runs-dir", str(runs), "--out", str(out)]
    assert cli.main(argv) == 4
    err = capsys.readouterr().err
    assert err.startswith("RunRecordError: ") and str(run / name) in err and err.count("\n") == 1
    assert not out.exists()


def test_the_overlay_marks_each_runs_best_at_its_training_time(runs):
    from train.results import plots

    fig = plots.compare_figure([load_records(p) for p in sorted(runs.iterdir())])
    loss, accuracy, by_time = fig.axes
    stars = [(list(line.get_xdata()), list(line.get_ydata())) for line in by_time.lines if line.get_marker() == "*"]
    assert stars == [([30.0], [0.95]), ([15.0], [0.93])]
    assert [line.get_label() for line in accuracy.lines if not line.get_label().startswith("_")] == [
        "20261130-100000-aaaa",
        "20261130-110000-bbbb",
    ]
    assert [line.get_linestyle() for line in loss.lines] == ["-", "--", "-", "--"]  # validation, train per run


@pytest.mark.parametrize(
    "out, problem",
    [
        ("A/report.html", "report.html is a name run A writes itself"),
        ("A/curves.png", "curves.png is a name run A writes itself"),
        ("A/checkpoints/new.png", "checkpoints is a name run A writes itself"),
        ("A/export/new.html", "export is a name run A writes itself"),
        ("A/notes.html", "RUNS/A/notes.html already exists inside run A"),
        ("A/../A-name/./report.html", "report.html is a name run A writes itself"),
        ("link.html", "report.html is a name run A writes itself"),  # a link to the run's report
    ],
)
def test_out_never_overwrites_a_file_of_a_run(runs, tmp_path, capsys, out, problem):
    a, b = "20261130-100000-aaaa", "20261130-110000-bbbb"
    run = runs / a
    for name, text in (("report.html", "the run's report"), ("curves.png", "its curves"), ("notes.html", "mine")):
        (run / name).write_text(text)
    (run / "export").mkdir()
    (run / "checkpoints").mkdir()
    (tmp_path / "link.html").symlink_to(run / "report.html")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    target = str(tmp_path / out.replace("A-name", a).replace("A/", f"runs/{a}/", 1))
    assert cli.main(["compare", a, b, "--runs-dir", str(runs), "--out", target]) == 2
    err = capsys.readouterr().err
    expected = problem.replace("RUNS/A", str(run)).replace("run A", f"run {a}")
    assert err.startswith(f"ConfigError: --out={target!r} is not valid: {expected}; compare never overwrites")
    assert err.count("\n") == 1
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_out_may_be_a_new_file_inside_a_run(runs, capsys):
    a, b = "20261130-100000-aaaa", "20261130-110000-bbbb"
    out = runs / a / "compare-with-b.html"
    assert cli.main(["compare", a, b, "--runs-dir", str(runs), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_the_html_page_escapes_what_the_runs_hold(tmp_path):
    a = write_run_records(
        tmp_path / "20261130-100000-a&b", {"dataset": "npz:data/x<1>&y.npz", "model": "m:<b>bold</b>"}
    )
    b = write_run_records(tmp_path / "20261130-110000-<i>", {"dataset": "mnist"}, manifest={"status": "<s>x</s>&"})
    page = compare.compare_html([load_records(a), load_records(b)], b"")
    cells = "<td>DATASET</td><td>npz:data/x&lt;1&gt;&amp;y.npz</td><td>mnist</td>"
    assert cells in page and "<td>MODEL</td><td>m:&lt;b&gt;bold&lt;/b&gt;</td>" in page
    assert "<th>20261130-100000-a&amp;b</th><th>20261130-110000-&lt;i&gt;</th>" in page
    assert "<td>status</td><td>completed</td><td>&lt;s&gt;x&lt;/s&gt;&amp;</td>" in page
    for raw in ("x<1>", "<b>bold", "<i>", "<s>", "&y", "a&b"):
        assert raw not in page, raw


@pytest.fixture
def edge_runs(tmp_path):
    """Run a: no metrics, no status, no EPOCHS, an empty DATASET; run b: minutes, a missing metric."""
    import json

    a = write_run_records(tmp_path / "a", {"dataset": ""}, metrics=[])
    config = json.loads((a / "config.json").read_text())
    del config["epochs"]
    (a / "config.json").write_text(json.dumps(config))
    manifest = json.loads((a / "manifest.json").read_text())
    del manifest["status"]
    (a / "manifest.json").write_text(json.dumps(manifest))
    epoch = {"loss": 0.5, "accuracy": 0.75, "val_loss": 0.25, "val_accuracy": 0.875}
    b = write_run_records(
        tmp_path / "b",
        {"epochs": 2},
        # 120 s to the best epoch (the edge of seconds and minutes), 600 s in all; no val_loss at the end.
        metrics=[
            {"epoch": 1, **epoch, "epoch_seconds": 120.0},
            {"epoch": 2, **epoch, "val_loss": "", "epoch_seconds": 480.0},
        ],
    )
    return [load_records(a), load_records(b)]


def test_the_text_of_runs_with_missing_and_empty_values(edge_runs):
    assert compare.format_comparison(edge_runs) == "\n".join(
        [
            "settings that differ  a   b",
            "DATASET               ''  mnist",
            "EPOCHS                -   2",
            "",
            "metrics              a        b",
            "status               unknown  completed",
            "epochs               0/?      2/2",
            "final loss           -        0.5000",
            "final accuracy       -        0.7500",
            "final val_loss       -        -",
            "final val_accuracy   -        0.8750",
            "best                 -        val_accuracy=0.8750",
            "best at epoch        -        1",
            "test, best weights   -        -",
            "test, final weights  -        -",
            "time to best         -        2.0min",
            "training time        -        10.0min",
            "resumed              0x       0x",
            "",
            "time to best: training seconds of every segment (validation excluded) until the best epoch ended",
        ]
    )


def test_identical_settings_are_one_row_without_cells(tmp_path):
    a = load_records(write_run_records(tmp_path / "a"))
    b = load_records(write_run_records(tmp_path / "b"))
    assert compare.format_comparison([a, b]).startswith("settings that differ  a  b\n(none)\n\nmetrics ")
    page = compare.compare_html([a, b], b"")
    assert '<h2>Settings that differ</h2>\n<p class="note">none</p>\n' in page


def test_the_html_tables_have_their_headers_and_the_picture_its_text(edge_runs):
    page = compare.compare_html(edge_runs, b"")
    assert '<img alt="loss and accuracy of each run by epoch; the monitored metric by training time" ' in page
    assert "<table><tr><th>setting</th><th>a</th><th>b</th></tr><tr><td>DATASET</td><td>&#x27;&#x27;</td>" in page
    assert "<table><tr><th></th><th>a</th><th>b</th></tr><tr><td>status</td><td>unknown</td>" in page


def test_out_that_is_a_directory_is_refused(runs, tmp_path):
    (tmp_path / "cmp.html").mkdir()
    with pytest.raises(compare.ConfigError) as exc:
        compare.check_out(str(tmp_path / "cmp.html"))
    assert str(exc.value) == (
        f"--out={str(tmp_path / 'cmp.html')!r} is not valid: is a directory; name a file in it, e.g. compare.html"
    )


def test_out_in_a_folder_inside_a_run_never_overwrites_a_file_there(runs):
    sub = runs / "20261130-100000-aaaa" / "mine"
    sub.mkdir()
    (sub / "notes.html").write_text("mine")
    with pytest.raises(compare.ConfigError, match="already exists inside run 20261130-100000-aaaa"):
        compare.check_out(str(sub / "notes.html"))


def test_one_run_is_refused_with_the_command_to_use(runs):
    with pytest.raises(compare.ConfigError) as exc:
        compare.compare_runs(runs, ["20261130-100000-aaaa"])
    assert str(exc.value) == (
        "RUN='20261130-100000-aaaa' is not valid: compare needs two or more runs: "
        "python -m train compare RUN RUN [RUN...]"
    )


def test_with_out_the_text_is_the_comparison_then_what_was_written(runs, tmp_path):
    out = tmp_path / "cmp.png"
    text = compare.compare_runs(runs, ["20261130-100000-aaaa", "20261130-110000-bbbb"], str(out))
    assert text.startswith("settings that differ ") and text.endswith(f"ended\n\nwrote {out}")


def test_a_folder_that_cannot_be_looked_into_does_not_hide_the_run_around_it(runs, monkeypatch):
    from train.run import find as rundir

    sub = runs / "20261130-100000-aaaa" / "mine"
    sub.mkdir()
    real = rundir.is_run_dir

    def is_run_dir(path):
        if path == sub:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    (sub / "notes.html").write_text("mine")
    monkeypatch.setattr(rundir, "is_run_dir", is_run_dir)
    with pytest.raises(compare.ConfigError, match="notes.html already exists inside run 20261130-100000-aaaa"):
        compare.check_out(str(sub / "notes.html"))


@pytest.mark.parametrize(
    ("config", "segments", "planned"),
    [
        ({"epochs": 3, "smoke": True}, None, "1"),  # a smoke run trains one epoch whatever EPOCHS says
        ({"epochs": 3}, [{"epochs_planned": 3}, {"epochs_planned": 5}], "5"),  # resumed with more epochs
        ({"epochs": 3}, [{"epochs_planned": "x"}], "3"),  # an unusable segment falls back to EPOCHS
    ],
)
def test_the_epochs_planned_are_what_the_run_set_out_to_train_in_compare_report_and_curves(
    tmp_path, config, segments, planned
):
    from train.results import plots, report

    manifest = {"segments": segments} if segments else None
    records = load_records(write_run_records(tmp_path / "r", config, manifest=manifest, metrics=rows(0.001, [0.8])))
    other = load_records(write_run_records(tmp_path / "o", {"epochs": 1}, metrics=rows(0.001, [0.9])))
    assert dict(compare.metric_rows([records, other]))["epochs"] == [f"1/{planned}", "1/1"]
    assert f"1 of {planned} epochs" in report.render(records, b"", "")
    assert plots.curves_figure(records).get_suptitle().endswith(f"1 of {planned} epochs")


def test_the_data_version_is_a_row_only_when_a_run_recorded_one(tmp_path):
    from builders import write_run_records

    a = load_records(write_run_records(tmp_path / "a"))
    assert "data version" not in dict(compare.metric_rows([a, a]))
    version = {"path": "images", "commit": "c7d0a16b0065abef66d2", "workspace": "differs"}
    b = load_records(write_run_records(tmp_path / "b", manifest={"data": {"fingerprint": "ab", "version": version}}))
    assert dict(compare.metric_rows([a, b]))["data version"] == ["-", "images@c7d0a16b0065 (differed)"]
    assert compare._version_cell({"path": "images", "commit": None}) == "images (no commit)"


def test_the_metrics_a_model_adds_are_compared_too(tmp_path):
    top2 = [dict(row, top2=0.97, val_top2=0.96) for row in rows(0.001, [0.9])]
    a = load_records(write_run_records(tmp_path / "a", {"model": "mine"}, metrics=top2))
    b = load_records(write_run_records(tmp_path / "b", metrics=rows(0.001, [0.8])))
    table = dict(compare.metric_rows([a, b]))
    assert table["final top2"] == ["0.9700", "-"] and table["final val_top2"] == ["0.9600", "-"]
    assert list(table).index("final val_accuracy") < list(table).index("final top2")
    assert "final top2" not in dict(compare.metric_rows([b, b]))


def test_compare_shows_the_digits_the_training_log_showed(tmp_path):
    """float32 0.90825 is 0.9082499...: the log rounded it to 0.9082 while compare read "0.90825" from
    metrics.csv and showed 0.9083. Both round the number the file keeps."""
    from train.run.metrics_files import METRIC_COLUMNS, MetricsFile, read_back
    from train.training.loop import epoch_metrics

    logs = {
        "loss": float(np.float32(0.31245)),
        "accuracy": 0.9,
        "val_loss": 0.4,
        "val_accuracy": float(np.float32(0.90825)),
    }
    run = write_run_records(tmp_path / "a", metrics=[])  # metrics.csv as the loop writes it, below
    file = MetricsFile(run / "metrics.csv", METRIC_COLUMNS)
    file.append({"epoch": 1, **logs, "learning_rate": 0.001, "epoch_seconds": 1.0})
    table = dict(compare.metric_rows([load_records(run)]))
    assert epoch_metrics(logs) == "accuracy=0.9000  loss=0.3125  val_accuracy=0.9083  val_loss=0.4000"
    assert (table["final loss"], table["final val_accuracy"], table["best"]) == (
        ["0.3125"],
        ["0.9083"],
        ["val_accuracy=0.9083"],
    )
    assert read_back(file.rows[0])["val_accuracy"] == 0.90825
