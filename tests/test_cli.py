"""cli: the command-line edge in-process (no TensorFlow): commands, exit codes, one-line errors, DEBUG."""

from __future__ import annotations

import io
import subprocess
import sys
import types
from dataclasses import fields
from pathlib import Path

import pytest

from train import cli, config
from train.config import Settings
from train.errors import EXIT_CODES, ModelError, SecondInterrupt

PROJECT_ROOT = Path(__file__).resolve().parents[1]


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
    assert "BATCH_SIZE=64" in out and "SEED=8" in out and len(out) == 1 + len(fields(Settings))
    assert "# EPOCHS=3" in out and "# RESUME=" in out  # not set: the defaults, commented out


def test_settings_resolved_takes_the_setting_flags_fit_takes_and_writes_booleans_as_env_does(capsys, monkeypatch):
    monkeypatch.setenv("SEED", "8")
    assert cli.main(["settings", "--seed", "9", "--no-export"]) == 0  # flags win over the environment
    out = capsys.readouterr().out.splitlines()
    assert (
        "SEED=9" in out and "EXPORT=false" in out and "# SMOKE=false" in out and len(out) == 1 + len(fields(Settings))
    )
    assert cli.main(["settings", "--seed", "-1"]) == 2  # refused as fit refuses it
    assert capsys.readouterr().err.startswith("ConfigError: SEED=-1 is not valid")
    assert cli.main(["settings", "--format", "table", "--seed", "9"]) == 2  # the defaults' formats: not ignored
    assert "--format table prints every setting at its default: --seed applies" in capsys.readouterr().err


def test_settings_saved_as_an_env_file_read_back_as_they_were_set(tmp_path, capsys):
    npz = tmp_path / "my data #1.npz"
    npz.write_bytes(b"")
    odd = {"dataset": f"npz:{npz}", "data_dir": '"q" it\'s # \\ x', "run_name": "r1"}
    flags = [x for k, v in odd.items() for x in (f"--{k.replace('_', '-')}", v)]
    assert cli.main(["settings", *flags, "--runs-dir", "${HOME}/runs"]) == 0
    (tmp_path / "saved.env").write_text(capsys.readouterr().out)
    back = config.load_settings({}, env_file=tmp_path / "saved.env", environ={})
    assert {k: getattr(back, k) for k in odd} == odd
    assert config.given(back) == set(odd)  # a ${...} is commented out, with why (a masked secret too: tests/sweep)
    assert "# RUNS_DIR=${HOME}/runs  # a .env would expand its ${...}" in (tmp_path / "saved.env").read_text()


