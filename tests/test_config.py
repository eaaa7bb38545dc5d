"""Settings: precedence, coercion and every validation rule, all without TensorFlow."""

import dataclasses
import re
import subprocess
import sys

import pytest
from builders import write_tiny_npz
from helpers import PROJECT_ROOT, SETTINGS_TABLE, extra_present

from train import datasets, models
from train.config import (
    Settings,
    debug_requested,
    diff_settings,
    env_example,
    load_settings,
    settings_from_dict,
    settings_table,
)
from train.errors import ConfigError, RegisterError, StorageError
from train.sections import setting as _f

STORE = pytest.mark.extra("store")  # STORE_CACHE is the store extra's setting


def load(overrides=None, env=None, env_file=None):
    return load_settings(overrides or {}, env_file=env_file, environ=env or {})


def test_defaults_are_the_classic_mnist_recipe():
    s = load()
    assert (s.dataset, s.model, s.batch_size, s.learning_rate) == ("mnist", "cnn", 512, 7e-3)


def test_precedence_defaults_dotenv_environment_flags(tmp_path):
    env_file = tmp_path / "custom.env"
    env_file.write_text("EPOCHS=4\nBATCH_SIZE=32\nSEED=7\n")
    s = load(env_file=env_file)
    assert (s.epochs, s.batch_size, s.seed) == (4, 32, 7)
    s = load(env={"BATCH_SIZE": "64", "SEED": "9"}, env_file=env_file)
    assert (s.epochs, s.batch_size, s.seed) == (4, 64, 9)
    s = load({"seed": "11"}, env={"BATCH_SIZE": "64", "SEED": "9"}, env_file=env_file)
    assert (s.epochs, s.batch_size, s.seed) == (4, 64, 11)


def test_an_override_that_is_no_setting_is_refused_naming_the_closest_one():
    """load_settings({"epoch": 1}) in a notebook must not train the default number of epochs."""
    for key, hint in (("epoch", "did you mean 'epochs'? "), ("BATCH_SIZE", "did you mean 'batch_size'? "), ("zzz", "")):
        with pytest.raises(ConfigError) as info:
            load({key: 1})
        assert str(info.value) == (
            f"{key}=1 is not valid: not a setting: {hint}overrides are named as the settings in lower case, "
            "e.g. 'batch_size' (python -m train settings lists them)"
        )
    assert load({"epochs": 1, "batch_size": None}).epochs == 1  # None: not given


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("epochs", 3.5, "EPOCHS=3.5 is not valid: expected a whole number, e.g. 3"),
        ("seed", 1.7, "SEED=1.7 is not valid: expected a whole number, e.g. 42"),
        ("batch_size", True, "BATCH_SIZE=True is not valid: expected a whole number, e.g. 512"),
        ("epochs", [3], "EPOCHS=[3] is not valid: expected a whole number, e.g. 3"),
        ("learning_rate", float("nan"), "LEARNING_RATE=nan is not valid: expected a finite number"),
        ("learning_rate", "0.01", None),
        ("smoke", 2, "SMOKE=2 is not valid: expected True or False"),
        ("dataset", 5, f"DATASET='5' is not valid: one of {', '.join(datasets.DATASETS)}, npz:<file>, images:<dir>"),
        ("dataset", ["mnist"], "DATASET=['mnist'] is not valid: expected text (a str), e.g. 'mnist'"),
        ("runs_dir", None, None),
        ("run_name", True, "RUN_NAME=True is not valid: expected text (a str), e.g. ''"),
    ],
)
def test_an_override_of_the_wrong_python_type_is_refused_in_one_line(key, value, message):
    """load_settings({...}) from a notebook: 3.5 epochs or a NaN rate were kept as given (and failed
    mid-run, or never), a list as DATASET or a number as PROFILE_STEPS failed with a TypeError/AttributeError."""
    if message is None:
        load({key: value})  # text is read as a flag's; None is not given
        return
    with pytest.raises(ConfigError) as info:
        load({key: value})
    assert str(info.value) == message
    with pytest.raises(ConfigError):
        load().replace(**{key: value})  # and so does .replace(...)


def test_python_values_are_kept_as_the_settings_own_types(tmp_path):
    """A NumPy integer (config.json could not hold it), 0/1 and NumPy bools, a Path, a number as PEAK_FLOPS."""
    import numpy as np

    s = load(
        {
            "epochs": np.int64(2),
            "learning_rate": 1,
            "smoke": np.bool_(True),
            "deterministic": 0,
            "runs_dir": tmp_path / "runs",
            "peak_flops": 2.5e11,
        }
    )
    values = (s.epochs, s.learning_rate, s.smoke, s.deterministic, s.runs_dir, s.peak_flops)
    assert values == (2, 1.0, True, False, str(tmp_path / "runs"), "250000000000.0")
    assert [type(v) for v in values] == [int, float, bool, bool, str, str]


