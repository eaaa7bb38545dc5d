"""Settings: precedence, coercion and every validation rule, all without TensorFlow."""

import subprocess
import sys

import pytest
from helpers import PROJECT_ROOT

from train.config import Settings, diff_settings, env_example, load_settings, settings_table
from train.errors import ConfigError


def load(overrides=None, env=None, env_file=None):
    return load_settings(overrides or {}, env_file=env_file, environ=env or {})


def test_defaults_are_the_guides_recipe():
    s = load()
    assert (s.dataset, s.model, s.batch_size, s.learning_rate) == ("mnist", "cnn", 128, 1e-3)


def test_precedence_defaults_dotenv_environment_flags(tmp_path):
    env_file = tmp_path / "custom.env"
    env_file.write_text("EPOCHS=4\nBATCH_SIZE=32\nSEED=7\n")
    s = load(env_file=env_file)
    assert (s.epochs, s.batch_size, s.seed) == (4, 32, 7)
    s = load(env={"BATCH_SIZE": "64", "SEED": "9"}, env_file=env_file)
    assert (s.epochs, s.batch_size, s.seed) == (4, 64, 9)
    s = load({"seed": "11"}, env={"BATCH_SIZE": "64", "SEED": "9"}, env_file=env_file)
    assert (s.epochs, s.batch_size, s.seed) == (4, 64, 11)


def test_missing_named_env_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="ENV_FILE"):
        load(env_file=tmp_path / "nope.env")


@pytest.mark.parametrize("name,value,fragment", [
    ("EPOCHS", "abc", "whole number"),
    ("EPOCHS", "0", "positive"),
    ("BATCH_SIZE", "0", "positive"),
    ("BATCH_SIZE", "-8", "positive"),
    ("LEARNING_RATE", "fast", "number"),
    ("LEARNING_RATE", "nan", "finite"),
    ("PRECISION", "fp8", "one of auto"),
    ("MODEL", "transformer", "module:function"),
    ("DATASET", "imagenet", "npz:<file>"),
    ("DATASET", "npz:/no/such/file.npz", "does not exist"),
    ("DATASET", "images:/no/such/dir", "does not exist"),
    ("CACHE", "disk", "memory, file, none"),
    ("MEMORY_GROWTH", "maybe", "true/false"),
    ("VAL_SPLIT", "0.95", "between"),
    ("RUN_NAME", "a b", "letters"),
    ("CHANNELS", "2", "one of 1, 3"),
])
def test_bad_values_name_setting_value_and_rule(name, value, fragment):
    with pytest.raises(ConfigError) as info:
        load(env={name: value})
    msg = str(info.value)
    assert name in msg and repr(value.strip()) in msg or name in msg and value in msg
    assert fragment in msg
    assert "\n" not in msg


def test_checkpoint_interval_must_fall_on_execution_boundary():
    with pytest.raises(ConfigError, match="CHECKPOINT_EVERY"):
        load(env={"STEPS_PER_EXECUTION": "8", "CHECKPOINT_EVERY": "100"})


def test_bool_spellings():
    assert load(env={"SMOKE": "yes"}).smoke is True
    assert load(env={"SMOKE": "0"}).smoke is False


def test_diff_ignores_settings_that_do_not_change_results():
    a = Settings()
    b = a.replace(epochs=9, runs_dir="/elsewhere", learning_rate=0.01, batch_size=64)
    assert diff_settings(a, b) == ["BATCH_SIZE: 128 -> 64", "LEARNING_RATE: 0.001 -> 0.01"]


def test_env_example_and_table_cover_every_setting():
    from dataclasses import fields

    text, table = env_example(), settings_table()
    for f in fields(Settings):
        assert f"\n{f.name.upper()}=" in text
        assert f"`{f.name.upper()}`" in table


def test_committed_env_example_is_current():
    assert (PROJECT_ROOT / ".env.example").read_text() == env_example() + "\n"


def test_bad_setting_exits_2_before_tensorflow_is_imported():
    code = "import sys, train.cli as c; rc = c.main(['fit', '--epochs', 'abc']); " \
           "assert 'tensorflow' not in sys.modules; sys.exit(rc)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    # One line, naming the setting, the value and what is allowed. (Speed: benchmarks/, not here.)
    assert proc.stderr.strip() == "ConfigError: EPOCHS='abc' is not valid: expected a whole number, e.g. 3"


def test_readme_configuration_table_is_current():
    assert settings_table() in (PROJECT_ROOT / "README.md").read_text()


def test_epochs_may_change_on_resume_unless_a_schedule_spans_them():
    constant = Settings()
    assert diff_settings(constant, constant.replace(epochs=10)) == []
    cosine = Settings(lr_schedule="cosine")
    assert diff_settings(cosine, cosine.replace(epochs=10)) == [
        "EPOCHS: 3 -> 10 (LR_SCHEDULE=cosine spans all epochs)"]


@pytest.mark.parametrize("environ, env_text, expected", [
    ({"DEBUG": "1"}, None, True), ({"DEBUG": " Yes "}, None, True), ({"DEBUG": "0"}, "DEBUG=1\n", False),
    ({}, "DEBUG=true\n", True), ({}, "DEBUG=off\n", False), ({}, None, False), ({"EPOCHS": "abc"}, "DEBUG=on\n", True),
])
def test_debug_is_read_on_its_own_environment_first(tmp_path, environ, env_text, expected):
    from train.config import debug_requested

    env_file = tmp_path / ".env"
    if env_text is not None:
        env_file.write_text(env_text)
    assert debug_requested(env_file, environ=environ) is expected


def test_setting_fields_are_the_settings_in_order():
    from dataclasses import fields

    from train.config import setting_fields

    assert [f.name for f in setting_fields()] == [f.name for f in fields(Settings)] and setting_fields()[0].name == "dataset"
