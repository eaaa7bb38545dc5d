"""train.dvc.tracked: which entry of a .dvc file or dvc.lock tracks the data, the remote, the record (no dvc run)."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import PROJECT_ROOT, git, tiny_settings

from train.dvc import tracked
from train.dvc.callback import DataVersionCallback

DVC_FILE = """\
outs:
- md5: 166b92740753f996441b137e01544e50.dir
  size: 4
  nfiles: 2
  hash: md5
  path: images
"""

DVC_LOCK = """\
schema: '2.0'
stages:
  prepare:
    cmd: python prepare.py raw out
    deps:
    - path: raw
      hash: md5
      md5: 11111111111111111111111111111111.dir
    outs:
    - path: data/prepared
      hash: md5
      md5: 22222222222222222222222222222222.dir
      size: 10
      nfiles: 2
  "train split":
    cmd: python split.py
    outs:
    - hash: md5
      md5: 33333333333333333333333333333333
      path: 'data/split file.npz'
      files:
      - relpath: nested
        md5: 44444444444444444444444444444444
"""


def test_the_outs_of_a_dvc_file_and_of_a_dvc_lock_with_their_stages():
    assert tracked.outs(DVC_FILE) == [
        (
            "",
            {
                "md5": "166b92740753f996441b137e01544e50.dir",
                "size": "4",
                "nfiles": "2",
                "hash": "md5",
                "path": "images",
            },
        )
    ]
    found = [(stage, entry["path"], entry["md5"]) for stage, entry in tracked.outs(DVC_LOCK)]
    assert found == [
        ("prepare", "data/prepared", "22222222222222222222222222222222.dir"),  # deps are not outs
        ("train split", "data/split file.npz", "33333333333333333333333333333333"),  # nested files skipped
    ]


CONFIG = """\
[core]
    remote = store
    analytics = false
['remote "store"']
    url = s3://bucket/dvc
    endpointurl = http://127.0.0.1:9000
['remote "other"']
    url = https://user:secret@dvc.example.com/cache
"""


def test_the_remote_is_the_default_or_the_named_one_and_config_local_wins(tmp_path):
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text(CONFIG)
    assert tracked.remote(tmp_path) == ("store", "s3://bucket/dvc")
    assert tracked.remote(tmp_path, "other") == ("other", "https://user:secret@dvc.example.com/cache")
    (tmp_path / ".dvc" / "config.local").write_text("[core]\n    remote = other\n")
    assert tracked.remote(tmp_path)[0] == "other"
    assert tracked.remote(tmp_path / "nothing") == ("", "")


NEEDS_GIT = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (the image has none)")


def _project(root: Path) -> Path:
    """A git repository with a DVC project (its files only: no dvc command is run here)."""
    root.mkdir()
    git(root, "init", "-q")
    (root / ".dvc").mkdir()
    (root / ".dvc" / "config").write_text(CONFIG.replace("s3://bucket/dvc", "https://reader:pa55@dvc.example.com/c"))
    (root / "images" / "cats").mkdir(parents=True)
    (root / "images" / "cats" / "a.png").write_bytes(b"png")
    (root / "images.dvc").write_text(DVC_FILE)
    git(root, "remote", "add", "origin", "https://bot:token123@git.example.com/data.git")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "data")
    return root


@NEEDS_GIT
def test_the_record_names_commit_path_entry_and_remote_without_credentials(tmp_path):
    root = _project(tmp_path / "repo")
    s = tiny_settings(tmp_path, dataset=f"images:{root / 'images' / 'cats'}", dvc_command=str(tmp_path / "no-dvc"))
    version = tracked.record(s)
    assert version["commit"] == git(root, "rev-parse", "HEAD").strip() and version["repository"] == str(root.resolve())
    assert (version["path"], version["read"], version["dvc_file"]) == ("images", "cats", "images.dvc")
    assert version["hash"] == "166b92740753f996441b137e01544e50.dir" and version["setting"] == "DATASET"
    assert version["remote"] == "store" and version["remote_url"] == "https://***@dvc.example.com/c"
    assert version["git_remote"] == "https://***@git.example.com/data.git"
    assert "pa55" not in str(version) and "token123" not in str(version)
    # DVC_COMMAND names nothing: the workspace's state is unknown, and the one warning says so.
    assert version["workspace_unknown"] == f"DVC_COMMAND={tmp_path / 'no-dvc'} is no file and no command on PATH"
    assert version["dvc_file_committed"] is True and version["warning"] == (
        f"WARNING: whether images matches its DVC version is unknown ({version['workspace_unknown']}): set "
        "DVC_COMMAND to a DVC (`dvc --version` answers a version), or leave it empty for .venv-dvc or dvc on PATH"
    )


@NEEDS_GIT
def test_without_a_dvc_command_the_workspace_is_unknown_saying_what_installs_one_and_no_warning(tmp_path, monkeypatch):
    # The image tracks no DVC of its own: a run there records its data version without a warning line.
    root = _project(tmp_path / "repo")
    monkeypatch.setattr(tracked.tool, "OWN_VENV", tmp_path / "no-venv")
    monkeypatch.setattr(tracked.tool.shutil, "which", lambda name: None)  # and none on PATH
    version = tracked.record(tiny_settings(tmp_path, dataset=f"images:{root / 'images'}"))
    assert version["workspace"] == "unknown" and "scripts/venv-dvc.sh" in version["workspace_unknown"]
    assert version["warning"] is None


@NEEDS_GIT
def test_a_dvc_command_that_prints_nothing_leaves_the_workspace_unknown(tmp_path):
    # `dvc status --json` prints `{}` when nothing changed; a program that prints nothing is not DVC.
    root = _project(tmp_path / "repo")
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    version = tracked.record(tiny_settings(tmp_path, dataset=f"images:{root / 'images'}", dvc_command=str(silent)))
    assert version["workspace"] == "unknown" and "printed nothing: is it DVC?" in version["workspace_unknown"]
    assert version["warning"].startswith("WARNING: whether images matches its DVC version is unknown (dvc status: ")


@NEEDS_GIT
def test_a_dvc_command_relative_to_the_working_directory_answers_from_the_data_s_project(tmp_path, monkeypatch):
    """`dvc status` runs in the DVC project: a DVC_COMMAND relative to where the run starts was "no such
    file" there, and a working DVC read as another program, with a warning to set DVC_COMMAND."""
    root = _project(tmp_path / "repo")
    (tmp_path / "bin").mkdir()
    dvc = tmp_path / "bin" / "dvc"
    dvc.write_text("#!/bin/sh\necho '{}'\n")  # what DVC prints when nothing changed
    dvc.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    version = tracked.record(tiny_settings(tmp_path, dataset=f"images:{root / 'images'}", dvc_command="bin/dvc"))
    assert version["workspace"] == "matches" and version["warning"] is None


