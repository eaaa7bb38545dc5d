"""cli: the command-line edge in-process (no TensorFlow): commands, exit codes, one-line errors, DEBUG."""

from __future__ import annotations

import sys
import types
from dataclasses import fields

import pytest

from train import cli, config
from train.config import Settings
from train.errors import EXIT_CODES, ConfigError
from train.rundir import RunNotFound


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No settings from the caller's environment or a .env in the working directory."""
    for f in fields(Settings):
        monkeypatch.delenv(f.name.upper(), raising=False)
    monkeypatch.chdir(tmp_path)


def test_settings_table_and_env_example(capsys):
    assert cli.main(["settings", "--format", "table"]) == 0
    assert capsys.readouterr().out == config.settings_table() + "\n"
    assert cli.main(["settings", "--format", "env-example"]) == 0
    assert capsys.readouterr().out == config.env_example() + "\n"


def test_settings_resolved_uses_env_file_and_environment(tmp_path, capsys, monkeypatch):
    (tmp_path / "my.env").write_text("BATCH_SIZE=64\nSEED=7\n")
    monkeypatch.setenv("SEED", "8")
    assert cli.main(["settings", "--env-file", "my.env"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "BATCH_SIZE=64" in out and "SEED=8" in out and len(out) == len(fields(Settings))


def test_a_bad_setting_value_is_one_line_and_exit_2(capsys):
    assert cli.main(["--batch-size", "abc"]) == 2  # `fit` is the default command
    err = capsys.readouterr().err
    assert err == "ConfigError: BATCH_SIZE='abc' is not valid: expected a whole number, e.g. 128\n"


def test_an_unknown_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["fit", "--no-such-flag"])
    assert info.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["export", "predict"])
def test_an_unknown_run_is_exit_2(tmp_path, capsys, command):
    argv = [command, "20990101-000000-zzzz", *(["x.png"] if command == "predict" else []),
            "--runs-dir", str(tmp_path / "runs")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("RunNotFound: run '20990101-000000-zzzz' not found") and err.count("\n") == 1


def test_runs_lists_an_empty_directory(tmp_path, capsys):
    assert cli.main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.startswith("no runs yet")


def test_debug_shows_the_traceback(monkeypatch, tmp_path):
    with pytest.raises(ConfigError):
        cli.main(["fit", "--debug", "--batch-size", "abc"])
    monkeypatch.setenv("DEBUG", "1")
    with pytest.raises(RunNotFound):
        cli.main(["export", "nope", "--runs-dir", str(tmp_path)])
    assert cli.main(["fit", "--no-debug", "--batch-size", "abc"]) == 2  # the flag wins over the environment


def test_debug_from_the_env_file_even_when_another_setting_is_invalid(tmp_path):
    (tmp_path / "dbg.env").write_text("DEBUG=true\nBATCH_SIZE=abc\n")
    with pytest.raises(ConfigError):
        cli.main(["fit", "--env-file", "dbg.env"])
    with pytest.raises(ConfigError):
        cli.main(["fit", "--env-file=dbg.env"])


def test_a_named_env_file_that_is_missing_is_exit_2(capsys):
    assert cli.main(["settings", "--env-file", "missing.env"]) == 2
    assert "ENV_FILE" in capsys.readouterr().err


@pytest.mark.parametrize("status, code", [("completed", 0), ("interrupted", 75), ("budget", 75), ("odd", 1)])
def test_fit_status_becomes_the_exit_code(monkeypatch, status, code):
    calls = []

    def train(settings, force, restart=False):
        calls.append((settings.epochs, force))
        return types.SimpleNamespace(status=status)

    monkeypatch.setitem(sys.modules, "train.fit", types.SimpleNamespace(train=train))
    assert cli.main(["--epochs", "5", "--force"]) == code
    assert calls == [(5, True)]


def test_help_lists_every_exit_code(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(f"{k:>3}  {v}" in out for k, v in EXIT_CODES.items())


def test_every_setting_has_a_flag():
    fit = cli.build_parser()._subparsers._group_actions[0].choices["fit"]
    dests = {a.dest for a in fit._actions}
    assert {f.name for f in fields(Settings)} <= dests
