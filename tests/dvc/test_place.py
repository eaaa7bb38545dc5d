"""train.dvc.place: what a run reads, and the DVC project around it."""

from __future__ import annotations

from helpers import tiny_settings

from train.dvc.place import data_path, dvc_root


def test_what_a_run_reads_is_dataset_s_path_or_the_built_in_set_s_file_in_data_dir(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    s = tiny_settings(tmp_path, dataset=f"images:{images}")
    assert data_path(s) == ("DATASET", images.resolve())
    s = tiny_settings(tmp_path, dataset="mnist", data_dir=str(tmp_path / "data"))
    assert data_path(s) == ("DATA_DIR", (tmp_path / "data").resolve())
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mnist.npz").write_bytes(b"x")
    assert data_path(s) == ("DATA_DIR", (tmp_path / "data" / "mnist.npz").resolve())


def test_the_project_is_the_nearest_dvc_folder_above_and_stops_at_the_git_repository(tmp_path):
    images = tmp_path / "repo" / "project" / "images"
    images.mkdir(parents=True)
    assert dvc_root(images) is None
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "repo" / ".git").mkdir()
    assert dvc_root(images) is None  # a DVC project above the git repository is not this data's
    (tmp_path / "repo" / "project" / ".dvc").mkdir()
    assert dvc_root(images) == tmp_path / "repo" / "project"