@NEEDS_GIT
def test_a_version_missing_from_the_dvc_cache_leaves_the_workspace_unknown_not_matching(tmp_path):
    """With the version not in the project's DVC cache (pruned, a clone never pulled), DVC 3 answers
    "not in cache" whether or not the data differs: that is no "matches", and the one warning says so."""
    root = _project(tmp_path / "repo")
    dvc = tmp_path / "dvc"
    dvc.write_text("""#!/bin/sh\necho '{"images.dvc": [{"changed outs": {"images": "not in cache"}}]}'\n""")
    dvc.chmod(0o755)
    version = tracked.record(tiny_settings(tmp_path, dataset=f"images:{root / 'images'}", dvc_command=str(dvc)))
    assert version["workspace"] == "unknown"
    assert (
        version["workspace_unknown"]
        == f"dvc status: images.dvc's version is not in the DVC cache of {root}; `dvc fetch images.dvc` there"
    )
    assert version["warning"].startswith("WARNING: whether images matches its DVC version is unknown (dvc status: ")


@NEEDS_GIT
@pytest.mark.parametrize("named", [True, False])
def test_a_dvc_whose_status_fails_is_told_to_fix_what_dvc_says_not_to_change_dvc_command(tmp_path, monkeypatch, named):
    """The real DVC on a broken .dvc/config, named by DVC_COMMAND or found by default (.venv-dvc): its own
    error in one warning, and no advice to replace it. With no DVC found and none named, no warning at all
    (an image without DVC still trains)."""
    from dvc_repo import dvc_command

    dvc = dvc_command()
    root = _project(tmp_path / "repo")
    with (root / ".dvc" / "config").open("a") as f:
        f.write("this is no config line\n")
    monkeypatch.setattr(tracked.tool, "OWN_VENV", Path(dvc).parent.parent)
    version = tracked.record(
        tiny_settings(tmp_path, dataset=f"images:{root / 'images'}", dvc_command=dvc if named else "")
    )
    assert version["warning"].startswith("WARNING: whether images matches its DVC version is unknown (dvc status: ")
    assert "config" in version["warning"] and "\n" not in version["warning"]
    assert version["warning"].endswith(f"): run `dvc status` in {root.resolve()} and fix what it says")


