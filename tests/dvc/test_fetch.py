"""train.dvc.fetch: every refusal of a data version is one line naming what is missing and its fix (no dvc run)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from helpers import tiny_settings

from train.dvc import fetch, tool
from train.dvc.fetch import DataVersionError
from train.errors import ReproduceError

VERSION = {
    "tool": "dvc",
    "repository": "/data/repo",
    "git_remote": None,
    "commit": "c7d0a16b0065abef66d223d814ca8da07a11971a",
    "path": "images",
    "read": "",
    "setting": "DATASET",
    "dvc_file": "images.dvc",
    "hash": "166b92740753f996441b137e01544e50.dir",
    "remote": "store",
    "remote_url": "s3://bucket/dvc",
    "workspace": "matches",
}

# DVC 3's own error lines (stderr of `dvc get`), as it prints them for each case.
NOT_PUSHED_DIR = "ERROR: unexpected error - failed to load directory ('images',): dvc/files/md5/a6/0514c2.dir"
NOT_PUSHED_FILE = "ERROR: unexpected error - [Errno 2] No storage files available: 'f.npz'"
NO_REVISION = "ERROR: failed to get 'images' from '/data/repo' - unknown Git revision '0123456789'"
FORBIDDEN = (
    "ERROR: unexpected error - Forbidden: An error occurred (403) when calling the HeadObject operation: Forbidden"
)
NO_ENDPOINT = (
    'ERROR: unexpected error - Could not connect to the endpoint URL: "http://u:pw@127.0.0.1:1/dvc/files/md5/b0"'
)

# The data's repository moved or deleted: never the DVC remote's fault.
NO_REPOSITORY = "ERROR: failed to get 'images' from '/data/repo' - /data/repo is not a git repository"
NO_CLONE = (
    "ERROR: failed to get 'images' - SCM error: Failed to clone repo '/data/repo' to '/tmp/x-clone': "
    "No git repository was found at /data/repo"
)


@pytest.mark.parametrize(
    ("stderr", "starts", "fix"),
    [
        (NOT_PUSHED_DIR, "images (hash 166b9274", "`git checkout c7d0a16b0065 && dvc push images.dvc` in /data/repo"),
        (NOT_PUSHED_FILE, "images (hash 166b9274", "dvc push images.dvc"),
        (NO_REVISION, "commit c7d0a16b0065: is not in the data's repository /data/repo", "`git fetch` it into"),
        (FORBIDDEN, "DVC remote s3://bucket/dvc: cannot be reached or refuses the credentials", "AWS_ACCESS_KEY_ID"),
        (NO_ENDPOINT, "DVC remote s3://bucket/dvc: cannot be reached", "check that it answers"),
        (NO_REPOSITORY, "the data's git repository /data/repo: cannot be read (", "back at /data/repo"),
        (NO_CLONE, "the data's git repository /data/repo: cannot be read (", "(the run recorded no origin URL)"),
        ("ERROR: something new", "dvc get /data/repo images --rev c7d0a16b0065: failed: something new", "-v"),
    ],
)
def test_each_refusal_of_dvc_get_is_one_line_with_its_fix(stderr, starts, fix):
    line = str(fetch.refusal(tool.error_line(stderr + "\n\nHaving any troubles? Hit us up\n"), VERSION, "/data/repo"))
    assert line.startswith(starts) and fix in line and "\n" not in line, line
    assert "pw@" not in line  # a URL in DVC's message is masked


def test_without_a_dvc_command_the_line_names_the_script_that_installs_it(tmp_path):
    s = tiny_settings(tmp_path, dvc_command=str(tmp_path / "no-dvc"), dvc_data_cache=str(tmp_path / "cache"))
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(VERSION, s, say=lambda _: None)
    assert "is not installed here, and images is not here as recorded" in str(info.value)
    assert "scripts/venv-dvc.sh" in str(info.value) and info.value.exit_code == 9


@pytest.mark.parametrize(
    ("script", "mode"),
    [("exit 0", 0o755), ("echo Python 3.11.7; exit 0", 0o755), ("exit 1", 0o755), ("echo 3.67.1", 0o644)],
    ids=["silent", "another-program", "failing", "not-executable"],
)
def test_a_dvc_command_that_is_not_dvc_is_one_line_naming_it_before_any_fetch(tmp_path, script, mode):
    # A `get` it ran as its own arguments was a traceback (it wrote nothing, or could not be
    # started) or its error read as DVC's ("never pushed").
    fake = tmp_path / "fake-dvc"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n{script}\n')
    fake.chmod(mode)
    s = tiny_settings(tmp_path, dvc_command=str(fake), dvc_data_cache=str(tmp_path / "cache"))
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(VERSION, s, say=lambda _: None)
    assert str(info.value).startswith(f"dvc {fake}: is not a working DVC command (") and "\n" not in str(info.value)
    assert "scripts/venv-dvc.sh" in str(info.value)
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    assert "get" not in calls and not (tmp_path / "cache").exists()


def _fake_dvc(tmp_path, monkeypatch, get):
    """Settings whose dvc command passes as DVC and whose `dvc get` is `get(args)`."""
    fake = tmp_path / "dvc"
    fake.write_text("#!/bin/sh\necho 3.67.1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(tool, "run", lambda dvc, *args, **kw: get(args) if args[0] == "get" else None)
    monkeypatch.setattr(tool, "not_dvc", lambda dvc: None)
    return tiny_settings(tmp_path, dvc_command=str(fake), dvc_data_cache=str(tmp_path / "cache"))


def test_a_dvc_data_cache_that_cannot_be_written_is_one_line_naming_the_setting(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    s = _fake_dvc(tmp_path, monkeypatch, get=lambda args: pytest.fail("fetched"))
    s = s.replace(dvc_data_cache=str(tmp_path / "a-file" / "cache"))
    with pytest.raises(DataVersionError) as info:  # was NotADirectoryError, a traceback
        fetch.fetch(VERSION, s, say=lambda _: None)
    assert str(info.value).startswith(f"DVC_DATA_CACHE {tmp_path / 'a-file' / 'cache'}: cannot be written (")
    assert "set DVC_DATA_CACHE to a folder this user can write" in str(info.value)


def _partial(args, then: BaseException):
    """A `dvc get` stopped after writing part of its output."""
    out = args[args.index("-o") + 1]
    (Path(out) / "cats").mkdir(parents=True)
    (Path(out) / "cats" / "1.png").write_bytes(b"part")
    raise then


def test_a_fetch_stopped_part_way_leaves_no_partial_copy(tmp_path, monkeypatch):
    # Ctrl-C during the fetch: the partial copy, under this process's own name, would stay for good.
    s = _fake_dvc(tmp_path, monkeypatch, get=lambda args: _partial(args, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        fetch.fetch(VERSION, s, say=lambda _: None)
    assert [p.name for p in (tmp_path / "cache").rglob("*")] == ["166b92740753f996441b137e01544e50"]


def test_a_fetch_that_times_out_is_one_line_with_the_command_to_run_by_hand(tmp_path, monkeypatch):
    timeout = subprocess.TimeoutExpired(["dvc", "get"], tool.TIMEOUT)
    s = _fake_dvc(tmp_path, monkeypatch, get=lambda args: _partial(args, timeout))
    with pytest.raises(DataVersionError) as info:  # was TimeoutExpired, a traceback
        fetch.fetch(VERSION, s, say=lambda _: None)
    dest = tmp_path / "cache" / "166b92740753f996441b137e01544e50" / "images"
    assert f"did not finish within {tool.TIMEOUT} s" in str(info.value)
    assert f"`{tmp_path / 'dvc'} get /data/repo images --rev {VERSION['commit']} -o {dest}`" in str(info.value)
    assert list(dest.parent.iterdir()) == []


def test_the_command_to_run_by_hand_can_be_pasted_with_spaces_in_its_paths(tmp_path, monkeypatch):
    """DVC_DATA_CACHE and the data's repository under "My Data": each path one word of the command."""
    timeout = subprocess.TimeoutExpired(["dvc", "get"], tool.TIMEOUT)
    s = _fake_dvc(tmp_path, monkeypatch, get=lambda args: _partial(args, timeout))
    s = s.replace(dvc_data_cache=str(tmp_path / "My Data" / "cache"))
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(VERSION | {"repository": "/data/My Repo"}, s, say=lambda _: None)
    command = str(info.value).split("`")[1]
    words = shlex.split(command)
    assert words[words.index("get") + 1] == "/data/My Repo" and words[-1].startswith(str(tmp_path / "My Data"))
    line = str(fetch.refusal("failed to clone repo", VERSION, "/data/My Repo"))
    assert "`git ls-remote '/data/My Repo'`" in line


