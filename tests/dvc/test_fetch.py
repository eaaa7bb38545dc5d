"""train.dvc.fetch: every refusal of a data version is one line naming what is missing and its fix (no dvc run)."""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers import tiny_settings

from train.dvc import fetch, tool
from train.dvc.fetch import DataVersionError
from train.errors import DataError, ReproduceError

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


COMMIT = VERSION["commit"]


@pytest.mark.parametrize("missing", ["path", "commit"])
def test_a_version_without_its_path_or_its_commit_is_refused_before_anything_is_fetched(tmp_path, missing):
    s = tiny_settings(tmp_path, dvc_command="/none", dvc_data_cache=str(tmp_path / "cache"))
    version = VERSION | {missing: None}
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(version, s, say=pytest.fail)
    record = {"path": version["path"], "commit": version["commit"]}
    if missing == "commit":  # as recorded for a data repository that had no commit yet: no backup holds one
        assert str(info.value) == (
            f"data.version {record}: names no commit: the data's git repository had none when the run trained, so "
            "no version holds it; put the data the run read back where it read it, then reproduce again"
        )
    else:
        assert str(info.value) == f"data.version {record}: names no path or commit; restore manifest.json from a backup"


def test_no_dvc_command_is_named_by_its_setting_or_as_a_command(tmp_path, monkeypatch):
    s = tiny_settings(tmp_path, dvc_command=str(tmp_path / "no-dvc"), dvc_data_cache=str(tmp_path / "cache"))
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(VERSION, s, say=pytest.fail)
    problem = f"is not installed here, and images is not here as recorded; {tool.INSTALL}"
    assert str(info.value) == f"dvc {tmp_path / 'no-dvc'}: {problem}"
    # DVC_COMMAND left empty, and no .venv-dvc or dvc on PATH either.
    monkeypatch.setattr(tool, "OWN_VENV", tmp_path / "no-venv")
    monkeypatch.setattr(tool.shutil, "which", lambda name: None)
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(VERSION, s.replace(dvc_command=""), say=pytest.fail)
    assert str(info.value) == f"dvc command: {problem}"


def _dvc_get(tmp_path, monkeypatch, answers):
    """Settings whose `dvc get` writes a folder at its -o and exits with the next of `answers` (code, stderr);
    returns them and the list of every dvc call's arguments (the dvc command first)."""
    calls, answers = [], list(answers)

    def run(dvc, *args, **kw):
        calls.append((dvc, *args))
        code, stderr = answers.pop(0)
        if code == 0:
            out = Path(args[args.index("-o") + 1])
            (out / "cats").mkdir(parents=True)
            (out / "cats" / "1.png").write_bytes(b"png")
        return subprocess.CompletedProcess([dvc, *args], code, "", stderr)

    s = _fake_dvc(tmp_path, monkeypatch, get=pytest.fail)
    monkeypatch.setattr(tool, "run", run)
    return s, calls


def test_a_fetch_refused_then_fetched_is_renamed_into_place_from_its_own_temporary_name(tmp_path, monkeypatch):
    s, calls = _dvc_get(tmp_path, monkeypatch, [(1, NOT_PUSHED_FILE + "\n"), (0, "")])
    folder = tmp_path / "cache" / "166b92740753f996441b137e01544e50"
    part = str(folder / f".images.part-{os.getpid()}")
    said = []
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(VERSION, s, say=said.append)
    assert str(info.value) == (
        "images (hash 166b92740753f996441b137e01544e50.dir): is not on the DVC remote s3://bucket/dvc: that "
        "version was never pushed (unexpected error - [Errno 2] No storage files available: 'f.npz'); on the "
        "machine that has it: `git checkout c7d0a16b0065 && dvc push images.dvc` in /data/repo"
    )
    assert list(folder.iterdir()) == []  # the version's folder stays, empty: the next fetch goes into it
    assert fetch.fetch(VERSION, s, say=said.append) == folder / "images"
    assert [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*"))] == [
        "images",
        "images/cats",
        "images/cats/1.png",
    ]
    get = (str(tmp_path / "dvc"), "get", "/data/repo", "images", "--rev", COMMIT, "-o", part)
    assert calls == [get, get]
    assert said == ["data: fetching images at commit c7d0a16b0065 from the DVC remote of /data/repo ..."] * 2


