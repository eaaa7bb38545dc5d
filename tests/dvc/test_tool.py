"""train.dvc.tool: which dvc command runs, and DVC's error line with every URL masked."""

from __future__ import annotations

import subprocess

from train.dvc import tool


def test_dvc_command_first_then_the_own_environment_then_path(tmp_path, monkeypatch):
    given = tmp_path / "my-dvc"
    given.write_text("#!/bin/sh\n")
    given.chmod(0o755)
    assert tool.find(str(given)) == str(given)
    assert tool.find(str(tmp_path / "missing")) is None  # a DVC_COMMAND that is not there is not replaced
    own = tmp_path / "venv"
    (own / "bin").mkdir(parents=True)
    monkeypatch.setattr(tool, "OWN_VENV", own)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert tool.find("") is None
    (own / "bin" / "dvc").write_text("")
    assert tool.find("") == str(own / "bin" / "dvc")
    (own / "bin" / "dvc").unlink()
    (tmp_path / "dvc").write_text("#!/bin/sh\n")
    (tmp_path / "dvc").chmod(0o755)
    assert tool.find("") == str(tmp_path / "dvc")


def test_the_error_line_is_dvc_s_error_without_its_password():
    stderr = (
        "noise\nERROR: failed - cannot reach https://me:hunter2@dvc.example.com/store?sig=abc\n\nHaving any troubles?\n"
    )
    assert tool.error_line(stderr) == "failed - cannot reach https://***@dvc.example.com/store?***"
    assert tool.error_line("") == "no message"


def test_a_command_that_answers_a_version_is_dvc_and_another_is_not(tmp_path):
    fake = tmp_path / "dvc"
    fake.write_text("#!/bin/sh\necho 3.67.1\n")
    fake.chmod(0o755)
    assert tool.not_dvc(str(fake)) is None
    fake.write_text("#!/bin/sh\n")
    assert "not a DVC version" in tool.not_dvc(str(fake))
    assert "No such file" in tool.not_dvc(str(tmp_path / "missing"))


def test_a_dvc_slow_to_answer_its_version_is_not_called_another_program(monkeypatch):
    """A timeout said "not a working DVC command" with "install DVC" as the fix, on a loaded machine."""

    def slow(dvc, *args, **kw):
        raise subprocess.TimeoutExpired([dvc, *args], kw.get("timeout", tool.TIMEOUT))

    monkeypatch.setattr(tool, "run", slow)
    assert tool.not_dvc("/usr/bin/dvc") is None