def _fetched(tmp_path, version=VERSION):
    """Settings whose DVC_DATA_CACHE already holds the version (so nothing is fetched)."""
    folder = tmp_path / "cache" / "166b92740753f996441b137e01544e50" / "images"
    (folder / "cats").mkdir(parents=True)
    return tiny_settings(tmp_path, dvc_command="/none", dvc_data_cache=str(tmp_path / "cache")), folder


def test_a_version_already_fetched_is_read_from_its_folder_and_the_setting_points_there(tmp_path):
    s, folder = _fetched(tmp_path)
    said = []
    values, fingerprint = fetch.data_version(
        VERSION | {"read": "cats"}, {"dataset": "images:/gone/images/cats"}, s, lambda v: "ab" * 32, said.append
    )
    assert values == {"dataset": f"images:{folder / 'cats'}"} and fingerprint == "ab" * 32
    assert said == [f"data: images at commit c7d0a16b0065 is already in {folder.parent}"]
    data_dir = VERSION | {"setting": "DATA_DIR", "read": "cats"}
    values, _ = fetch.data_version(data_dir, {"dataset": "mnist", "data_dir": "/gone"}, s, lambda v: "ab", said.append)
    assert values["data_dir"] == str(folder / "cats")


def _other(values):
    raise ReproduceError("the data differs from the run's: fingerprint 12, the run recorded 34")


