"""files: watchers of atomic writes, UTF-8 whatever the locale, a directory fsync the file system refuses,
a temp file removed by another cleaner, kernel file systems, and the setting ensure_writable names."""

from __future__ import annotations

import errno
import locale
import os
from pathlib import Path

import pytest

from train.errors import StorageError
from train.run import files
from train.run.files import (
    atomic_write,
    clean_stale_temp,
    ensure_writable,
    in_kernel_files,
    read_json,
    storage_error,
    watch_writes,
    write_text,
)


def test_a_watcher_is_called_with_each_written_path_until_stopped_and_stopping_twice_is_harmless(tmp_path):
    seen: list[Path] = []
    stop = watch_writes(seen.append)
    try:
        write_text(tmp_path / "a.json", "{}\n")
        atomic_write(tmp_path / "b.npz", lambda p: p.write_bytes(b"x"))
    finally:
        stop()
    stop()  # already stopped: nothing to remove, no error
    write_text(tmp_path / "c.json", "{}\n")
    assert seen == [tmp_path / "a.json", tmp_path / "b.npz"]
    assert seen.append not in files._WATCHERS


@pytest.fixture
def ascii_locale():
    """A host whose locale encoding is ASCII: what the file says must not depend on it."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        assert locale.getpreferredencoding(False) != "UTF-8"
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, old)


def test_text_is_written_and_read_as_utf8_whatever_the_locale(tmp_path, ascii_locale):
    write_text(tmp_path / "note.txt", "café ✓\n")
    assert (tmp_path / "note.txt").read_bytes() == "café ✓\n".encode()
    (tmp_path / "config.json").write_bytes('{"name": "café ✓"}'.encode())
    assert read_json(tmp_path / "config.json") == {"name": "café ✓"}


def test_a_directory_fsync_the_file_system_refuses_does_not_fail_the_write(tmp_path, monkeypatch):
    import stat

    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert write_text(tmp_path / "a.json", "{}\n") == tmp_path / "a.json"
    assert (tmp_path / "a.json").read_text() == "{}\n"


def test_a_temp_file_another_cleaner_removed_first_is_no_error(tmp_path, monkeypatch):
    stale = tmp_path / f"a{files.TMP_MARK}1234.json"
    stale.write_text("half")
    real_is_file = Path.is_file

    def is_file_then_gone(self):  # another process removes it between the check and the unlink
        found = real_is_file(self)
        self.unlink()
        return found

    monkeypatch.setattr(Path, "is_file", is_file_then_gone)
    assert clean_stale_temp(tmp_path) == [stale]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "path, kernel",
    [("/proc/runs", True), ("/proc", True), ("/sys/runs", True), ("/procs/runs", False), ("/srv/proc/runs", False)],
)
def test_in_kernel_files_is_only_under_proc_or_sys(path, kernel):
    assert in_kernel_files(path) is kernel


def test_a_read_only_file_system_outside_runs_dir_names_the_setting_that_chose_the_folder():
    exc = storage_error("/cache/x", OSError(errno.EROFS, "raw"), in_docker=False, setting="STORE_CACHE")
    assert str(exc) == "cannot write /cache/x: the file system is read-only: point STORE_CACHE elsewhere"


def test_ensure_writable_names_the_setting_it_is_given(tmp_path, monkeypatch):
    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(StorageError) as info:
        ensure_writable(tmp_path / "cache", setting="STORE_CACHE")
    assert str(info.value) == (
        f"cannot write {tmp_path / 'cache'}: the disk is full: free space or point STORE_CACHE at a larger volume"
    )


def test_a_kernel_folder_refused_without_a_reason_names_the_exception(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise OSError("refused")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(StorageError) as info:
        ensure_writable("/sys/runs")
    assert str(info.value) == "cannot write /sys/runs: refused: point RUNS_DIR at a folder that can be made"