@NEEDS_GIT
def test_a_dvc_command_that_prints_no_json_is_named_as_not_dvc(tmp_path):
    root = _project(tmp_path / "repo")
    version = tracked.record(tiny_settings(tmp_path, dataset=f"images:{root / 'images'}", dvc_command="/bin/echo"))
    assert version["workspace_unknown"] == "dvc status: /bin/echo printed no JSON: is it DVC?"


@NEEDS_GIT
def test_an_uncommitted_dvc_file_warns_once_naming_the_commit_and_what_to_commit(tmp_path):
    root = _project(tmp_path / "repo")
    (root / "images.dvc").write_text(DVC_FILE.replace("166b9274", "99999999"))
    version = tracked.record(tiny_settings(tmp_path, dataset=f"images:{root / 'images'}", dvc_command="/none"))
    commit = git(root, "rev-parse", "HEAD").strip()[:12]
    assert version["dvc_file_committed"] is False
    assert version["warning"] == (
        f"WARNING: images.dvc has changes not committed to git: commit {commit} does not record this run's data "
        "version; commit images.dvc (and `dvc push`), then train"
    )


def test_a_workspace_that_differs_warns_with_the_commands_that_make_it_a_version():
    version = {"path": "my images", "dvc_file": "images.dvc", "commit": "c7" * 20, "hash": "166b92740753f9.dir"}
    line = tracked.warning(version | {"workspace": "differs", "dvc_file_committed": True})
    assert line.startswith("WARNING: my images differs from its DVC version (images.dvc, 166b92740753...)")
    assert "`dvc add 'my images'` (or `dvc repro`), commit images.dvc, `dvc push`, then train" in line
    assert tracked.warning(version | {"workspace": "matches", "dvc_file_committed": True}) is None


@NEEDS_GIT
@pytest.mark.parametrize("where", ["outside any project", "in a project, untracked"])
def test_data_dvc_does_not_track_has_no_record(tmp_path, where):
    images = tmp_path / "images"
    if where != "outside any project":
        images = _project(tmp_path / "repo") / "other"
    images.mkdir()
    assert tracked.record(tiny_settings(tmp_path, dataset=f"images:{images}")) is None


@NEEDS_GIT
def test_a_dvc_lock_output_that_holds_the_data_is_found_with_its_stage(tmp_path):
    root = _project(tmp_path / "repo")
    (root / "dvc.lock").write_text(DVC_LOCK)
    (root / "data" / "prepared" / "x").mkdir(parents=True)
    source, stage, entry = tracked.entry_for((root / "data" / "prepared" / "x").resolve(), root.resolve())
    assert (source.name, stage, entry["path"]) == ("dvc.lock", "prepare", "data/prepared")


def test_a_git_remote_is_recorded_without_a_password_and_an_ssh_address_whole():
    assert (
        tracked.safe_origin("https://bot:token123@git.example.com/data.git") == "https://***@git.example.com/data.git"
    )
    assert tracked.safe_origin("git@github.com:org/data.git") == "git@github.com:org/data.git"
    assert tracked.safe_origin("/srv/git/data.git") == "/srv/git/data.git"


@NEEDS_GIT
@pytest.mark.skipif(not (PROJECT_ROOT / ".gitignore").is_file(), reason="no .gitignore here (the image has none)")
def test_a_dvc_file_of_data_in_the_project_s_data_folder_is_not_git_ignored(tmp_path):
    # `data/*` ignored data/<name>.dvc too: `dvc add data/flowers` refused it ("is git-ignored").
    shutil.copy(PROJECT_ROOT / ".gitignore", tmp_path / ".gitignore")
    git(tmp_path, "init", "-q")
    ignored = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "-q", "data/flowers.dvc"], check=False)
    assert ignored.returncode == 1  # not ignored
    assert git(tmp_path, "check-ignore", "data/flowers", "data/mnist.npz").split() == ["data/flowers", "data/mnist.npz"]


def test_only_quotes_around_a_value_are_taken_off():
    quoted = {"''": "", '""': "", "'a b'": "a b", "XdataX": "XdataX", "'": "'", "'a\"": "'a\""}
    assert {text: tracked._scalar(text) for text in quoted} == quoted