def test_a_version_another_reproduce_fetched_meanwhile_is_kept_and_the_own_copy_removed(tmp_path, monkeypatch):
    dest = tmp_path / "cache" / "166b92740753f996441b137e01544e50" / "images"

    def get(args):
        _fake = Path(args[args.index("-o") + 1])
        (_fake / "mine").mkdir(parents=True)
        (dest / "theirs").mkdir(parents=True)  # renamed into place while this get ran
        return subprocess.CompletedProcess(args, 0, "", "")

    s = _fake_dvc(tmp_path, monkeypatch, get=get)
    assert fetch.fetch(VERSION, s, say=lambda _: None) == dest
    assert sorted(p.name for p in dest.parent.iterdir()) == ["images"] and (dest / "theirs").is_dir()


def test_a_file_fetch_stopped_part_way_leaves_no_partial_file(tmp_path, monkeypatch):
    def get(args):
        Path(args[args.index("-o") + 1]).write_bytes(b"part of an npz")
        raise KeyboardInterrupt

    s = _fake_dvc(tmp_path, monkeypatch, get=get)
    with pytest.raises(KeyboardInterrupt):
        fetch.fetch(VERSION | {"path": "data/mnist.npz"}, s, say=lambda _: None)
    assert list((tmp_path / "cache" / "166b92740753f996441b137e01544e50").iterdir()) == []


def test_a_fetch_that_times_out_is_this_whole_line(tmp_path, monkeypatch):
    timeout = subprocess.TimeoutExpired(["dvc", "get"], tool.TIMEOUT)
    s = _fake_dvc(tmp_path, monkeypatch, get=lambda args: _partial(args, timeout))
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(VERSION, s, say=lambda _: None)
    dest = tmp_path / "cache" / "166b92740753f996441b137e01544e50" / "images"
    assert str(info.value) == (
        f"dvc get /data/repo images --rev c7d0a16b0065: did not finish within {tool.TIMEOUT} s; fetch it by hand "
        f"(no time limit): `{tmp_path / 'dvc'} get /data/repo images --rev {COMMIT} -o {dest}`, then reproduce again"
    )