def test_settings_resolved_leaves_the_chosen_pair_commented_out(tmp_path, capsys, monkeypatch):
    """Saved as a .env, the output must not fix the pair a new run would choose for its machine."""
    assert cli.main(["settings"]) == 0
    out = capsys.readouterr().out.splitlines()
    pair = [line for line in out if line.startswith(("# BATCH_SIZE=", "# LEARNING_RATE="))]
    assert [p.split()[1] for p in pair] == ["BATCH_SIZE=512", "LEARNING_RATE=0.007"]
    assert "a new run chooses" in pair[0] and len(out) == 1 + len(fields(Settings))
    (tmp_path / "saved.env").write_text("\n".join(out) + "\n")
    assert not config.given(config.load_settings({}, env_file="saved.env"))  # nothing set: RESUME neither
    # A line uncommented is a valid setting: the note after it is a comment too.
    (tmp_path / "pinned.env").write_text(pair[0][2:] + "\n")
    assert config.load_settings({}, env_file="pinned.env").batch_size == 512
    monkeypatch.setenv("LEARNING_RATE", "0.01")
    assert cli.main(["settings"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "# BATCH_SIZE=512" in out and "LEARNING_RATE=0.01" in out  # one set: both fixed, 512 its default


def test_a_bad_setting_value_is_one_line_and_exit_2(capsys):
    assert cli.main(["--batch-size", "abc"]) == 2  # `fit` is the default command
    err = capsys.readouterr().err
    assert err == "ConfigError: BATCH_SIZE='abc' is not valid: expected a whole number, e.g. 512\n"


def test_an_unknown_flag_is_a_usage_error(capsys):
    assert cli.main(["fit", "--no-such-flag"]) == 2
    assert capsys.readouterr().err == (
        "UsageError: python -m train fit: unrecognized arguments: --no-such-flag; "
        "`python -m train fit --help` lists what it takes\n"
    )


def test_a_value_after_an_on_off_flag_names_the_two_forms(capsys):
    assert cli.main(["fit", "--export", "false"]) == 2  # the table's true/false are what .env takes
    assert capsys.readouterr().err == (
        "UsageError: python -m train fit: unrecognized arguments: false (--export takes no value: give --export or "
        "--no-export); `python -m train fit --help` lists what it takes\n"
    )
    assert cli.main(["fit", "--epochs", "2", "false"]) == 2  # no switch before it: no such hint
    assert "takes no value" not in capsys.readouterr().err
    assert cli.main(["fit", "--run-name", "false", "--no-export", "0"]) == 2  # the word after the switch
    assert "0 (--no-export takes no value: give --export or --no-export)" in capsys.readouterr().err
    assert cli.main(["runs", "--json", "true"]) == 2  # a flag with no --no- form
    assert "true (--json takes no value: give --json, or leave it out)" in capsys.readouterr().err
    assert cli.main(["fit", "--deterministic=true"]) == 2
    assert "(an on/off flag takes no value: give --deterministic or --no-deterministic)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, command",
    [
        (["predict", "latest"], "predict"),  # a missing argument
        (["settings", "--format", "xml"], "settings"),  # a refused choice
        (["--epochs"], "fit"),  # a flag without its value
        (["runs", "extra"], "runs"),  # an argument the command does not take
    ],
)
def test_every_mistake_on_the_command_line_is_one_line_naming_the_command(capsys, argv, command):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"UsageError: python -m train {command}: ") and err.count("\n") == 1, err
    assert f"`python -m train {command} --help`" in err


