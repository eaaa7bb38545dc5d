"""reproduce_image: the run's image tag, the build and run command lines, host <-> container paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from train.errors import ReproduceError
from train.reproduce.image import ImageOptions, build_command, container_values, host_values, image_tag, run_command

MANIFEST = {
    "git": {"commit": "0123456789abcdef0123"},
    "requirements_lock": {"file": "/app/requirements.lock", "sha256": "feedbeef" * 8},
}


def test_the_tag_is_the_one_invoke_build_gives_and_the_target_follows_the_lock():
    assert image_tag(MANIFEST, ImageOptions(Path("d"))) == ("tf-train-template:cpu-feedbeeffeed-01234567", "cpu")
    gpu = dict(MANIFEST, requirements_lock={"file": "requirements/gpu.lock", "sha256": "ab" * 32})
    assert image_tag(gpu, ImageOptions(Path("d"), image="me/train")) == ("me/train:gpu-abababababab-01234567", "gpu")
    with pytest.raises(ReproduceError, match="no commit or no lock hash"):
        image_tag({"git": {"commit": None}}, ImageOptions(Path("d")))


def test_a_run_made_in_the_image_maps_its_volumes_onto_the_host_folders(tmp_path):
    runs, data = tmp_path / "runs", tmp_path / "data"
    recorded = {"runs_dir": "/runs", "data_dir": "/data", "dataset": "npz:/data/sub/x.npz", "epochs": 1}
    host = host_values(recorded, runs, data)
    assert host["data_dir"] == str(data) and host["dataset"] == f"npz:{data / 'sub/x.npz'}"
    inside, mounts = container_values(host, runs, data)
    assert (
        inside["runs_dir"] == "/runs" and inside["data_dir"] == "/data" and inside["dataset"] == "npz:/data/sub/x.npz"
    )
    assert mounts == ["-v", f"{runs}:/runs", "-v", f"{data}:/data:ro"]


@pytest.mark.parametrize(
    "dataset, expected, mount",
    [
        ("npz:/elsewhere/set.npz", "npz:/dataset/set.npz", "/elsewhere:/dataset:ro"),
        ("images:/photos/cats", "images:/dataset", "/photos/cats:/dataset:ro"),
        ("mnist", "mnist", None),
    ],
)
def test_a_host_run_gets_its_data_mounted_where_the_container_finds_it(tmp_path, dataset, expected, mount):
    inside, mounts = container_values(
        host_values({"dataset": dataset}, tmp_path / "runs", tmp_path / "data"), tmp_path / "runs", tmp_path / "data"
    )
    assert inside["dataset"] == expected
    assert (mount in mounts) if mount else len(mounts) == 4


def test_a_commit_whose_dockerfile_names_its_stages_cpu_and_gpu_is_built_by_that_name(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM base AS deps-cpu\nFROM deps-cpu AS cpu\nFROM deps-gpu AS gpu\n")
    cmd = build_command("t:gpu-x", "gpu", "0123abc", tmp_path, ImageOptions(tmp_path))
    assert cmd[2:4] == ["--target", "gpu"] and not [a for a in cmd if a.startswith("VARIANT=")]


def test_the_build_and_run_command_lines(tmp_path):
    options = ImageOptions(
        tmp_path, base_image="mirror/python:3.11", ca_bundle="/ca.pem", network="host", docker="/usr/bin/docker"
    )
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "Dockerfile").write_text(
        "ARG VARIANT=gpu\nFROM base AS deps-cpu\nFROM deps-${VARIANT} AS runtime\n"
    )
    cmd = build_command("t:cpu-x", "cpu", "0123abc", tmp_path / "src", options)
    assert cmd[:6] == ["/usr/bin/docker", "build", "--target", "runtime", "--build-arg", "VARIANT=cpu"]
    assert cmd[-3:] == ["-t", "t:cpu-x", str(tmp_path / "src")]
    assert "GIT_COMMIT=0123abc" in cmd and "BASE_IMAGE=mirror/python:3.11" in cmd
    assert "id=ca_bundle,src=/ca.pem" in cmd and cmd[cmd.index("--network") + 1] == "host"
    runs = tmp_path / "runs"
    runs.mkdir()
    run = run_command("t:cpu-x", ["--epochs", "1"], ["-v", "a:/runs"], runs, options)
    assert run[:6] == ["/usr/bin/docker", "run", "--rm", "--network", "none", "--user"]
    assert run[-4:] == ["t:cpu-x", "fit", "--epochs", "1"]
