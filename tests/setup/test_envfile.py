"""envfile: the .env file's values, one error line (file, line) for what cannot be read, warnings for odd keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import PROJECT_ROOT, extra_present

from train.errors import EnvFileError
from train.setup.envfile import OTHER_TOOLS, read_env_file

NAMES = {"EPOCHS", "BATCH_SIZE", "SEED", "RUN_NAME", "DEBUG"}


def read(tmp_path, content: bytes | str, warnings=None):
    path = tmp_path / "x.env"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path, read_env_file(path, NAMES, None if warnings is None else warnings.append)


def test_values_as_python_dotenv_reads_them(tmp_path):
    _, values = read(tmp_path, '# comment\nexport SEED=3\nRUN_NAME="a b"  # note\nEPOCHS = 4\n\nX=${SEED}\n')
    assert values == {"SEED": "3", "RUN_NAME": "a b", "EPOCHS": "4", "X": "3"}


@pytest.mark.parametrize(
    "content, line, words",
    [
        ("SEED=1\nEPOCHS 5\n", 2, "cannot read 'EPOCHS 5': write NAME=value"),
        ('SEED=1\nRUN_NAME="abc\nEPOCHS=2\n', 2, "cannot read 'RUN_NAME=\"abc'"),
        ("SEED=1\n\n\n  EPOCHS\n", 4, "'EPOCHS' has no '=': write EPOCHS=value"),
        # A line with a database password, an unclosed quote: the password is not shown.
        ('SWEEP_STORAGE="postgresql://u:Hunt/3r@h/db\n', 1, "cannot read 'SWEEP_STORAGE=***@h/db'"),
    ],
)
def test_a_line_that_is_not_name_value_names_file_and_line(tmp_path, content, line, words, capsys):
    with pytest.raises(EnvFileError) as e:
        read(tmp_path, content)
    assert str(e.value).startswith(f"{tmp_path / 'x.env'}, line {line}: {words}")
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert "python-dotenv" not in capsys.readouterr().err  # no second, anonymous warning


def test_a_file_that_is_not_utf8_is_one_error(tmp_path):
    with pytest.raises(EnvFileError) as e:
        read(tmp_path, b"SEED=1\nRUN_NAME=caf\xe9\n")
    assert str(e.value) == f"{tmp_path / 'x.env'}, line 2: byte 0xe9 is not UTF-8 text; save the file as UTF-8"


def test_a_directory_in_place_of_the_file(tmp_path):
    (tmp_path / ".env").mkdir()
    with pytest.raises(EnvFileError, match=r"\.env: is a directory, not a file"):
        read_env_file(tmp_path / ".env", NAMES)


def test_unknown_and_repeated_keys_warn_with_the_line(tmp_path):
    warnings = []
    path, values = read(
        tmp_path, "EPOCH=5\nepochs=4\nSEED=1\nSEED=2\nHOST_UID=1000\nTF_CPP_MIN_LOG_LEVEL=3\nZZZ=1\n", warnings
    )
    assert values["SEED"] == "2"
    assert warnings == [
        f"WARNING: {path}, line 1: EPOCH is not a setting and is ignored (did you mean EPOCHS?)",
        f"WARNING: {path}, line 2: epochs is not a setting and is ignored (did you mean EPOCHS?)",
        f"WARNING: {path}, line 4: SEED is set again (first on line 3); line 4 wins",
        f"WARNING: {path}, line 7: ZZZ is not a setting and is ignored (the settings: python -m train settings)",
    ]


def test_other_tools_variables_match_docker_compose():
    if not (PROJECT_ROOT / "docker-compose.yml").is_file():
        pytest.skip("docker-compose.yml is a host-side file (not in the image)")
    compose = (PROJECT_ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)", compose))
    from dataclasses import fields

    from train.config import Settings

    settings = {f.name.upper() for f in fields(Settings)}
    # An extra's setting that compose passes on to the training: a fork without that extra may keep the line.
    deleted = {name for name, extra in {"MLFLOW_TRACKING_URI": "mlflow"}.items() if not extra_present(extra)}
    assert used - settings - deleted <= OTHER_TOOLS, (
        f"compose reads {used - settings - deleted - OTHER_TOOLS} from .env: add to OTHER_TOOLS"
    )


# -- files that are not a few lines of text --------------------------------------------------------
def _fit_with_env_file(tmp_path, env_file: str):
    """`fit --env-file X` in a subprocess (exit 2 comes before TensorFlow), its memory capped: a
    file read whole that never ends must fail the test, not the machine."""
    import resource
    import subprocess
    import sys

    from helpers import subprocess_env

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(
        [sys.executable, "-m", "train", "fit", "--env-file", env_file, "--runs-dir", str(tmp_path / "runs")],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,  # a safety net only: the refusal takes well under a second
        preexec_fn=cap,
    )


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/urandom", "socket"])
def test_a_settings_file_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path, kind):
    import os
    import socket

    path = tmp_path / "settings.env"
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes it: a read would block forever
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
    else:
        path.symlink_to(kind)
    proc = _fit_with_env_file(tmp_path, str(path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    what = {"fifo": "a named pipe", "socket": "a socket"}.get(kind, "a character device")
    assert proc.stderr == (
        f"EnvFileError: {path}: is {what}, not a regular file (reading it could block or never end): make it "
        "a file of NAME=value lines, or pass --env-file '' (or /dev/null) to read no settings file\n"
    )


def test_a_settings_file_larger_than_1_mib_is_refused(tmp_path):
    path = tmp_path / "big.env"
    path.write_text("# " + "padding " * 137_500 + "\n")  # a 1.1 MB comment: valid, but not a settings file
    with pytest.raises(EnvFileError) as e:
        read_env_file(path, NAMES)
    assert str(e.value) == (
        f"{path}: is larger than 1 MiB, too large for a settings file of NAME=value lines: is it the right file?"
    )
    path.write_text("SEED=1\n# " + "padding " * 125_000 + "\n")  # just under: read
    assert read_env_file(path, NAMES) == {"SEED": "1"}


def test_an_empty_env_file_flag_reads_no_file(tmp_path):
    from train.config import load_settings

    (tmp_path / ".env").write_text("SEED=5\n")
    assert load_settings(env_file="", environ={}).seed == 42


def test_dev_null_as_the_settings_file_reads_as_no_settings(tmp_path):
    """`--env-file /dev/null` is the shell's way to say "no settings file": empty, not a refused device."""
    assert read_env_file(Path("/dev/null"), NAMES) == {}
    link = tmp_path / "none.env"
    link.symlink_to("/dev/null")
    assert read_env_file(link, NAMES) == {}


