"""train.dvc.callback: a run on data DVC tracks records its version in the manifest, and a workspace that
differs from that version is one warning (the real dvc command answers `dvc status`; no training)."""

from __future__ import annotations

import json
import logging

from builders import write_image_dir
from dvc_repo import DataRepo, dvc_command
from helpers import tiny_settings

from train.dvc.callback import DataVersionCallback


def _run_dir(tmp_path):
    run = tmp_path / "runs" / "20261203-000000-000000"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"data": {"fingerprint": "ab"}}))
    return run


def test_the_version_is_recorded_and_a_changed_workspace_warns_once(tmp_path, caplog):
    data = DataRepo(tmp_path / "data", dvc_command())
    write_image_dir(data.root / "images", classes=2, per_class=2, size=8)
    data.run("add", "-q", "images")
    commit = data.commit("images")
    settings = tiny_settings(tmp_path, dataset=f"images:{data.root / 'images'}", dvc_command=data.dvc)
    run = _run_dir(tmp_path)
    with caplog.at_level(logging.INFO, logger="train"):
        DataVersionCallback(settings).on_train_begin(run)
    recorded = json.loads((run / "manifest.json").read_text())["data"]
    assert recorded["fingerprint"] == "ab" and recorded["version"]["commit"] == commit
    assert recorded["version"]["workspace"] == "matches" and recorded["version"]["hash"] == data.md5("images")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"data: DVC version images at commit {commit[:12]}" in caplog.text

    caplog.clear()
    (data.root / "images" / "class_0" / "img_000.png").write_bytes(b"other bytes")
    with caplog.at_level(logging.INFO, logger="train"):
        DataVersionCallback(settings).on_train_begin(run)
    (warned,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned.startswith("WARNING: images differs from its DVC version (images.dvc, ")
    version = json.loads((run / "manifest.json").read_text())["data"]["version"]
    assert version["workspace"] == "differs" and version["warning"] == warned


def test_data_outside_dvc_leaves_the_manifest_as_it_was(tmp_path, caplog):
    images = write_image_dir(tmp_path / "images", classes=2, per_class=1, size=8)
    run = _run_dir(tmp_path)
    before = (run / "manifest.json").read_text()
    DataVersionCallback(tiny_settings(tmp_path, dataset=f"images:{images}")).on_train_begin(run)
    assert (run / "manifest.json").read_text() == before and not caplog.records