def test_a_numpy_float32_rate_is_the_number_written_not_its_binary_neighbour():
    """np.float32(0.001) (a value from a float32 array) became 0.0010000000474974513: config.json, the report
    and RESUME=auto's comparison with LEARNING_RATE=0.001 in .env (`LEARNING_RATE: 0.0010000000474974513 ->
    0.001`: a new run instead of the resume) all saw that number."""
    import numpy as np

    s = load({"learning_rate": np.float32(0.001), "val_split": np.float16(0.1)})
    assert (s.learning_rate, s.val_split) == (0.001, 0.1)
    assert load().replace(learning_rate=np.float32(0.003)).learning_rate == 0.003
    assert load({"learning_rate": np.float64(0.001)}).learning_rate == 0.001


def test_overrides_that_are_not_a_dict_are_one_type_error_naming_env_file_for_a_path():
    """load_settings("my.env") (the file meant as env_file) failed with `string indices must be integers`."""
    with pytest.raises(TypeError) as info:
        load_settings("my.env", environ={})
    assert str(info.value) == (
        "load_settings() takes the settings to set as a dict by their lower-case names, e.g. {'epochs': 3}, "
        "not str: a settings file is env_file=, load_settings(env_file='my.env')"
    )
    with pytest.raises(TypeError, match=r"e\.g\. \{'epochs': 3\}, not list$"):
        load_settings([("epochs", 3)], environ={})


@pytest.mark.parametrize(
    "name, value, shown",
    [
        (
            "RUNS_DIR",
            "~runs_nobody_has",
            "~runs_nobody_has is the home folder of a user named 'runs_nobody_has', unknown here: write ~/runs_nobody_has for",
        ),
        (
            "DATA_DIR",
            "~nobody_here/data",
            "~nobody_here is the home folder of a user named 'nobody_here', unknown here: write ~/nobody_here/data for",
        ),
        (
            "DATASET",
            "npz:~nobody_here/x.npz",
            "~nobody_here is the home folder of a user named 'nobody_here', unknown here: write ~/nobody_here/x.npz for",
        ),
    ],
)
def test_a_home_folder_of_an_unknown_user_is_one_config_error(name, value, shown):
    """RUNS_DIR=~runs (the slash left out) failed in every command with `RuntimeError: Could not determine
    home directory.` and a traceback."""
    with pytest.raises(ConfigError) as info:
        load(env={name: value})
    assert str(info.value) == f"{name}={value!r} is not valid: {shown} a folder in your own home, or a full path"