def test_a_variable_that_reads_as_empty_or_stays_as_written_warns_with_the_line(tmp_path, monkeypatch):
    """RUNS_DIR=${NOPE}/runs was silently /runs, RUNS_DIR=$HOME/runs a folder named `$HOME`."""
    monkeypatch.setenv("TPL_SET", "/srv")
    monkeypatch.delenv("TPL_NOPE", raising=False)
    warnings: list[str] = []
    content = (
        "RUN_NAME=r${TPL_NOPE}\n"  # unset: empty
        "SEED=${TPL_NOPE:-7}\n"  # a default: meant
        "EPOCHS=${SEED}\n"  # set above in the file
        "BATCH_SIZE=$TPL_SET\n"  # no braces: kept as written
        "DEBUG=$TPL_NOPE\n"  # no braces, but no such variable either: a literal $ (a password's), left alone
        "SWEEP_STORAGE=postgresql://u:pa$TPL_SET@h/db\n"  # in a URL: never said (it would tell the password)
        "HOST_UID=${TPL_NOPE}\n"  # compose's: compose expands it
    )
    path = tmp_path / "x.env"
    path.write_text(content)
    values = read_env_file(path, NAMES | {"SWEEP_STORAGE"}, warnings.append)
    assert values["RUN_NAME"] == "r" and values["SEED"] == "7" and values["BATCH_SIZE"] == "$TPL_SET"
    assert warnings == [
        f"WARNING: {path}, line 1: RUN_NAME uses ${{TPL_NOPE}}, which is not set (in the environment or above in "
        "the file), so it reads as empty there: set TPL_NOPE, or write the value out",
        f"WARNING: {path}, line 4: BATCH_SIZE holds $TPL_SET as written (a settings file expands ${{TPL_SET}} only): "
        "write ${TPL_SET} to use its value",
    ]


def test_a_key_with_an_invisible_character_is_shown_escaped(tmp_path):
    """Two files joined (the second's byte-order mark), a zero-width space pasted from a page: the
    warning read `EPOCHS is not a setting and is ignored (did you mean EPOCHS?)`."""
    warnings: list[str] = []
    path, values = read(tmp_path, "SEED=1\n\ufeffEPOCHS=2\n\u200bBATCH_SIZE=8\n", warnings)
    assert "EPOCHS" not in values and "BATCH_SIZE" not in values
    assert warnings == [
        f"WARNING: {path}, line 2: '\\ufeffEPOCHS' (with U+FEFF, an invisible or non-ASCII character: type the name "
        "again) is not a setting and is ignored (did you mean EPOCHS?)",
        f"WARNING: {path}, line 3: '\\u200bBATCH_SIZE' (with U+200B, an invisible or non-ASCII character: type the "
        "name again) is not a setting and is ignored (did you mean BATCH_SIZE?)",
    ]


def test_a_broken_link_as_the_settings_file_is_named_as_one(tmp_path):
    """A .env linked to a shared file that was moved said `cannot be read (No such file or directory);
    check its permissions`."""
    gone, looped = tmp_path / "gone.env", tmp_path / "loop.env"
    gone.symlink_to(tmp_path / "moved.env")
    looped.symlink_to(looped)
    for path, why in ((gone, "No such file or directory"), (looped, "Too many levels of symbolic links")):
        with pytest.raises(EnvFileError) as e:
            read_env_file(path, NAMES)
        target = tmp_path / ("moved.env" if path == gone else "loop.env")
        assert str(e.value) == f"{path}: is a broken link (to {target}: {why}): point it at the file, or remove it"