def test_a_dvc_data_cache_that_cannot_be_written_is_this_whole_line(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    cache = tmp_path / "a-file" / "cache"
    s = _fake_dvc(tmp_path, monkeypatch, get=lambda args: pytest.fail("fetched"))
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(VERSION, s.replace(dvc_data_cache=str(cache)), say=lambda _: None)
    assert str(info.value) == (
        f"DVC_DATA_CACHE {cache}: cannot be written (Not a directory: {cache / '166b92740753f996441b137e01544e50'}); "
        "set DVC_DATA_CACHE to a folder this user can write, then reproduce again"
    )


def test_the_settings_point_at_what_the_run_read_in_the_fetched_copy_and_are_fingerprinted(tmp_path):
    s, folder = _fetched(tmp_path)
    read = []

    def fingerprint(values):
        read.append(values)
        return "ab" * 32

    # A version recorded without `read` is the tracked folder itself; a colon in the old path is not the kind's.
    values, _ = fetch.data_version(
        {k: v for k, v in VERSION.items() if k != "read"}, {"dataset": "images:/old:x/images"}, s, fingerprint, str
    )
    assert values == {"dataset": f"images:{folder}"} and read == [values]
    # DATA_DIR that is a tracked file (data/mnist.npz): DATA_DIR is the folder it was fetched into.
    (folder.parent / "mnist.npz").write_bytes(b"npz")
    data_dir = VERSION | {"setting": "DATA_DIR", "path": "data/mnist.npz"}
    values, _ = fetch.data_version(data_dir, {"dataset": "mnist", "data_dir": "/gone"}, s, fingerprint, str)
    assert values == {"dataset": "mnist", "data_dir": str(folder.parent)} and read[-1] == values


def test_the_folder_of_a_version_is_its_hash_made_a_file_name_else_its_commit(tmp_path):
    s = tiny_settings(tmp_path, dvc_data_cache=str(tmp_path / "cache"))
    assert fetch._dest(VERSION | {"hash": None}, s) == tmp_path / "cache" / COMMIT / "images"
    etag = 'a1.b2/c3"' + "d" * 70 + ".dir"  # any hash a remote gives: one folder of 64 characters at most
    assert fetch._dest(VERSION | {"hash": etag}, s) == tmp_path / "cache" / ("a1-b2-c3-" + "d" * 55) / "images"


def test_the_recorded_repository_here_is_used_even_when_an_origin_was_recorded(tmp_path):
    (tmp_path / ".git").mkdir()
    here = VERSION | {"repository": str(tmp_path), "git_remote": "https://git.example.com/data.git"}
    assert fetch._repository(here) == str(tmp_path)
    (tmp_path / ".git").rmdir()
    assert fetch._repository(here) == "https://git.example.com/data.git"


CREDENTIALS = (
    "set its credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or `dvc remote modify --local {} ...`) and "
    "check that it answers, then reproduce again"
)


@pytest.mark.parametrize(
    ("stderr", "changes", "line"),
    [
        (
            FORBIDDEN,
            {},
            "DVC remote s3://bucket/dvc: cannot be reached or refuses the credentials (unexpected error - Forbidden: "
            "An error occurred (403) when calling the HeadObject operation: Forbidden); " + CREDENTIALS.format("store"),
        ),
        (
            NO_ENDPOINT,
            {"remote": None, "remote_url": None},
            "DVC remote the project's default remote: cannot be reached or refuses the credentials (unexpected error - "
            'Could not connect to the endpoint URL: "http://***@127.0.0.1:1/dvc/files/md5/b0"); '
            + CREDENTIALS.format("<remote>"),
        ),
        (
            NO_REPOSITORY,
            {},
            "the data's git repository /data/repo: cannot be read (failed to get 'images' from '/data/repo' - "
            "/data/repo is not a git repository); put a clone of it that has commit c7d0a16b0065 back at /data/repo "
            "(the run recorded no origin URL), then reproduce again",
        ),
        (
            "ERROR: something new",
            {"remote_url": "/mnt/share-not-mounted/dvc"},  # a folder remote not here, but not DVC's complaint
            "dvc get /data/repo images --rev c7d0a16b0065: failed: something new; run it by hand with -v to see "
            "why, mend that, then reproduce again",
        ),
        (
            NOT_PUSHED_FILE,
            {"remote_url": "../share/dvc"},  # relative to a repository that is not here: nothing to check
            "images (hash 166b92740753f996441b137e01544e50.dir): is not on the DVC remote ../share/dvc: that version "
            "was never pushed (unexpected error - [Errno 2] No storage files available: 'f.npz'); on the machine "
            "that has it: `git checkout c7d0a16b0065 && dvc push images.dvc` in /data/repo",
        ),
        (
            NOT_PUSHED_FILE,
            {"remote_url": "/mnt/share-not-mounted/dvc"},  # the repository is no folder here: no config to mend
            "DVC remote /mnt/share-not-mounted/dvc: is a folder that does not exist on this machine (a share not "
            "mounted, or moved); mount it or put it back there, then reproduce again",
        ),
    ],
    ids=["forbidden", "no-endpoint-default-remote", "no-repository", "unknown", "relative-remote", "folder-remote"],
)
def test_each_refusal_is_this_whole_line(stderr, changes, line):
    assert str(fetch.refusal(tool.error_line(stderr), VERSION | changes, "/data/repo")) == line


def _repo(tmp_path, config: str) -> Path:
    repository = tmp_path / "repo"
    (repository / ".dvc").mkdir(parents=True)
    (repository / ".dvc" / "config").write_text(config)
    return repository


def _not_pushed(version, repository) -> str:
    return str(fetch.refusal(tool.error_line(NOT_PUSHED_FILE), version, str(repository)))


def test_the_folder_remote_checked_is_the_named_one_of_the_repository_s_config_else_its_default(tmp_path):
    gone = tmp_path / "share" / "dvc"
    config = f"[core]\n    remote = store\n['remote \"store\"']\n    url = s3://bucket/dvc\n['remote \"share\"']\n    url = {gone}\n"
    repository = _repo(tmp_path, config)
    shared = VERSION | {"remote": "share", "remote_url": None}
    assert _not_pushed(shared, repository) == (
        f"DVC remote {gone}: is a folder that does not exist on this machine (a share not mounted, or moved); mount "
        f"it or put it back there, or `dvc remote modify --local share url <where it is>` in {repository}, then "
        "reproduce again"
    )
    # The default remote, an S3 bucket: never taken for a folder (as `<repo>/.dvc/s3:/bucket/dvc`).
    assert "never pushed" in _not_pushed(VERSION | {"remote": None, "remote_url": None}, repository)
    assert "never pushed" in _not_pushed(VERSION, repository)
    (repository / ".dvc" / "config").write_text(config.replace("remote = store", "remote = share"))
    line = _not_pushed(VERSION | {"remote": None, "remote_url": None}, repository)
    assert line.startswith(f"DVC remote {gone}: is a folder") and "--local <remote> url" in line


def test_a_relative_folder_remote_is_read_from_the_repository_s_dvc_folder(tmp_path):
    repository = _repo(tmp_path, "[core]\n    remote = store\n['remote \"store\"']\n    url = mnt/dvc\n")
    line = _not_pushed(VERSION | {"remote_url": None}, repository)
    assert line.startswith(f"DVC remote {repository / '.dvc' / 'mnt' / 'dvc'}: is a folder that does not exist"), line


def test_a_repository_whose_config_names_no_remote_url_has_no_folder_remote_to_blame(tmp_path):
    repository = _repo(tmp_path, "[core]\n    remote = store\n")
    assert "that version was never pushed" in _not_pushed(VERSION | {"remote_url": None}, repository)


def _changed(values):
    raise ReproduceError("the data differs from the run's: fingerprint 12: " + "x" * 300)


@pytest.mark.parametrize("earlier", [True, False])
def test_a_version_fetched_from_a_run_whose_data_differed_is_this_whole_line(tmp_path, monkeypatch, earlier):
    # Fetched earlier or just now, a run whose data was in no version: the line says so, not "changed since".
    s, folder = _fetched(tmp_path)
    if not earlier:
        s = s.replace(dvc_data_cache=str(tmp_path / "empty"))
        monkeypatch.setattr(fetch, "fetch", lambda version, settings, say: folder)
    with pytest.raises(DataVersionError) as info:
        fetch.data_version(VERSION | {"workspace": "differs"}, {"dataset": "images:/x"}, s, _changed, str)
    assert str(info.value) == (
        f"images at commit c7d0a16b0065 (fetched into {folder}): is not the run's data: the run's data differed from "
        "its DVC version when it trained (its manifest says so): no version holds it (fingerprint 12: "
        + "x" * 184  # 200 characters of its reason
        + "); find the commit whose images.dvc holds it (`git log -- images.dvc`), or point DATASET/DATA_DIR at that data"
    )


def test_a_reason_without_a_colon_is_quoted_whole(tmp_path):
    s, folder = _fetched(tmp_path)

    def unreadable(values):
        raise DataError("no image could be decoded")

    with pytest.raises(DataVersionError) as info:
        fetch.data_version(VERSION, {"dataset": "images:/x"}, s, unreadable, str)
    assert "is not the run's data (no image could be decoded): that copy may have been changed" in str(info.value)


def test_a_dvc_data_cache_refused_without_a_file_name_names_the_version_s_folder(tmp_path, monkeypatch):
    def full(self, parents=False, exist_ok=False):
        raise OSError(errno.ENOSPC, "No space left on device")

    s = _fake_dvc(tmp_path, monkeypatch, get=lambda args: pytest.fail("fetched"))
    monkeypatch.setattr(fetch.Path, "mkdir", full)
    with pytest.raises(DataVersionError) as info:
        fetch.fetch(VERSION, s, say=lambda _: None)
    folder = tmp_path / "cache" / "166b92740753f996441b137e01544e50"
    assert f"cannot be written (No space left on device: {folder});" in str(info.value)