def test_a_home_folder_in_a_settings_file_is_the_home_folder_not_a_folder_named_tilde(tmp_path, monkeypatch):
    """`RUNS_DIR=~/runs` in .env is read by no shell: the runs went to ./~/runs."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    env = tmp_path / "my.env"
    env.write_text("RUNS_DIR=~/runs\nDATA_DIR=~/data\n")
    s = load(env_file=env)
    assert (s.runs_dir, s.data_dir) == (str(tmp_path / "home" / "runs"), str(tmp_path / "home" / "data"))
    assert Settings(runs_dir="~").runs_dir == str(tmp_path / "home")  # built in Python too


def test_missing_named_env_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="ENV_FILE"):
        load(env_file=tmp_path / "nope.env")


@pytest.mark.parametrize(
    "name,value,fragment",
    [
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
        ("MONITOR", "val_acc", "one of val_accuracy, val_loss, accuracy, loss"),
        ("RUNS_DIR", "", "must not be empty (the default is ./runs)"),
        ("RUNS_DIR", "  ", "must not be empty"),
        ("DATA_DIR", "", "must not be empty (the default is ./data)"),
        pytest.param(
            "STORE_CACHE", "", "must not be empty (the default is ~/.cache/tf-train-template/runs)", marks=STORE
        ),
        pytest.param("STORE_CACHE", " ", "must not be empty", marks=STORE),
        ("CACHE", "disk", "memory, file, none"),
        ("MEMORY_GROWTH", "maybe", "true/false"),
        ("VAL_SPLIT", "0.95", "between"),
        ("RUN_NAME", "a b", "letters"),
        ("CHANNELS", "2", "one of 1, 3"),
    ],
)
def test_bad_values_name_setting_value_and_rule(name, value, fragment):
    with pytest.raises(ConfigError) as info:
        load(env={name: value})
    msg = str(info.value)
    assert name in msg and repr(value.strip()) in msg or name in msg and value in msg
    assert fragment in msg
    assert "\n" not in msg


def test_a_data_dir_that_is_a_file_names_the_two_ways_to_give_it(tmp_path):
    npz = tmp_path / "mnist.npz"
    npz.write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        load(env={"DATA_DIR": str(npz)})
    assert str(info.value) == (
        f"DATA_DIR={str(npz)!r} is not valid: is not a folder (a file, a device or a broken link): give the "
        "folder that holds the data, or DATASET=npz:<a file>"
    )
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    for below in (tmp_path / "gone", npz / "sub"):
        with pytest.raises(ConfigError, match="is not a folder"):
            load(env={"DATA_DIR": str(below)})
    assert load(env={"DATA_DIR": str(tmp_path / "new" / "data")}).data_dir  # to be made: fine
    assert load(env={"DATA_DIR": str(npz), "DATASET": f"npz:{npz}"}).data_dir == str(npz)  # DATA_DIR unused
    # A run's saved settings: its data may have moved, and a file may stand where its DATA_DIR was.
    assert settings_from_dict({"data_dir": str(npz)}, need_data=False).data_dir == str(npz)


def test_a_checkpoint_interval_need_not_be_a_multiple_of_the_steps_per_call():
    """The loop ends a call at each CHECKPOINT_EVERY boundary (tests/training/test_loop.py)."""
    s = load(env={"CHECKPOINT_EVERY": "100"})
    assert (s.steps_per_execution, s.checkpoint_every) == (8, 100)


def test_bool_spellings():
    assert load(env={"SMOKE": "yes"}).smoke is True
    assert load(env={"SMOKE": "0"}).smoke is False


def test_diff_ignores_settings_that_do_not_change_results():
    a = Settings(lr_schedule="constant")
    b = a.replace(epochs=9, runs_dir="/elsewhere", learning_rate=0.01, batch_size=64)
    assert diff_settings(a, b) == ["BATCH_SIZE: 512 -> 64", "LEARNING_RATE: 0.007 -> 0.01"]


def test_env_example_and_table_cover_every_setting():
    from dataclasses import fields

    text, table = env_example(), settings_table()
    for f in fields(Settings):
        assert f"\n# {f.name.upper()}=" in text
        assert f"`{f.name.upper()}`" in table


def test_a_copied_env_example_sets_nothing(tmp_path):
    # A copied .env.example must not pin anything: not RUNS_DIR=./runs into the container, not an
    # empty RESUME= that turns off the compose service's RESUME=auto.
    from dotenv import dotenv_values

    (tmp_path / ".env").write_text(env_example() + "\n")
    assert dotenv_values(tmp_path / ".env") == {}
    assert load_settings(env_file=tmp_path / ".env", environ={}) == Settings()


def test_committed_env_example_is_current():
    assert (PROJECT_ROOT / ".env.example").read_text() == env_example() + "\n"


def test_bad_setting_exits_2_before_tensorflow_is_imported():
    code = (
        "import sys, train.cli as c; rc = c.main(['fit', '--epochs', 'abc']); "
        "assert 'tensorflow' not in sys.modules; sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    # One line, naming the setting, the value and what is allowed. (Speed: benchmarks/, not here.)
    assert proc.stderr.strip() == "ConfigError: EPOCHS='abc' is not valid: expected a whole number, e.g. 3"


def test_readme_configuration_table_is_current():
    # Exactly the generated table between the markers: a stale, missing or hand-added row fails.
    readme = (PROJECT_ROOT / "README.md").read_text()
    between = re.search(SETTINGS_TABLE, readme, re.S)
    assert between, "README.md lost its settings-table markers"
    assert between.group(1) == settings_table()


def test_epochs_may_change_on_resume_unless_a_schedule_spans_them():
    constant = Settings(lr_schedule="constant")
    assert diff_settings(constant, constant.replace(epochs=10)) == []
    cosine = Settings()  # the default
    assert diff_settings(cosine, cosine.replace(epochs=10)) == ["EPOCHS: 3 -> 10 (LR_SCHEDULE=cosine spans all epochs)"]


@pytest.mark.parametrize(
    "environ, env_text, expected",
    [
        ({"DEBUG": "1"}, None, True),
        ({"DEBUG": " Yes "}, None, True),
        ({"DEBUG": "0"}, "DEBUG=1\n", False),
        ({}, "DEBUG=true\n", True),
        ({}, "DEBUG=off\n", False),
        ({}, None, False),
        ({"EPOCHS": "abc"}, "DEBUG=on\n", True),
    ],
)
def test_debug_is_read_on_its_own_environment_first(tmp_path, environ, env_text, expected):
    from train.config import debug_requested

    env_file = tmp_path / ".env"
    if env_text is not None:
        env_file.write_text(env_text)
    assert debug_requested(env_file, environ=environ) is expected


@pytest.mark.parametrize("model", [*models.MODELS, "my_module:make"])
def test_monitor_choices_are_what_the_loop_logs(model):
    from train.run.metrics_files import metric_columns

    # metrics.csv's columns are the epoch logs the loop writes; MONITOR must name one of them.
    metrics = tuple(models.entry(model).metrics)
    logged = {c for c in metric_columns(metrics) if c.replace("val_", "") in ("loss", *metrics)}
    assert set(models.monitors(model)) == logged and "val_accuracy" in logged


def test_a_path_given_for_the_wrong_kind_says_what_it_is(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"is a directory, not a file; give the path of an .npz"):
        load(env={"DATASET": f"npz:{tmp_path}"})
    with pytest.raises(ConfigError, match=r"file.txt is a file, not a directory; give a directory"):
        load(env={"DATASET": f"images:{tmp_path / 'file.txt'}"})


def test_runs_dir_that_is_a_file_or_under_one_says_so(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(StorageError) as e:
        load(env={"RUNS_DIR": str(tmp_path / "f")})
    assert (
        str(e.value)
        == f"RUNS_DIR={tmp_path / 'f'}: {tmp_path / 'f'} is a file, not a directory; point RUNS_DIR at a directory"
    )
    assert e.value.exit_code == 7
    with pytest.raises(
        StorageError, match=rf"RUNS_DIR={tmp_path / 'f' / 'runs'}: {tmp_path / 'f'} is a file, not a directory"
    ):
        load(env={"RUNS_DIR": str(tmp_path / "f" / "runs")})
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(StorageError, match="gone is a broken link, not a directory"):
        load(env={"RUNS_DIR": str(tmp_path / "gone")})
    assert load(env={"RUNS_DIR": str(tmp_path / "new" / "runs")}).runs_dir == str(tmp_path / "new" / "runs")


def test_env_file_warnings_reach_the_caller(tmp_path):
    env_file = tmp_path / "my.env"
    env_file.write_text("EPOCH=5\nepochs=4\nBATCH_SIZE=8\nBATCH_SIZE=16\nHOST_UID=1000\n")
    lines = []
    s = load_settings({}, env_file=env_file, environ={}, warn=lines.append)
    assert (s.epochs, s.batch_size) == (3, 16)
    assert lines == [
        f"WARNING: {env_file}, line 1: EPOCH is not a setting and is ignored (did you mean EPOCHS?)",
        f"WARNING: {env_file}, line 2: epochs is not a setting and is ignored (did you mean EPOCHS?)",
        f"WARNING: {env_file}, line 4: BATCH_SIZE is set again (first on line 3); line 4 wins",
    ]


def test_a_bad_env_file_line_is_one_error_with_file_and_line(tmp_path):
    env_file = tmp_path / "my.env"
    env_file.write_text("SEED=1\nEPOCHS 5\n")
    with pytest.raises(ConfigError) as e:
        load(env_file=env_file)
    assert (
        str(e.value)
        == f"{env_file}, line 2: cannot read 'EPOCHS 5': write NAME=value, one per line, with any quotes closed"
    )


def test_a_bad_value_from_the_env_file_says_it_is_set_there_and_one_given_elsewhere_does_not(tmp_path):
    env_file = tmp_path / "my.env"
    env_file.write_text("EPOCHS=abc\n")
    with pytest.raises(ConfigError) as e:
        load(env_file=env_file)
    assert str(e.value) == f"EPOCHS='abc' is not valid: expected a whole number, e.g. 3 (set in {env_file})"
    # Only the value that wins is read: the environment or a flag over a bad line is no error.
    assert load(env={"EPOCHS": "5"}, env_file=env_file).epochs == load({"epochs": 5}, env_file=env_file).epochs == 5
    with pytest.raises(ConfigError) as e:  # a bad value from the environment over the file's: not the file's
        load(env={"EPOCHS": "q"}, env_file=env_file)
    assert str(e.value) == "EPOCHS='q' is not valid: expected a whole number, e.g. 3"
    env_file.write_text("LR_WARMUP_EPOCHS=5\n")  # refused with the other settings: still the file's value
    with pytest.raises(ConfigError) as e:
        load(env_file=env_file)
    assert str(e.value).endswith(f"give less than 3 (set in {env_file})")
    with pytest.raises(ConfigError) as e:  # the file's value overridden by a flag: the error is the flag's
        load({"lr_warmup_epochs": 4}, env_file=env_file)
    assert "set in" not in str(e.value)


def test_debug_is_read_from_an_env_file_that_is_otherwise_bad(tmp_path):
    env_file = tmp_path / "my.env"
    env_file.write_text("DEBUG=1\nNOT A LINE\n")
    assert debug_requested(env_file, environ={}) is False  # the file cannot be read: no DEBUG from it
    env_file.write_bytes(b"DEBUG=1\nRUN_NAME=caf\xe9\n")
    assert debug_requested(env_file, environ={}) is False
    env_file.write_text("DEBUG=1\nEPOCH=3\n")
    assert debug_requested(env_file, environ={}) is True


def test_a_user_model_is_checked_before_tensorflow(tmp_path, monkeypatch):
    (tmp_path / "broken_models_for_test.py").write_text("def make(input_shape, num_classes)\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"broken_models_for_test.py, line 1: SyntaxError"):
        load(env={"MODEL": "broken_models_for_test:make"})


def test_image_size_too_small_for_a_builtin_model(tmp_path):
    with pytest.raises(ConfigError, match=r"IMAGE_SIZE=9 is not valid: MODEL=cnn needs images of at least 10x10"):
        load(env={"DATASET": f"images:{tmp_path}", "IMAGE_SIZE": "9"})
    assert load(env={"DATASET": f"images:{tmp_path}", "IMAGE_SIZE": "9", "MODEL": "resnet_small"}).image_size == 9


def test_a_user_model_that_cannot_work_exits_2_before_tensorflow_is_imported(tmp_path):
    (tmp_path / "my_zoo.py").write_text("import keras\n\ndef make(input_shape):\n    pass\n")
    code = (
        "import sys, train.cli as c; rc = c.main(['fit', '--model', 'my_zoo:make']); "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules; sys.exit(rc)"
    )
    env = {"PYTHONPATH": f"{PROJECT_ROOT}:{tmp_path}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"ConfigError: MODEL='my_zoo:make' is not valid: make() in {tmp_path / 'my_zoo.py'} (line 3) takes 1 positional "
        "argument; a model factory is make_model(input_shape, num_classes)"
    )


def test_no_validation_images_with_a_validation_monitor(tmp_path):
    with pytest.raises(
        ConfigError, match=r"VAL_SPLIT=0.0 is not valid: 0 leaves no validation images, so MONITOR=val_accuracy"
    ):
        load(env={"DATASET": f"images:{tmp_path}", "VAL_SPLIT": "0"})
    assert load(env={"DATASET": f"images:{tmp_path}", "VAL_SPLIT": "0", "MONITOR": "loss"}).val_split == 0


@pytest.mark.parametrize("kind", ["mnist", "npz"])
def test_no_validation_data_with_a_validation_monitor_on_any_data_set(kind, tmp_path):
    dataset = f"npz:{write_tiny_npz(tmp_path)}" if kind == "npz" else kind
    with pytest.raises(
        ConfigError, match=r"VAL_SPLIT=0.0 is not valid: 0 leaves no validation images, so MONITOR=val_loss"
    ):
        load(env={"DATASET": dataset, "VAL_SPLIT": "0", "MONITOR": "val_loss"})
    assert load(env={"DATASET": dataset, "VAL_SPLIT": "0", "MONITOR": "accuracy"}).val_split == 0
    # A run recorded before validation was split off validated on the test split: VAL_SPLIT never applied to it.
    assert load(env={"DATASET": dataset, "VAL_SPLIT": "0", "VAL_FROM": "test"}).monitor == "val_accuracy"


def test_a_run_recorded_before_validation_was_split_off_keeps_validating_on_the_test_split():
    saved = Settings().to_dict()
    del saved["val_from"]
    assert Settings().val_from == "train"
    assert settings_from_dict(saved).val_from == "test"
    assert settings_from_dict({**saved, "val_from": "train"}).val_from == "train"


def test_debug_defaults_to_this_directorys_env_and_the_process_environment(tmp_path, monkeypatch):
    from train.config import debug_requested

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEBUG", raising=False)
    assert debug_requested() is False
    (tmp_path / ".env").write_text("DEBUG=1\n")
    assert debug_requested() is True
    monkeypatch.setenv("DEBUG", "0")
    assert debug_requested() is False


# From the registries: a fork that registers a model or a data set (docs/extending.md) changes no test.
ONE_OF_DATASETS = "one of " + ", ".join(datasets.DATASETS) + ", npz:<file>, images:<dir>"
ONE_OF_MODELS = "one of " + ", ".join(models.MODELS) + " or package.module:function"


def test_the_template_ships_its_data_sets_and_models_first_in_their_lists():
    assert list(datasets.DATASETS)[:3] == ["mnist", "fashion_mnist", "cifar10"]
    assert list(models.MODELS)[:3] == ["cnn", "cnn_bn", "resnet_small"]


@pytest.mark.parametrize(
    "name, raw, rule",
    [
        ("DETERMINISTIC", "maybe", "expected true/false (1/0, yes/no, on/off)"),
        ("EPOCHS", "abc", "expected a whole number, e.g. 3"),
        ("LEARNING_RATE", "fast", "expected a number, e.g. 0.007"),
        ("LEARNING_RATE", "inf", "expected a finite number"),
        ("LEARNING_RATE", "-inf", "expected a finite number"),
        ("LEARNING_RATE", "nan", "expected a finite number"),
        ("DATASET", "mnist2", ONE_OF_DATASETS),
        ("DATASET", "npz:", ONE_OF_DATASETS),
        (
            "DATASET",
            "npz:/nonexistent.npz",
            "file /nonexistent.npz does not exist; give the path of an .npz with x_train/y_train/x_test/y_test",
        ),
        (
            "DATASET",
            "images:/nonexistent",
            "directory /nonexistent does not exist; give a directory with one sub-directory per class",
        ),
        ("MODEL", "bad model", ONE_OF_MODELS),
    ],
)
def test_each_bad_value_gets_its_own_exact_message(name, raw, rule):
    with pytest.raises(ConfigError) as info:
        load_settings({}, env_file=None, environ={name: raw})
    assert str(info.value) == f"{name}={raw!r} is not valid: {rule}" and info.value.name == name


def test_a_data_path_may_contain_a_colon(tmp_path):
    (tmp_path / "a:b.npz").write_bytes(b"")
    assert load_settings({}, env_file=None, environ={"DATASET": f"npz:{tmp_path}/a:b.npz"}).dataset.endswith("a:b.npz")


@pytest.mark.parametrize(
    "name, raw, rule",
    [
        ("SHUFFLE_BUFFER", "-1", "must be >= 0"),
        ("IMAGE_SIZE", "4", "must be between 8 and 4096"),
        ("IMAGE_SIZE", "4097", "must be between 8 and 4096"),
        ("EPOCHS", "0", "must be a positive whole number (at most 100000)"),
        ("VAL_SPLIT", "0.95", "must be between 0.0 and 0.9"),
    ],
)
def test_each_range_rule_is_worded_for_its_bounds(name, raw, rule):
    with pytest.raises(ConfigError) as info:
        load_settings({}, env_file=None, environ={name: raw})
    assert str(info.value) == f"{name}={int(raw) if '.' not in raw else float(raw)!r} is not valid: {rule}"


def test_the_bounds_themselves_are_allowed():
    s = load_settings(
        {},
        env_file=None,
        environ={
            "EPOCHS": "100000",
            "IMAGE_SIZE": "8",
            "VAL_SPLIT": "0.9",
            "LEARNING_RATE": "10",
            "SHUFFLE_BUFFER": "0",
        },
    )
    assert (s.epochs, s.image_size, s.val_split, s.learning_rate, s.shuffle_buffer) == (100000, 8, 0.9, 10.0, 0)


def test_rules_between_settings_exactly(tmp_path):
    images = tmp_path / "img"
    images.mkdir()

    def message(**env):
        with pytest.raises(ConfigError) as info:
            load_settings({}, env_file=None, environ=env)
        return info.value.name, str(info.value)

    assert message(RUN_NAME="a b") == (
        "RUN_NAME",
        "RUN_NAME='a b' is not valid: letters, digits, '-' and '_' only, at most 64 characters",
    )
    assert message(VAL_SPLIT="0", DATASET=f"images:{images}")[1] == (
        "VAL_SPLIT=0.0 is not valid: 0 leaves no validation images, so MONITOR=val_accuracy is never measured: set "
        "VAL_SPLIT above 0 (e.g. 0.1) or MONITOR=accuracy or loss"
    )
    assert message(IMAGE_SIZE="9", DATASET=f"images:{images}", MODEL="cnn")[0] == "IMAGE_SIZE"
    assert (
        load_settings({}, env_file=None, environ={"IMAGE_SIZE": "10", "DATASET": f"images:{images}"}).image_size == 10
    )


def test_a_named_env_file_must_exist_but_the_default_may_not(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as info:
        load_settings({}, env_file=tmp_path / "my.env", environ={})
    assert info.value.name == "ENV_FILE" and str(info.value) == (
        f"ENV_FILE='{tmp_path / 'my.env'}' is not valid: file does not exist; create it from .env.example"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EPOCHS", "7")
    assert load_settings({}).epochs == 7  # no ./.env: fine; the process environment is read by default
    (tmp_path / ".env").write_text("EPOCHS=5\n")
    monkeypatch.delenv("EPOCHS")
    assert load_settings({}).epochs == 5  # ./.env is the default file


def test_monitor_follows_the_metrics_of_a_registered_model(monkeypatch):
    monkeypatch.setitem(models.MODELS, "regressor", models.ModelEntry(None, "", metrics={"mae": None}))
    with pytest.raises(ConfigError, match=r"MONITOR='val_accuracy' is not valid: one of val_mae, val_loss, mae, loss"):
        load(env={"MODEL": "regressor"})
    assert load(env={"MODEL": "regressor", "MONITOR": "val_mae"}).monitor == "val_mae"


def test_a_settings_kind_is_one_of_the_declared_kinds():
    from train.config import of_kind

    with pytest.raises(ValueError, match="unknown kind"):
        of_kind("fre")
    assert of_kind("label") == {"run_name"}


@pytest.mark.parametrize(
    "declared, problem",
    [
        (
            _f(0.0, "label smoothing", minimum=0.0),  # a bound that would never be checked
            "_f() has no minimum= (did you mean min=?); its rules are choices=, min=, max=, url=, recorded_before=",
        ),
        (
            _f(0.0, "label smoothing", kind="results"),
            "kind='results' is not a kind: one of result, free, surroundings, label, invocation",
        ),
        (0.0, "a plain field has no help and no kind: declare it with _f(default, doc, ...)"),
    ],
)
def test_a_setting_whose_declaration_its_checks_cannot_use_is_refused_naming_it(declared, problem):
    from train.config import _check_declarations

    _check_declarations(dataclasses.make_dataclass("S", [("label_smoothing", float, _f(0.0, "doc", min=0.0))]))
    with pytest.raises(RegisterError) as info:
        _check_declarations(dataclasses.make_dataclass("S", [("label_smoothing", float, declared)]))
    assert str(info.value) == f"setting 'label_smoothing': {problem} (docs/extending.md)"


def test_settings_become_the_fit_flags_that_give_them_back():
    from train.config import as_flags

    flags = as_flags({"batch_size": 32, "export": False, "deterministic": True, "run_name": None, "model": "cnn_bn"})
    assert flags == ["--batch-size", "32", "--no-export", "--deterministic", "--model", "cnn_bn"]
    from train import cli

    args = cli.build_parser().parse_args(["fit", *flags])
    assert (args.batch_size, args.export, args.deterministic, args.model) == ("32", False, True, "cnn_bn")


def test_a_warm_up_must_end_before_the_training_does():
    with pytest.raises(ConfigError) as e:
        load_settings({"epochs": 2, "lr_warmup_epochs": 2}, env_file=None, environ={})
    assert str(e.value) == (
        "LR_WARMUP_EPOCHS=2.0 is not valid: the warm-up must end before the training does (EPOCHS=2): give less than 2"
    )
    assert load_settings({"epochs": 2, "lr_warmup_epochs": 1.5}, env_file=None, environ={}).lr_warmup_epochs == 1.5


def test_a_run_saved_before_a_setting_existed_gets_the_value_that_version_used():
    """A config.json without LR_WARMUP_EPOCHS trained without a warm-up: resumed or reproduced, it
    must not take today's default of one."""
    saved = dataclasses.asdict(Settings())
    del saved["lr_warmup_epochs"]
    assert Settings().lr_warmup_epochs > 0
    assert settings_from_dict(saved).lr_warmup_epochs == 0.0
    assert settings_from_dict({**saved, "lr_warmup_epochs": 0.7}).lr_warmup_epochs == 0.7