def test_comments_blank_lines_a_map_before_the_outs_and_nested_lists_end_no_entry_early():
    text = (
        "# written by hand\n"
        "meta:\n"
        "  owner:\n"
        "    team: vision\n"
        "\n"
        "outs:\n"
        "- md5: aaaa.dir\n"
        "  path: images\n"
        "  files:\n"
        "  - relpath: a.png\n"
        "    md5: bbbb\n"
        "  remote: other\n"
        "- md5: cccc\n"
        "  path: labels.csv\n"
    )
    assert tracked.outs(text) == [
        ("", {"md5": "aaaa.dir", "path": "images", "files": "", "remote": "other"}),  # no stage: a .dvc file
        ("", {"md5": "cccc", "path": "labels.csv"}),
    ]
    # A dvc.lock indented by one space: its stages are still the keys under `stages:`.
    assert tracked.outs("stages:\n prepare:\n  outs:\n  - path: p\n") == [("prepare", {"path": "p"})]


LOCK_WITH_TWO_STAGES = """\
schema: '2.0'
stages:
  fetch:
    cmd: get
    outs:
    - md5: 55555555555555555555555555555555
    - path: data/raw
      md5: 66666666666666666666666666666666.dir
  split:
    cmd: split
    outs:
    - path: data/split
      md5: 77777777777777777777777777777777.dir
"""


def test_the_entry_found_is_the_output_that_holds_the_path_within_the_project_only(tmp_path):
    root = tmp_path / "outer" / "project"
    (root / "data" / "split" / "x").mkdir(parents=True)
    (root / "dvc.lock").write_text(LOCK_WITH_TWO_STAGES)
    found = tracked.entry_for(root / "data" / "split" / "x", root)
    assert found == (root / "dvc.lock", "split", {"path": "data/split", "md5": "77777777777777777777777777777777.dir"})
    # A dvc.lock above the project tracks nothing of it, nor does a project the path is not in.
    (root / "dvc.lock").unlink()
    (tmp_path / "outer" / "dvc.lock").write_text(LOCK_WITH_TWO_STAGES.replace("data/split", "project/data"))
    assert tracked.entry_for(root / "data" / "split" / "x", root) is None
    assert tracked.entry_for(root / "data" / "split" / "x", tmp_path / "elsewhere") is None


def test_a_dvc_file_and_a_config_that_are_not_utf_8_are_read_all_the_same(tmp_path):
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_bytes(b"# caf\xe9\n" + CONFIG.encode())
    (tmp_path / "images").mkdir()
    (tmp_path / "images.dvc").write_bytes(b"# caf\xe9\n" + DVC_FILE.encode())
    assert tracked.remote(tmp_path) == ("store", "s3://bucket/dvc")
    assert tracked.entry_for(tmp_path / "images", tmp_path)[2]["path"] == "images"


def test_a_remote_set_in_config_local_alone_is_found(tmp_path):
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config.local").write_text(CONFIG)
    assert tracked.remote(tmp_path) == ("store", "s3://bucket/dvc")


def _calls_dvc(tmp_path: Path, answer: str) -> Path:
    """A dvc command that writes its arguments and working directory to `calls` and prints `answer`."""
    dvc = tmp_path / "dvc-that-answers"
    dvc.write_text(f"#!/bin/sh\necho \"$PWD $*\" >> {tmp_path / 'calls'}\necho '{answer}'\n")
    dvc.chmod(0o755)
    return dvc


@NEEDS_GIT
def test_the_whole_record_of_a_stage_s_output_in_a_project_below_the_git_top(tmp_path):
    top = tmp_path / "repo"
    top.mkdir()
    git(top, "init", "-q")
    root = top / "project"
    (root / ".dvc").mkdir(parents=True)
    (root / ".dvc" / "config").write_text(CONFIG)
    (root / "data" / "prepared").mkdir(parents=True)
    lock = DVC_LOCK.replace("md5: 22222222222222222222222222222222.dir", "etag: '0x8DB3'\n      remote: other")
    (root / "dvc.lock").write_text(lock)
    git(top, "add", "-A")
    git(top, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "data")
    dvc = _calls_dvc(tmp_path, "{}")
    s = tiny_settings(tmp_path, dataset=f"images:{root / 'data' / 'prepared'}", dvc_command=str(dvc))
    assert tracked.record(s) == {
        "tool": "dvc",
        "repository": str(top.resolve()),
        "git_remote": None,
        "commit": git(top, "rev-parse", "HEAD").strip(),
        "path": "project/data/prepared",
        "read": "",
        "setting": "DATASET",
        "dvc_file": "project/dvc.lock",
        "stage": "prepare",
        "hash": "0x8DB3",
        "remote": "other",
        "remote_url": "https://***@dvc.example.com/cache",
        "dvc_file_committed": True,
        "workspace": "matches",
        "warning": None,
    }
    assert (tmp_path / "calls").read_text() == f"{root} status --json dvc.yaml:prepare\n"


