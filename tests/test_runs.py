"""runs: the table of runs under RUNS_DIR, from fake run directories (one with a broken manifest)."""

from __future__ import annotations

import json

from train.runs import format_runs, list_runs


def _run(root, name, config, manifest=None, metrics=None):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config) if isinstance(config, dict) else config)
    if manifest is not None:
        (d / "manifest.json").write_text(json.dumps(manifest) if isinstance(manifest, dict) else manifest)
    if metrics is not None:
        (d / "metrics.csv").write_text(metrics)
    return d


CFG = {"epochs": 3, "monitor": "val_accuracy", "model": "cnn", "dataset": "mnist"}


def test_list_and_format_runs(tmp_path):
    root = tmp_path / "runs"
    _run(root, "20260101-000000-aaaa", CFG,
         {"status": "completed", "epochs_completed": 3, "best": {"value": 0.98765}, "duration_seconds": 61.4})
    _run(root, "20260102-000000-bbbb", CFG, "{not json", metrics="epoch,loss\n1,0.5\n2,0.4\n")
    _run(root, "20260103-000000-cccc", "{broken")  # config unreadable too
    (root / "not-a-run").mkdir()
    (root / "stray.txt").write_text("x")

    rows = list_runs(root)
    assert [r["id"] for r in rows] == ["20260101-000000-aaaa", "20260102-000000-bbbb", "20260103-000000-cccc"]
    assert rows[0] == {"id": "20260101-000000-aaaa", "status": "completed", "epochs": 3, "of": 3,
                            "monitor": "val_accuracy", "best": 0.98765, "duration": 61.4, "model": "cnn",
                            "dataset": "mnist"}
    assert (rows[1]["status"], rows[1]["epochs"], rows[1]["best"]) == ("unknown", 2, None)
    assert (rows[2]["status"], rows[2]["epochs"], rows[2]["of"]) == ("unknown", None, None)

    lines = format_runs(rows).splitlines()
    assert lines[0].split() == ["ID", "STATUS", "EPOCHS", "BEST", "DURATION", "MODEL", "DATASET"]
    assert lines[1].split() == ["20260101-000000-aaaa", "completed", "3/3", "val_accuracy=0.9877", "61s", "cnn", "mnist"]
    assert lines[2].split() == ["20260102-000000-bbbb", "unknown", "2/3", "-", "-", "cnn", "mnist"]
    assert lines[3].split() == ["20260103-000000-cccc", "unknown", "-/-", "-", "-"]
    col = lines[0].index("STATUS")
    assert lines[1][col:].startswith("completed") and lines[2][col:].startswith("unknown")  # aligned columns
    assert all(line == line.rstrip() for line in lines)


def test_no_runs(tmp_path):
    assert list_runs(tmp_path / "missing") == []
    assert format_runs([]).startswith("no runs yet")