# -- a secret in a URL-valued setting is never shown -------------------------------------------------
_PW = "Hunt3rTw0"  # the secret: neither half may show (a / ? # @ in it splits it in two)
_SECRET_URLS = [
    f"{{scheme}}://KEY:{_PW[:4]}/{_PW[4:]}@{{host}}",
    f"{{scheme}}://KEY:{_PW[:4]}?{_PW[4:]}@{{host}}",
    f"{{scheme}}://KEY:{_PW[:4]}#{_PW[4:]}@{{host}}",
    f"{{scheme}}://KEY:{_PW[:4]}@{_PW[4:]}@{{host}}",
    f"{{scheme}}://KEY:{_PW[:4]}%40{_PW[4:]}@{{host}}",
    f"{{scheme}}://{_PW}@{{host}}",
    f"{{scheme}}:KEY:{_PW}@{{host}}",
    f"{{scheme}}://{{host}}?token={_PW}",
    f"{{scheme}}://{{host}}#{_PW}",
]
# Each URL-valued setting: a scheme and host it takes, and the extra that declares it (None: the core).
_URL_VALUED = {
    "runs_dir": ("s3", "bucket/runs", None),
    "mlflow_tracking_uri": ("https", "host:5000", "mlflow"),
    "sweep_storage": ("postgresql", "host:5432/db", "sweep"),
}