def test_a_copy_fetched_earlier_that_is_not_the_run_s_data_is_named_to_be_fetched_anew(tmp_path):
    # A file deleted or edited in DVC_DATA_CACHE: the line blamed the .dvc file, and every reproduce
    # read the same damaged copy again.
    s, folder = _fetched(tmp_path)
    with pytest.raises(DataVersionError) as info:
        fetch.data_version(VERSION, {"dataset": "images:/x"}, s, _other, lambda _: None)
    line = str(info.value)
    assert line.startswith(f"images at commit c7d0a16b0065 (fetched earlier into {folder}): is not the run's data (")
    assert line.endswith(
        f"that copy may have been changed since it was fetched; delete {folder} and reproduce again to fetch it anew"
    )
    assert "git log" not in line


@pytest.mark.parametrize("workspace", ["matches", "differs"])
def test_a_version_that_is_not_the_run_s_data_is_refused_naming_the_dvc_file(tmp_path, monkeypatch, workspace):
    s = tiny_settings(tmp_path, dvc_command="/none", dvc_data_cache=str(tmp_path / "cache"))
    monkeypatch.setattr(fetch, "fetch", lambda version, settings, say: _fetched(tmp_path)[1])  # fetched just now
    with pytest.raises(DataVersionError) as info:
        fetch.data_version(VERSION | {"workspace": workspace}, {"dataset": "images:/x"}, s, _other, lambda _: None)
    line = str(info.value)
    assert line.startswith("images at commit c7d0a16b0065 (fetched into ") and "is not the run's data" in line
    if workspace == "matches":
        assert "images.dvc at commit c7d0a16b0065 names other content than the run read" in line
    else:
        assert "the run's data differed from its DVC version when it trained" in line
    assert "`git log -- images.dvc`" in line and "fingerprint 12, the run recorded 34" in line


@pytest.mark.parametrize("where", ["recorded", "in-config", "relative-in-config"])
def test_a_folder_remote_that_is_not_here_is_named_not_a_version_never_pushed(tmp_path, where):
    # An unmounted share: DVC says its files are missing, which read as "never pushed" (and told to push).
    gone = tmp_path / "share" / "dvc"
    repository = tmp_path / "repo"
    (repository / ".dvc").mkdir(parents=True)
    url = {"recorded": "", "in-config": str(gone), "relative-in-config": "../../share/dvc"}[where]
    (repository / ".dvc" / "config").write_text(f"[core]\n    remote = store\n['remote \"store\"']\n    url = {url}\n")
    version = VERSION | {"remote_url": str(gone)}
    line = str(fetch.refusal(tool.error_line(NOT_PUSHED_FILE), version, str(repository)))
    assert line.startswith(f"DVC remote {gone}: is a folder that does not exist on this machine"), line
    assert f"`dvc remote modify --local store url <where it is>` in {repository}" in line
    assert "never pushed" not in line
    gone.mkdir(parents=True)  # there, but without the version: never pushed
    assert "never pushed" in str(fetch.refusal(tool.error_line(NOT_PUSHED_FILE), version, str(repository)))


def test_a_git_url_that_does_not_answer_is_not_the_dvc_remote_s_refusal():
    # "Connection refused" of the git clone read as the DVC remote's: the line named the wrong server.
    stderr = (
        "ERROR: failed to get 'images' - SCM error: Failed to clone repo 'https://git.example.com/data.git' to "
        "'/tmp/x-clone': HTTPSConnectionPool(host='git.example.com'): Failed to establish a new connection: "
        "[Errno 111] Connection refused"
    )
    url = "https://git.example.com/data.git"
    line = str(fetch.refusal(tool.error_line(stderr), VERSION, url))
    assert line.startswith(f"the data's git repository {url}: cannot be read (") and "DVC remote" not in line
    assert f"`git ls-remote {url}`" in line and "put a clone of it at /data/repo" in line


def test_the_repository_is_the_recorded_folder_when_here_else_its_origin_without_the_mask(tmp_path):
    (tmp_path / ".git").mkdir()
    assert fetch._repository(VERSION | {"repository": str(tmp_path)}) == str(tmp_path)
    elsewhere = VERSION | {"repository": "/not/here", "git_remote": "https://***@git.example.com/data.git"}
    assert fetch._repository(elsewhere) == "https://git.example.com/data.git"
