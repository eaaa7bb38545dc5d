"""envfile: the .env file's values, one error line (file, line) for what cannot be read, warnings for odd keys."""

from __future__ import annotations

import re

import pytest
from helpers import PROJECT_ROOT

from train.envfile import OTHER_TOOLS, read_env_file
from train.errors import EnvFileError

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
    assert used - settings <= OTHER_TOOLS, (
        f"compose reads {used - settings - OTHER_TOOLS} from .env: add to OTHER_TOOLS"
    )