def test_the_url_valued_settings_are_the_ones_marked_so():
    from train.config import URL_SETTINGS

    # A new setting that takes a URL must be marked url=True (then masked everywhere): add it here too.
    assert URL_SETTINGS == {name for name, (*_, extra) in _URL_VALUED.items() if extra is None or extra_present(extra)}


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=pytest.mark.extra(extra) if extra else ()) for name, (*_, extra) in _URL_VALUED.items()],
)
@pytest.mark.parametrize("template", _SECRET_URLS)
def test_a_secret_in_any_url_valued_setting_never_shows_in_an_error_or_in_settings(tmp_path, capsys, name, template):
    from train.cli import main

    scheme, host, _ = _URL_VALUED[name]
    value = template.format(scheme=scheme, host=host)
    halves = (_PW[:4], _PW[4:])
    env = tmp_path / ".env"
    env.write_text(f"RUNS_DIR={tmp_path / 'runs'}\n{name.upper()}={value}\n")
    try:
        s = load({name: value, "runs_dir": str(tmp_path / "runs")} if name != "runs_dir" else {name: value})
    except ConfigError as exc:
        shown = f"{exc} {exc.value!r} {exc.allowed}"
    else:
        shown = str(s.to_dict())
    rc = main(["settings", "--env-file", str(env)])
    out = capsys.readouterr()
    shown += out.out + out.err
    assert rc in (0, 2) and "***" in shown
    assert not [h for h in halves if h in shown], shown