def test_a_bad_line_after_a_comment_is_still_refused(tmp_path):
    with pytest.raises(EnvFileError) as e:
        read(tmp_path, "# settings\nSEED=1\nEPOCHS 5\n")
    assert str(e.value) == (
        f"{tmp_path / 'x.env'}, line 3: cannot read 'EPOCHS 5': write NAME=value, one per line, with any quotes closed"
    )


def test_a_settings_file_of_exactly_1_mib_is_read(tmp_path):
    path = tmp_path / "full.env"
    head = "SEED=1\n"
    path.write_text(head + "#" * ((1 << 20) - len(head) - 1) + "\n")
    assert path.stat().st_size == 1 << 20
    assert read_env_file(path, NAMES) == {"SEED": "1"}


def test_a_settings_file_under_a_file_is_one_exact_error(tmp_path):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "x.env"
    with pytest.raises(EnvFileError) as e:
        read_env_file(path, NAMES)
    assert str(e.value) == f"{path}: cannot be read (Not a directory); check its permissions"


def test_a_settings_file_that_fails_once_open_is_one_exact_error(tmp_path, monkeypatch):
    import os

    path = tmp_path / "x.env"
    path.write_text("SEED=1\n")

    def fails(fd, blocking):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "set_blocking", fails)
    with pytest.raises(EnvFileError) as e:
        read_env_file(path, NAMES)
    assert str(e.value) == f"{path}: cannot be read (Input/output error); check its permissions"


def test_a_bare_variable_right_before_a_braced_one_is_named_alone(tmp_path, monkeypatch):
    """`$TPL_SET${SEED}x` holds $TPL_SET as written: the braced part removed, it read as `$TPL_SETx`."""
    monkeypatch.setenv("TPL_SET", "/srv")
    warnings: list[str] = []
    path, values = read(tmp_path, "SEED=1\nRUN_NAME=$TPL_SET${SEED}x\n", warnings)
    assert values["RUN_NAME"] == "$TPL_SET1x"
    assert warnings == [
        f"WARNING: {path}, line 2: RUN_NAME holds $TPL_SET as written (a settings file expands ${{TPL_SET}} only): "
        "write ${TPL_SET} to use its value"
    ]


@pytest.mark.parametrize(
    "kind, what",
    [("fifo", "a named pipe"), ("socket", "a socket"), ("/dev/zero", "a character device")],
)
def test_a_special_file_is_refused_in_one_exact_line_before_it_is_opened(tmp_path, kind, what):
    import os
    import socket

    path = tmp_path / "settings.env"
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes it: an open would block
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
    else:
        path.symlink_to(kind)
    with pytest.raises(EnvFileError) as e:
        read_env_file(path, NAMES)
    assert str(e.value) == (
        f"{path}: is {what}, not a regular file (reading it could block or never end): make it a file of "
        "NAME=value lines, or pass --env-file '' (or /dev/null) to read no settings file"
    )


def test_a_file_of_a_kind_without_a_name_is_a_special_file(tmp_path):
    from train.setup.envfile import _check_kind

    with pytest.raises(EnvFileError) as e:
        _check_kind(tmp_path / "x.env", 0)  # no file-type bits: none of the kinds named
    assert str(e.value).startswith(f"{tmp_path / 'x.env'}: is a special file, not a regular file (")


def test_a_key_with_a_printable_character_that_is_not_ascii_is_shown_escaped(tmp_path):
    warnings: list[str] = []
    path, _ = read(tmp_path, "\u00c9POCHS=2\n", warnings)
    assert warnings == [
        f"WARNING: {path}, line 1: '\\xc9POCHS' (with U+00C9, an invisible or non-ASCII character: type the name "
        "again) is not a setting and is ignored (did you mean EPOCHS?)"
    ]


@pytest.mark.parametrize(
    "line, shown",
    [
        ('S="' + "a" * 37, "'S=\"" + "a" * 37 + "'"),  # 40 characters: whole
        ('S="' + "a" * 38, "'S=\"" + "a" * 34 + "...'"),  # 41: cut to 37 and ...
        # The value is the text after the first '=': a '=' in the URL's query must not show the password.
        ('SWEEP_STORAGE="postgresql://u:Hunt3r@h/db?sslmode=require', "'SWEEP_STORAGE=***@h/db?***'"),
    ],
    ids=["40", "41", "query"],
)
def test_a_line_that_does_not_parse_is_shown_cut_at_40_characters_with_its_value_masked(tmp_path, line, shown):
    with pytest.raises(EnvFileError) as e:
        read(tmp_path, line + "\n")
    assert str(e.value) == (
        f"{tmp_path / 'x.env'}, line 1: cannot read {shown}: write NAME=value, one per line, with any quotes closed"
    )