@NEEDS_GIT
def test_the_record_of_a_repository_without_a_commit_or_a_remote_names_neither(tmp_path, caplog):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / ".dvc").mkdir()
    (root / ".dvc" / "config").write_text("[core]\n    analytics = false\n")
    (root / "f.npz").write_bytes(b"npz")
    (root / "f.npz.dvc").write_text("outs:\n- checksum: 0a1b\n  path: f.npz\n")
    s = tiny_settings(tmp_path, dataset=f"npz:{root / 'f.npz'}", dvc_command="/none")
    version = tracked.record(s)
    assert (version["commit"], version["hash"], version["remote"], version["remote_url"]) == (None, "0a1b", None, None)
    assert (version["stage"], version["read"], version["dvc_file_committed"]) == (None, "", False)
    assert version["warning"] == (
        "WARNING: f.npz.dvc has changes not committed to git: the repository has no commit yet to record this run's "
        "data version; commit f.npz.dvc (and `dvc push`), then train"
    )
    # The run's line says so too, not "at commit None".
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    with caplog.at_level(logging.INFO, logger="train"):
        DataVersionCallback(s).on_train_begin(run)
    assert caplog.messages[-1] == (
        f"data: DVC version f.npz of {root.resolve()} (f.npz.dvc), at no commit: the repository has none yet"
    )


@pytest.mark.parametrize(
    ("answer", "workspace"),
    [
        ('{"images.dvc": [{"changed outs": {"images": "modified"}}]}', "differs"),
        ('{"images.dvc": [{"changed outs": {"images": "deleted"}}]}', "differs"),
        ('{"images.dvc": [{"changed outs": {"images": "new"}}]}', "differs"),
        ('{"images.dvc": ["changed checksum"]}', "differs"),
        ("{}", "matches"),
    ],
)
def test_each_change_dvc_status_names_is_a_workspace_that_differs(tmp_path, answer, workspace):
    assert tracked.workspace(str(_calls_dvc(tmp_path, answer)), tmp_path, tmp_path / "images.dvc", "") == {
        "workspace": workspace
    }
    assert (tmp_path / "calls").read_text() == f"{tmp_path} status --json {tmp_path / 'images.dvc'}\n"


def test_a_stage_s_version_not_in_the_dvc_cache_names_the_stage_to_fetch(tmp_path):
    dvc = _calls_dvc(tmp_path, '{"sub/dvc.yaml:prepare": [{"changed outs": {"data": "not in cache"}}]}')
    assert tracked.workspace(str(dvc), tmp_path, tmp_path / "sub" / "dvc.lock", "prepare") == {
        "workspace": "unknown",
        "workspace_unknown": f"dvc status: sub/dvc.yaml:prepare's version is not in the DVC cache of {tmp_path}; "
        "`dvc fetch sub/dvc.yaml:prepare` there",
    }


def test_a_dvc_command_that_cannot_be_run_or_prints_no_json_leaves_the_workspace_unknown(tmp_path):
    not_executable = tmp_path / "dvc"
    not_executable.write_text("#!/bin/sh\necho '{}'\n")
    source = tmp_path / "images.dvc"
    assert tracked.workspace(str(not_executable), tmp_path, source, "") == {
        "workspace": "unknown",
        "workspace_unknown": f"dvc status: [Errno 13] Permission denied: '{not_executable}'",
    }
    assert tracked.workspace("/bin/echo", tmp_path, source, "") == {
        "workspace": "unknown",
        "workspace_unknown": "dvc status: /bin/echo printed no JSON: is it DVC?",
    }


def test_without_a_dvc_command_named_or_found_an_unknown_workspace_gives_no_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(tracked.tool, "OWN_VENV", tmp_path / "no-venv")
    monkeypatch.setattr(tracked.tool.shutil, "which", lambda name: None)
    version = {"path": "images", "dvc_file": "images.dvc", "commit": "c7" * 20, "dvc_file_committed": True}
    assert tracked.warning(version | {"workspace": "unknown", "workspace_unknown": "no dvc command"}) is None