@pytest.mark.parametrize(
    "uri, masked",
    [
        ("postgresql://user:pa/ss@host/db", "postgresql://***@host/db"),
        ("postgresql://user:pa?ss@host/db?sslmode=require", "postgresql://***@host/db?***"),
        ("postgresql://u:p%40ss@host:5432/db", "postgresql://***@host:5432/db"),
        ("http:bob:pw@host", "http:***@host"),
        ("http://host:5000/?token=x", "http://host:5000/?***"),
        ("s3://bucket/runs", "s3://bucket/runs"),
        ("sqlite:////tmp/study.db", "sqlite:////tmp/study.db"),
        ("sqlite:////data/a@b/study.db", "sqlite:////data/a@b/study.db"),  # no host, no user: a path's @
        ("sqlite:///a@b/study.db?timeout=5", "sqlite:///a@b/study.db?***"),
    ],
)
def test_redact_uri_masks_up_to_the_last_at_and_the_query(uri, masked):
    from train.locations import redact_uri

    assert redact_uri(uri) == masked


@pytest.mark.extra("sweep")
def test_a_settings_difference_shows_a_url_masked():
    a = load({"sweep_storage": f"postgresql://u:{_PW[:4]}/{_PW[4:]}@h/db"})
    b = load({"sweep_storage": "postgresql://u:other@h/db"})
    (line,) = diff_settings(a, b, ignore=frozenset())
    assert line == "SWEEP_STORAGE: 'postgresql://***@h/db' -> 'postgresql://***@h/db'"


def test_a_store_url_in_a_fork_without_the_store_folder_is_refused_as_settings_load(monkeypatch):
    from train import extras

    # A fork that deleted train/store: `settings` must refuse what `fit` and `runs` would, not print it.
    without = {name: section for name, section in extras.sections_by_name().items() if name != "store"}
    monkeypatch.setattr(extras, "sections_by_name", lambda: without)
    with pytest.raises(ConfigError) as e:
        load({"runs_dir": "s3://bucket/runs"})
    assert str(e.value) == f"RUNS_DIR='s3://bucket/runs' is not valid: {extras.NO_STORE}"
