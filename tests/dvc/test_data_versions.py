"""Data versions end to end: an image folder tracked by DVC in a git repository of its own, pushed to a
DVC remote on the suite's S3 server; a run on it records where its data is; the data then changes and
every copy of the first version on this machine is deleted, and `reproduce` fetches that version from
the remote and matches. A version that was never pushed, and a remote that refuses the credentials,
are one line each (exit 9). One trained run serves every assertion.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from builders import write_image_dir
from dvc_repo import DataRepo, dvc_command
from helpers import clone_of_the_package, tiny_values

from train.config import as_flags


def train(code: Path, env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "train", *args], cwd=code, capture_output=True, text=True, env=env, timeout=600
    )
    if check:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def refusal(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 9 and "Traceback" not in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_run_on_dvc_data_is_reproduced_from_the_remote_on_a_machine_without_that_data(tmp_path, s3_server, s3_bucket):
    dvc = dvc_command()
    code = clone_of_the_package(tmp_path / "code")
    data = DataRepo(tmp_path / "data", dvc, s3_server.endpoint, s3_bucket)
    write_image_dir(data.root / "images", classes=2, per_class=6, size=12)
    data.run("add", "-q", "images")
    first = data.commit("images, first version")
    data.run("push", "-q")
    runs, fetched = tmp_path / "runs", tmp_path / "fetched"
    values = tiny_values(tmp_path, data.root / "unused.npz") | {"epochs": 1, "deterministic": True}
    values |= {"dataset": f"images:{data.root / 'images'}", "image_size": 12, "val_split": 0.25}
    env = data.env | {"PYTHONPATH": str(code), "DVC_COMMAND": dvc, "DVC_DATA_CACHE": str(fetched)}
    fit = train(code, env, "fit", "--env-file", "", *as_flags(values))
    assert "differs from its DVC version" not in fit.stdout + fit.stderr
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    version = json.loads((run / "manifest.json").read_text())["data"]["version"]
    assert version["commit"] == first and version["path"] == "images" and version["dvc_file"] == "images.dvc"
    assert version["hash"] == data.md5("images") and version["remote_url"] == f"s3://{s3_bucket}/dvc"
    assert version["workspace"] == "matches" and version["warning"] is None
    (listed,) = json.loads(train(code, env, "runs", "--json", "--runs-dir", str(runs)).stdout)
    assert listed["data_version"]["commit"] == first and listed["data_version"]["remote_url"] == version["remote_url"]

    # The data changes (committed, never pushed); this machine loses every copy of the first version.
    write_image_dir(data.root / "images", classes=2, per_class=7, size=12, seed=1)
    data.run("add", "-q", "images")
    second, second_md5 = data.commit("images, second version"), data.md5("images")
    shutil.rmtree(data.root / "images")
    shutil.rmtree(data.root / ".dvc" / "cache")

    done = train(code, env, "reproduce", run.name, "--local", "--runs-dir", str(runs))
    assert "MATCH" in done.stdout and f"fetching images at commit {first[:12]}" in done.stdout, done.stdout
    (rerun,) = [p for p in runs.iterdir() if p.is_dir() and p != run]
    assert json.loads((rerun / "reproduce.json").read_text())["match"] is True
    assert not (data.root / "images").exists()  # fetched into a folder of its own, not the workspace
    assert [p.name for p in fetched.iterdir()] == [version["hash"].removesuffix(".dir")]

    # A version that was never pushed: the same run, its record pointing at the second commit.
    unpushed = tmp_path / "unpushed" / run.name
    shutil.copytree(run, unpushed)
    manifest = json.loads((unpushed / "manifest.json").read_text())
    manifest["data"]["version"] |= {"commit": second, "hash": second_md5}
    (unpushed / "manifest.json").write_text(json.dumps(manifest))
    line = refusal(
        train(code, env, "reproduce", str(unpushed), "--local", "--runs-dir", str(unpushed.parent), check=False)
    )
    assert line.startswith("DataVersionError: images (hash ") and "was never pushed" in line, line
    assert f"git checkout {second[:12]} && dvc push images.dvc" in line

    # A remote that refuses the credentials (the fetched copy gone too): the line names it, no secret in it.
    shutil.rmtree(fetched)
    wrong = env | {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    line = refusal(train(code, wrong, "reproduce", run.name, "--local", "--runs-dir", str(runs), check=False))
    assert line.startswith(
        f"DataVersionError: DVC remote s3://{s3_bucket}/dvc: cannot be reached or refuses the credentials"
    )
    assert "not-the-secret" not in line and "AWS_SECRET_ACCESS_KEY" in line