@pytest.mark.parametrize("command", ["export", "predict"])
def test_an_unknown_run_is_exit_2(tmp_path, capsys, command):
    argv = [
        command,
        "20990101-000000-zzzz",
        *(["x.png"] if command == "predict" else []),
        "--runs-dir",
        str(tmp_path / "runs"),
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("RunNotFound: run '20990101-000000-zzzz' not found") and err.count("\n") == 1


def test_runs_lists_an_empty_directory_and_names_one_that_does_not_exist(tmp_path, capsys):
    assert cli.main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("no runs yet") and err == (
        f"(RUNS_DIR {tmp_path / 'runs'} does not exist: check its spelling, or train to make it)\n"
    )
    (tmp_path / "runs").mkdir()
    assert cli.main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("no runs yet") and err == ""
    assert cli.main(["runs", "--runs-dir", "/proc/no-runs-here"]) == 0  # training could not make it either
    assert capsys.readouterr().err.endswith("or point RUNS_DIR at a folder that can be made)\n")
    run = tmp_path / "runs" / "20260101-000000-000001"
    run.mkdir()
    (run / "config.json").write_text("{}")
    assert cli.main(["runs", "--runs-dir", str(run)]) == 0  # a run given as RUNS_DIR
    assert capsys.readouterr().err == (
        f"(RUNS_DIR {run} is a run itself: point RUNS_DIR at the folder that holds it, {run.parent.resolve()})\n"
    )


def test_debug_adds_the_traceback_and_keeps_the_exit_code(monkeypatch, tmp_path, capsys):
    assert cli.main(["fit", "--debug", "--batch-size", "abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.endswith("ConfigError: BATCH_SIZE='abc' is not valid: expected a whole number, e.g. 512\n")
    monkeypatch.setenv("DEBUG", "1")
    assert cli.main(["export", "nope", "--runs-dir", str(tmp_path)]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert cli.main(["fit", "--no-debug", "--batch-size", "abc"]) == 2  # the flag wins over the environment
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["export", "nope"], ["predict", "nope", "a.png"], ["report", "nope"], ["reproduce", "nope", "--local"]]
)
def test_every_command_that_reads_runs_takes_debug_as_the_exit_codes_say(tmp_path, capsys, argv):
    argv = [*argv, "--runs-dir", str(tmp_path)]
    assert cli.main([*argv, "--debug"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "\nRunNotFound: run 'nope' not found" in err
    assert cli.main([*argv, "--no-debug"]) == 2
    assert capsys.readouterr().err.startswith("RunNotFound: run 'nope' not found")


def test_every_command_takes_debug_and_no_debug_as_the_readme_says():
    """The GPU check too: `check --require-gpu --debug` shows the traceback of the NoGPUError it exits with."""
    import argparse

    parser = cli.build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(cli.COMMANDS)
    for name, command in sub.choices.items():
        assert {"--debug", "--no-debug"} <= set(command._option_string_actions), name


def test_debug_from_the_env_file_even_when_another_setting_is_invalid(tmp_path, capsys):
    (tmp_path / "dbg.env").write_text("DEBUG=true\nBATCH_SIZE=abc\n")
    assert cli.main(["fit", "--env-file", "dbg.env"]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert cli.main(["fit", "--env-file=dbg.env"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_a_named_env_file_that_is_missing_is_exit_2(capsys):
    assert cli.main(["settings", "--env-file", "missing.env"]) == 2
    assert "ENV_FILE" in capsys.readouterr().err


@pytest.mark.parametrize("status, code", [("completed", 0), ("interrupted", 75), ("budget", 75), ("odd", 1)])
def test_fit_status_becomes_the_exit_code(monkeypatch, status, code):
    calls = []

    def train(settings, force, restart=False, **_kw):
        calls.append((settings.epochs, force))
        return types.SimpleNamespace(status=status)

    monkeypatch.setattr("train.train", train)
    assert cli.main(["--epochs", "5", "--force"]) == code
    assert calls == [(5, True)]


def test_help_lists_every_exit_code(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(f"{k:>3}  {v}" in out for k, v in EXIT_CODES.items())


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_every_commands_help_is_printed(capsys, command):
    # argparse formats each help text with %: a setting's "90%" must not break `fit --help`.
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0 and f"usage: python -m train {command}" in capsys.readouterr().out


def test_a_word_that_is_no_command_is_one_line_naming_the_commands(capsys):
    """A command this template does not have (`serve` in a fork without that extra) is not taken for
    arguments of `fit`, whose flags it would then be matched against."""
    assert cli.main(["nosuchcommand", "RUN", "--port", "8501"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"UsageError: python -m train: 'nosuchcommand' is not a command here (the commands: {', '.join(cli.COMMANDS)}); "
        "`python -m train --help` lists what it takes\n"
    )


def test_a_deleted_extras_command_is_not_taken_for_the_other_one(monkeypatch, capsys):
    """`serve` and `sweep` look alike: in a fork without one, its name is not a misspelling of the other."""
    for gone in ("serve", "sweep"):
        monkeypatch.setattr(cli, "COMMANDS", tuple(c for c in cli.COMMANDS if c != gone))
        assert cli._no_command(gone)
    monkeypatch.undo()
    assert not cli._no_command("rnus") and not cli._no_command("reprodce")  # misspellings: fit's to name


def test_every_setting_has_a_flag():
    fit = cli.build_parser()._subparsers._group_actions[0].choices["fit"]
    dests = {a.dest for a in fit._actions}
    assert {f.name for f in fields(Settings)} <= dests


@pytest.mark.parametrize("command", ["export", "predict"])
def test_export_and_predict_keep_tensorflows_cpp_start_up_lines_off_the_console_like_fit(
    tmp_path, monkeypatch, command
):
    import os

    import train.results.export
    import train.results.predict

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "")  # so that monkeypatch restores the caller's value
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    run = tmp_path / "runs" / "20260101-000000-abcd"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    seen = []  # TF_CPP_MIN_LOG_LEVEL when the command would import TensorFlow
    monkeypatch.setattr(
        train.results.export,
        "export_run",
        lambda r, **kw: seen.append(os.environ.get("TF_CPP_MIN_LOG_LEVEL")) or {"savedmodel": "s", "max_abs_diff": 0.0},
    )
    monkeypatch.setattr(
        train.results.predict,
        "predict_files",
        lambda r, f, runs_dir=None: (
            seen.append(os.environ.get("TF_CPP_MIN_LOG_LEVEL")) or [{"file": "a.png", "class": "0", "probability": 1.0}]
        ),
    )
    argv = [command, run.name, *(["a.png"] if command == "predict" else []), "--runs-dir", str(tmp_path / "runs")]
    assert cli.main(argv) == 0
    assert seen == ["2"]


@pytest.mark.parametrize("command", ["export", "predict"])
def test_latest_for_export_and_predict_is_the_newest_run_with_weights_and_a_line_says_which(
    tmp_path, monkeypatch, capsys, command
):
    import train.results.export
    import train.results.predict

    runs = tmp_path / "runs"
    trained = runs / "20260101-000000-aaaa"
    failed = runs / "20260102-000000-bbbb"  # the newest run failed before an epoch ended
    for run in (trained, failed):
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")
    (trained / "best.weights.h5").write_bytes(b"w")
    seen = []
    monkeypatch.setattr(
        train.results.export, "export_run", lambda r, **kw: seen.append(r) or {"savedmodel": "s", "max_abs_diff": 0.0}
    )
    monkeypatch.setattr(
        train.results.predict,
        "predict_files",
        lambda r, f, runs_dir=None: seen.append(r) or [{"file": "a.png", "class": "0", "probability": 1.0}],
    )
    argv = [command, "latest", *(["a.png"] if command == "predict" else []), "--runs-dir", str(runs)]
    assert cli.main(argv) == 0
    assert seen == [trained]
    what = "weights" if command == "export" else "weights or an export"
    line = f"latest: run {trained.name}, the newest run with {what} (newer, without: {failed.name})"
    assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize(
    "argv, command",
    [
        (["fit"], "python -m train fit --resume R"),
        (
            ["fit", "--epochs", "5", "--lr-schedule", "cosine"],
            "python -m train fit --epochs 5 --lr-schedule cosine --resume R",
        ),
        (["fit", "--resume", "old", "--restart", "--force"], "python -m train fit --force --resume R"),
        (["fit", "--resume=auto", "--run-name", "a b"], "python -m train fit --run-name 'a b' --resume R"),
    ],
)
def test_the_command_that_continues_a_stopped_run_is_the_same_command_with_resume(argv, command):
    from train.commands import interpreter
    from train.commands.fit import continue_command

    assert continue_command(interpreter(["/usr/bin/pytest", "-q"]) + argv, "R") == command


def test_under_resume_auto_the_line_to_continue_also_says_the_same_command_again_continues():
    """Compose sets RESUME=auto: its user typed `docker compose up`, not the image's `python -m train fit`,
    and that same `up` again is what continues the run."""
    from train.commands.fit import continue_command

    assert continue_command(["python", "-m", "train", "fit"], "R", "auto") == (
        "python -m train fit --resume R (or the same command again: RESUME=auto continues this run)"
    )
    assert continue_command(["python", "-m", "train", "fit"], "R", "latest") == "python -m train fit --resume R"


def test_the_command_to_continue_starts_with_the_python_the_user_started():
    from train.commands import interpreter

    assert interpreter([".venv/bin/python", "-X", "dev", "-m", "train", "fit"]) == [
        ".venv/bin/python",
        "-X",
        "dev",
        "-m",
        "train",
    ]
    assert interpreter(["python3", "-m", "pytest"]) == ["python", "-m", "train"]


@pytest.mark.parametrize(
    "argv, meant",
    [
        (["--epoch", "5"], "--epochs"),
        (["--lr", "0.1"], "--lr-schedule"),
        (["--batch", "8"], "--batch-size"),
        (["export", "latest", "--runs", "x"], "--runs-dir"),
    ],
)
def test_a_prefix_of_a_flag_is_not_that_flag(capsys, argv, meant):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {argv[-2]} {argv[-1]} (did you mean {meant}" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(("word", "meant"), [("rnus", "runs"), ("exprot", "export"), ("setings", "settings")])
def test_a_misspelt_command_is_named_as_the_command_meant(capsys, word, meant):
    assert cli.main([word]) == 2  # taken as an argument of the default command, fit
    assert f"unrecognized arguments: {word} (did you mean the command {meant}?)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, prefix",
    [
        (["report", "latest", "--qu"], "--qu"),
        (["report", "latest", "--runs", "x"], "--runs"),
        (["compare", "a", "b", "--ou", "x.png"], "--ou"),
        (["compare", "a", "b", "--runs", "x"], "--runs"),
    ],
)
def test_report_and_compare_take_no_prefix_of_a_flag(tmp_path, monkeypatch, capsys, argv, prefix):
    monkeypatch.chdir(tmp_path)  # had a prefix been taken, the command would read tmp_path/runs, not the checkout's
    assert cli.main(argv) == 2
    assert f"unrecognized arguments: {prefix}" in capsys.readouterr().err


def test_a_switch_given_both_ways_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr("train.train", lambda s, force: pytest.fail("ran"))
    for argv in (["--deterministic", "--no-deterministic"], ["--no-export", "--smoke", "--export"]):
        assert cli.main(argv) == 2
        assert "given both ways" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["fit", "--deterministic", "--deterministic"]).deterministic is True


def test_env_file_warnings_are_printed_once_each(tmp_path, capsys):
    (tmp_path / ".env").write_text("EPOCH=5\nSEED=1\nSEED=2\n")
    assert cli.main(["settings"]) == 0
    out, err = capsys.readouterr()
    assert "SEED=2" in out.splitlines()
    assert err.splitlines() == [
        "WARNING: .env, line 1: EPOCH is not a setting and is ignored (did you mean EPOCHS?)",
        "WARNING: .env, line 3: SEED is set again (first on line 2); line 3 wins",
    ]


@pytest.mark.parametrize(
    "content, line",
    [
        (b"SEED=1\nRUN_NAME=caf\xe9\n", ".env, line 2: byte 0xe9 is not UTF-8 text; save the file as UTF-8"),
        (
            b"SEED=1\nEPOCHS 5\n",
            ".env, line 2: cannot read 'EPOCHS 5': write NAME=value, one per line, with any quotes closed",
        ),
        (
            b'RUN_NAME="abc\n',
            ".env, line 1: cannot read 'RUN_NAME=\"abc': write NAME=value, one per line, with any quotes closed",
        ),
    ],
)
def test_an_unreadable_env_file_is_one_line_and_exit_2(tmp_path, capsys, content, line):
    (tmp_path / ".env").write_bytes(content)
    for argv in (["fit"], ["runs"], ["settings"]):
        assert cli.main(argv) == 2
        assert capsys.readouterr().err == f"EnvFileError: {line}\n"


def test_a_model_error_is_one_line_and_exit_2(monkeypatch, capsys):
    def train(settings, force, **_):
        raise ModelError("my_models:make", "make((2, 2, 1), 3) raised ValueError: too small")

    monkeypatch.setattr("train.train", train)
    assert cli.main(["fit"]) == 2
    assert (
        capsys.readouterr().err == "ModelError: MODEL=my_models:make: make((2, 2, 1), 3) raised ValueError: too small\n"
    )


def test_commands_that_build_no_model_do_not_look_for_the_model_module(tmp_path, capsys):
    (tmp_path / ".env").write_text("MODEL=not_here_xyz:make\n")
    assert cli.main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert cli.main(["settings"]) == 2
    assert "cannot find module 'not_here_xyz'" in capsys.readouterr().err


def test_commands_that_read_runs_ignore_a_file_where_the_default_data_dir_would_be(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").write_text("")  # ./data, DATA_DIR's default: no folder, but no run reads its data there
    assert cli.main(["runs"]) == 0
    assert cli.main(["settings"]) == 2
    assert "DATA_DIR='./data' is not valid: is not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["runs", "report latest", "compare a b", "predict latest a.png", "export latest"])
def test_commands_that_read_runs_ignore_a_bad_training_setting_but_not_a_bad_runs_dir(
    tmp_path, monkeypatch, capsys, command
):
    monkeypatch.setenv("EPOCHS", "x")  # for the next `fit`: these commands take a run's own settings
    (tmp_path / "runs").mkdir()
    code = cli.main([*command.split(), "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert "EPOCHS" not in err and code == (0 if command == "runs" else 2)  # the others: no run yet
    (tmp_path / "file").write_text("")
    assert cli.main([*command.split(), "--runs-dir", str(tmp_path / "file" / "runs")]) == 7
    assert capsys.readouterr().err.startswith(f"StorageError: RUNS_DIR={tmp_path / 'file' / 'runs'}: ")
    assert cli.main(["settings"]) == 2  # a command that shows or trains with it still refuses it
    assert capsys.readouterr().err == "ConfigError: EPOCHS='x' is not valid: expected a whole number, e.g. 3\n"


THREE_WORKERS = '{"cluster": {"worker": ["a:1", "b:2", "c:3"]}, "task": {"type": "worker", "index": 0}}'


@pytest.mark.parametrize(
    "name, value",
    [
        pytest.param("WORKERS", "garbage", marks=pytest.mark.extra("workers")),
        pytest.param("WORKER_INDEX", "x", marks=pytest.mark.extra("workers")),
        pytest.param("MLFLOW_TRACKING_URI", "garbage", marks=pytest.mark.extra("mlflow")),
        pytest.param("SWEEP_STORAGE", "garbage", marks=pytest.mark.extra("sweep")),
        ("TF_CONFIG", "garbage"),  # refused by `fit` with the workers extra or without it
        ("TF_CONFIG", THREE_WORKERS),  # BATCH_SIZE 512 is no multiple of 3: a training's concern
    ],
)
def test_commands_that_read_runs_ignore_an_extras_setting_meant_for_a_training_or_another_command(
    tmp_path, monkeypatch, capsys, name, value
):
    monkeypatch.setenv(name, value)
    (tmp_path / "runs").mkdir()
    assert cli.main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0, capsys.readouterr().err
    assert name not in capsys.readouterr().err
    assert cli.main(["settings"]) == 2  # a command that shows or trains with it still refuses it
    assert capsys.readouterr().err.startswith("ConfigError: ")


@pytest.mark.parametrize(
    "name, argv",
    [
        # where a store's runs are staged, for every command that reads runs
        pytest.param("STORE_CACHE", ["runs"], marks=pytest.mark.extra("store")),
        pytest.param("EXPORT_FORMATS", ["export", "latest"], marks=pytest.mark.extra("onnx")),
        # where reproduce puts a run's data version it fetches
        pytest.param("DVC_DATA_CACHE", ["reproduce", "latest", "--local"], marks=pytest.mark.extra("dvc")),
        pytest.param("SERVE_MAX_BATCH", ["serve", "latest"], marks=pytest.mark.extra("serve")),  # its flags' settings
    ],
)
def test_commands_that_read_runs_still_refuse_a_bad_setting_they_use(tmp_path, monkeypatch, capsys, name, argv):
    monkeypatch.setenv(name, "" if name.endswith("CACHE") else "0")
    assert cli.main([*argv, "--runs-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"ConfigError: {name}=")


@pytest.mark.parametrize("fmt", ["table", "env-example"])
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path, fmt):
    """`python -m train settings | head -1`: no traceback, the status of a tool that SIGPIPE ended."""
    import os
    import signal

    child = subprocess.Popen(
        [sys.executable, "-m", "train", "settings", "--format", fmt, "--env-file", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    child.stdout.close()  # gone before the child writes its first line (it starts Python first)
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 128 + signal.SIGPIPE and err == ""


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["sweep", "s.toml", "--storag", "postgresql://u:Hunt/3r@h/db"], marks=pytest.mark.extra("sweep")),
        pytest.param(["sweep", "s.toml", "--storag=postgresql://u:Hunt?3r@h/db"], marks=pytest.mark.extra("sweep")),
        ["--runs", "s3://KEY:Hunt3r@bucket/runs"],
    ],
)
def test_a_misspelt_flag_never_shows_the_secret_in_the_url_it_was_given(capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and "***@" in err and "Hunt" not in err and "3r@" not in err, err


def test_a_name_the_terminal_cannot_encode_is_escaped_not_a_traceback(tmp_path):
    run = tmp_path / "runs" / "20260101-000000-000001-\u00e9t\u00e9"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    env = {"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "ascii", "RUNS_DIR": str(tmp_path / "runs")}
    done = subprocess.run(
        [sys.executable, "-m", "train", "runs"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "20260101-000000-000001-\\xe9t\\xe9" in done.stdout


@pytest.mark.parametrize(
    "interrupt, line",
    [
        (KeyboardInterrupt, "Stopped (Ctrl-C): the command did not finish; run it again"),
        (SecondInterrupt, "Stopped at once (second Ctrl-C): the last saved state is kept;"),
    ],
)
def test_a_first_ctrl_c_of_a_command_without_a_run_is_not_called_a_second_one(monkeypatch, capsys, interrupt, line):
    """`report`, `predict`, `runs`, `compare` route no signal to a save: Python's KeyboardInterrupt ends
    them at the first Ctrl-C, which must not read "second Ctrl-C ... --resume RUN"."""

    class CtrlCWhilePrinting(io.StringIO):
        def write(self, text):
            raise interrupt  # what a Ctrl-C landing while the command prints raises there

    monkeypatch.setattr(sys, "stdout", CtrlCWhilePrinting())
    assert cli.main(["settings"]) == 130
    assert capsys.readouterr().err.startswith(line)


@pytest.mark.slow
@pytest.mark.parametrize(
    "folder, fix",
    [
        ("bare", "is not the template's environment: run scripts/venv.sh once (scripts/train does it too), then "),
        (".venv", "lacks a package of its lock: delete it and run scripts/venv.sh to make it again"),
    ],
)
def test_a_python_without_the_packages_is_one_line_naming_the_set_up(tmp_path, folder, fix):
    """`python -m train export latest` typed outside the clone's .venv: a real environment without the
    packages gets as far as the first import of numpy (python-dotenv with a .env to read), which must
    be a line saying what to run."""
    import venv

    venv.create(tmp_path / folder, with_pip=False)
    for env_file in ("", "EPOCHS=2\n"):
        (tmp_path / ".env").write_text(env_file)
        done = subprocess.run(
            [str(tmp_path / folder / "bin" / "python"), "-m", "train", "export", "latest"],
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT), "RUNS_DIR": str(tmp_path / "runs")},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith("ModuleNotFoundError: No module named '") and done.stderr.count("\n") == 1
        assert fix in done.stderr


def test_a_missing_module_of_an_extra_names_the_extra():
    assert (
        cli._install_line("obstore")
        == "it comes with the store extra: `scripts/venv.sh --extra store` installs it into .venv"
    )


def test_a_command_stopped_by_ctrl_c_or_a_signal_waits_for_no_upload_on_its_way_out(monkeypatch):
    """What a command wrote went to the store after any failure: after a stop too, which against a store
    that does not answer could outlast the grace period of the `docker stop` that sent it."""
    from pathlib import Path

    from train import commands
    from train.errors import ExportError, Interrupted

    uploads = []
    monkeypatch.setattr(commands, "upload", lambda settings, run_dir: uploads.append(run_dir))
    for stop in (KeyboardInterrupt(), Interrupted("export stopped by SIGTERM"), ExportError("max |diff| 1e-3")):
        with pytest.raises(type(stop)), commands.uploaded(None, Path("run")):
            raise stop
    assert uploads == [Path("run")]  # the failed export's only: what it wrote still reaches the store
