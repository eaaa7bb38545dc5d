"""SPACE.toml: every bad file is one line and exit 2, before Optuna or TensorFlow, and an existing study stays as it was."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PROJECT_ROOT, subprocess_env

from train.cli import main
from train.config import load_settings
from train.errors import ConfigError
from train.sweep.space import read_space

GOOD = """
[study]
name = "s"
trials = 3
[space]
learning_rate = { low = 1e-4, high = 1e-2, log = true }
batch_size = [16, 32]
"""


def _settings(tmp_path, **kw):
    return load_settings({"runs_dir": str(tmp_path / "runs"), **kw}, env_file=None, environ={})


def _write(tmp_path, text, name="space.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_file_gives_the_study_and_its_params(tmp_path):
    spec = read_space(_write(tmp_path, GOOD), _settings(tmp_path))
    assert (spec.name, spec.trials, spec.metric, spec.direction) == ("s", 3, "val_accuracy", "maximize")
    lr, batch = spec.params
    assert (lr.low, lr.high, lr.log, lr.integer) == (1e-4, 1e-2, True, False)
    assert batch.choices == (16, 32)


def test_the_name_defaults_to_the_stem_and_the_direction_follows_the_metric(tmp_path):
    text = '[study]\nmetric = "val_loss"\n[space]\nepochs = { low = 1, high = 3 }\n'
    spec = read_space(_write(tmp_path, text, "lr-search.toml"), _settings(tmp_path))
    assert (spec.name, spec.direction, spec.params[0].integer) == ("lr-search", "minimize", True)


BAD = {
    "unknown setting": ("[space]\nlerning_rate = [0.1]\n", "not a setting"),
    "value out of the setting's range": ("[space]\nlearning_rate = { low = 1e-4, high = 20.0 }\n", "LEARNING_RATE"),
    "bad choice": ('[space]\nmodel = ["cnn", "nope"]\n', "MODEL"),
    "empty range": ("[space]\nlearning_rate = { low = 1e-2, high = 1e-3 }\n", "empty range"),
    "equal bounds": ("[space]\nlearning_rate = { low = 1e-2, high = 1e-2 }\n", "empty range"),
    "a step over the range": ("[space]\nbatch_size = { low = 16, high = 32, step = 100 }\n", "leaves one value"),
    "a float step over the range": (
        "[space]\nlearning_rate = { low = 1e-3, high = 1e-2, step = 0.5 }\n",
        "a step over high - low (0.009) leaves one value",
    ),
    "empty list": ("[space]\nbatch_size = []\n", "empty list"),
    "float for a whole number": (
        "[space]\nbatch_size = { low = 8.5, high = 64 }\n",
        "batch_size=8.5 is not valid: BATCH_SIZE expected a whole number",
    ),
    "log range from 0": ("[space]\nlearning_rate = { low = 0.0, high = 1e-2, log = true }\n", "must be between"),
    "grid with a continuous range": (
        '[study]\nsampler = "grid"\n[space]\nlearning_rate = { low = 1e-4, high = 1e-2 }\n',
        "grid",
    ),
    "name with a slash": ('[study]\nname = "../x"\n[space]\nbatch_size = [16]\n', "path separator"),
    "name with a backslash": ('[study]\nname = "a\\\\b"\n[space]\nbatch_size = [16]\n', "path separator"),
    "unknown study key": ("[study]\ntrails = 3\n[space]\nbatch_size = [16]\n", "keys:"),
    "unknown pruner": ('[study]\npruner = "sometimes"\n[space]\nbatch_size = [16]\n', "median"),
    "no space": ("[study]\ntrials = 3\n", "at least one setting"),
    "a where-setting searched": (
        '[space]\nruns_dir = ["a", "b"]\n',
        "[space] runs_dir=['a', 'b'] is not valid: says where",
    ),
    "the validation share searched": ("[space]\nval_split = [0.1, 0.2]\n", "cannot be searched"),
    "validating on the test split searched": ('[space]\nval_from = ["train", "test"]\n', "cannot be searched"),
    "not toml": ("[space\n", "is not valid: not TOML: "),
    "a scalar": ("[space]\nbatch_size = 16\n", "a list of values"),
    "zero trials": ("[study]\ntrials = 0\n[space]\nbatch_size = [16]\n", ">= 1"),
    "bad metric": ('[study]\nmetric = "val_f1"\n[space]\nbatch_size = [16]\n', "metric"),
    "nan in a list": ("[space]\nlearning_rate = [nan, 0.1]\n", "[space] learning_rate=nan is not valid: LEARNING_RATE"),
    "inf as a bound": ("[space]\nmin_delta = { low = 0.0, high = inf }\n", "[space] min_delta=inf is not valid"),
    "a string in a list of numbers": (
        '[space]\nbatch_size = [64, "a"]\n',
        "space.toml [space] batch_size='a' is not valid: BATCH_SIZE expected a whole number",
    ),
    "a list value the setting refuses": ("[space]\nbatch_size = [0, 64]\n", "batch_size=0 is not valid: BATCH_SIZE "),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_file_is_one_config_error(tmp_path, case):
    text, words = BAD[case]
    with pytest.raises(ConfigError) as err:
        read_space(_write(tmp_path, text), _settings(tmp_path))
    assert words in str(err.value)
    assert "\n" not in str(err.value)
    assert str(err.value).count("is not valid") <= 1  # the setting's refusal not wrapped in a second one


def _db_digest(runs: Path) -> str:
    return hashlib.sha256((runs / "sweeps" / "s.db").read_bytes()).hexdigest()


def _existing_study(tmp_path) -> Path:
    from train.sweep.storage import default_url, open_storage, open_study

    spec = read_space(_write(tmp_path, GOOD), _settings(tmp_path))
    url = default_url(tmp_path / "runs", "s")
    study = open_study(open_storage(url, 60), spec, url, None)
    study.enqueue_trial({"learning_rate": 1e-3, "batch_size": 16})
    return tmp_path / "runs"


@pytest.mark.parametrize(
    "text",
    [
        GOOD.replace("high = 1e-2", "high = 1e-5"),  # empty range
        GOOD.replace("batch_size", "batch_sise"),  # unknown setting
        GOOD.replace("[16, 32]", "[16, 64]"),  # another search under the same name
        GOOD.replace('name = "s"', 'name = "s"\nsampler = "random"'),
    ],
)
def test_a_bad_sweep_exits_2_with_one_line_and_leaves_the_study_as_it_was(tmp_path, capsys, text):
    runs = _existing_study(tmp_path)
    before = _db_digest(runs)
    rc = main(["sweep", str(_write(tmp_path, text, "bad.toml")), "--runs-dir", str(runs), "--env-file", "/dev/null"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("ConfigError: "), err
    assert _db_digest(runs) == before
    assert not any(p.name != "sweeps" for p in runs.iterdir())  # no run was started


def test_a_bad_file_is_refused_before_optuna_and_tensorflow_load(tmp_path):
    bad = _write(tmp_path, "[space]\nlearning_rate = { low = 1e-2, high = 1e-3 }\n")
    code = (
        "import sys; from train.cli import main; rc = main(['sweep', sys.argv[1], '--env-file', '/dev/null']);"
        "print(rc, 'tensorflow' in sys.modules, 'optuna' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(bad)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert out.stdout.split() == ["2", "False", "False"], out.stderr
    assert "empty range" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_study_flag_with_a_path_separator_is_refused(tmp_path, capsys):
    rc = main(
        ["sweep", str(_write(tmp_path, GOOD)), "--study", "a/b", "--runs-dir", str(tmp_path), "--env-file", "/dev/null"]
    )
    assert rc == 2 and "path separator" in capsys.readouterr().err
    assert PROJECT_ROOT.is_dir()


@pytest.mark.skipif(
    not (PROJECT_ROOT / "sweeps").is_dir(), reason="the example space files are host-side (not in the image)"
)
def test_the_example_space_file_is_valid(tmp_path):
    spec = read_space(PROJECT_ROOT / "sweeps" / "example.toml", _settings(tmp_path))
    assert spec.name == "example" and {p.name for p in spec.params} == {"learning_rate", "batch_size", "model"}


def test_a_sweep_on_runs_dir_in_object_storage_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a URL taken as a local path would make a folder `s3:`
    space = tmp_path / "s.toml"
    space.write_text("[study]\ntrials = 1\n[space]\nlearning_rate = { low = 1e-4, high = 1e-2, log = true }\n")
    rc = main(["sweep", str(space), "--env-file", "/dev/null", "--runs-dir", "s3://bucket/runs"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "RUNS_DIR='s3://bucket/runs'" in err[0] and "local folder" in err[0]
    assert not (tmp_path / "s3:").exists()


@pytest.mark.extra("workers")
@pytest.mark.parametrize(
    "flags, environ, name, fix",
    [
        (["--workers", "127.0.0.1:5001,127.0.0.1:5002", "--worker-index", "0"], {}, "WORKERS", "unset it"),
        (
            [],
            {"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'},
            "TF_CONFIG",
            "unset it",
        ),
        (
            [],
            {"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NODE_RANK": "0"},
            "SKYPILOT_NODE_IPS",
            "launch each sweep on one node",
        ),
    ],
    ids=["WORKERS", "TF_CONFIG", "SkyPilot"],
)
def test_a_sweep_in_a_cluster_is_refused_before_its_first_trial_waits_for_the_others(
    tmp_path, capsys, monkeypatch, flags, environ, name, fix
):
    """Each trial waited up to JOIN_TIMEOUT for its other workers, whose own sweeps propose other parameters."""
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    space = tmp_path / "s.toml"
    space.write_text("[study]\ntrials = 1\n[space]\nlearning_rate = [0.01, 0.02]\n")
    # A short JOIN_TIMEOUT: without the refusal, the first trial fails soon instead of waiting 900 s.
    argv = ["sweep", str(space), "--env-file", "/dev/null", "--runs-dir", str(tmp_path / "runs"), "--join-timeout", "5"]
    rc = main([*argv, *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"ConfigError: {name}=") and err[0].endswith(
        f"is not valid: names 2 workers, but a sweep trains each trial in this one process: {fix}, and start a "
        "sweep on each machine against one SWEEP_STORAGE instead (docs/sweeps.md)"
    ), err[0]
    assert not (tmp_path / "runs").exists()


def test_a_value_valid_beside_another_searched_setting_is_taken_and_one_valid_with_none_is_refused(tmp_path):
    """LR_WARMUP_EPOCHS=5 was refused against the fixed EPOCHS=3 although EPOCHS was searched from 6: a pair
    refused only together fails its trial; a value no searched value makes valid is refused at once."""
    searched = "[space]\nepochs = { low = 6, high = 10 }\nlr_warmup_epochs = [0, 5]\n"
    spec = read_space(_write(tmp_path, searched), _settings(tmp_path))
    assert [p.choices for p in spec.params if p.name == "lr_warmup_epochs"] == [(0.0, 5.0)]
    never = "[space]\nepochs = [4, 6]\nlr_warmup_epochs = [0, 7]\n"  # 7 is not below any EPOCHS searched
    ranged = "[space]\nepochs = [6, 8]\nlr_warmup_epochs = { low = 4, high = 5 }\n"  # a range's ends alike
    assert [(p.low, p.high) for p in read_space(_write(tmp_path, ranged), _settings(tmp_path)).params] == [
        (None, None),
        (4.0, 5.0),
    ]
    # EPOCHS=3 is valid only beside the low end of the warm-up's range, LR_WARMUP_EPOCHS=6 only beside the high end of EPOCHS'.
    ends = "[space]\nepochs = [3, 10]\nlr_warmup_epochs = { low = 2, high = 5 }\n"
    assert read_space(_write(tmp_path, ends), _settings(tmp_path, epochs=10, lr_warmup_epochs=4)).params[0].choices == (
        3,
        10,
    )
    ends = "[space]\nepochs = { low = 4, high = 8 }\nlr_warmup_epochs = [6]\n"
    assert read_space(_write(tmp_path, ends), _settings(tmp_path)).params[1].choices == (6.0,)
    with pytest.raises(
        ConfigError, match=r"lr_warmup_epochs=7 is not valid: .*the warm-up must end before the training does"
    ):
        read_space(_write(tmp_path, never), _settings(tmp_path))


def test_the_record_kept_with_a_study_is_this_exact_json_so_a_study_made_before_compares_equal(tmp_path):
    text = GOOD + 'model = ["cnn", "resnet_small"]\nepochs = { low = 2, high = 8, step = 2 }\n'
    spec = read_space(_write(tmp_path, text), _settings(tmp_path, epochs=10))
    assert spec.space_record() == (
        '{"direction": "maximize", "metric": "val_accuracy", "pruner": "median", "sampler": "tpe", "space": ['
        '{"high": 0.01, "log": true, "low": 0.0001, "name": "learning_rate"}, '
        '{"choices": [16, 32], "name": "batch_size"}, '
        '{"choices": ["cnn", "resnet_small"], "name": "model"}, '
        '{"high": 8, "integer": true, "low": 2, "name": "epochs", "step": 2}]}'
    )
    # A grid's points: a list's values, none for a range (the grid sampler refuses ranges anyway).
    assert spec.grid() == {"learning_rate": [], "batch_size": [16, 32], "model": ["cnn", "resnet_small"], "epochs": []}


# Each refusal of a space file, the whole line: (file, message with {where} for its path).
WHOLE = {
    "not toml": (
        "[space\n",
        "SPACE='{where}' is not valid: not TOML: Expected ']' at the end of a table declaration (at line 1, column 7)",
    ),
    "other tables": (
        "[space]\nbatch_size = [8]\n[zeta]\n[extra]\n",
        "{where} [extra]='extra' is not valid: a space file has only the tables [study] and [space]",
    ),
    "study not a table": (
        "study = 3\n[space]\nbatch_size = [8]\n",
        "{where} study=3 is not valid: must be a table: [study]",
    ),
    "space not a table": (
        "space = [1]\n",
        "{where} space=[1] is not valid: must be a table: [space]",
    ),
    "unknown study keys": (
        "[study]\ntrails = 3\nzz = 1\n[space]\nbatch_size = [8]\n",
        "{where} [study] trails=3 is not valid: keys: name, trials, metric, pruner, sampler, startup_trials, heartbeat",
    ),
    "name not a string": (
        "[study]\nname = 3\n[space]\nbatch_size = [8]\n",
        "{where} [study] name=3 is not valid: letters, digits, '-' and '_' only, at most 48 characters (it names RUNS_DIR/sweeps/<name>.db)",
    ),
    "name too long": (
        "[study]\nname = 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'\n[space]\nbatch_size = [8]\n",
        "{where} [study] name='aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' is not valid: letters, digits, '-' and '_' only, at most 48 characters (it names RUNS_DIR/sweeps/<name>.db)",
    ),
    "name with a slash": (
        "[study]\nname = 'a/b'\n[space]\nbatch_size = [8]\n",
        "{where} [study] name='a/b' is not valid: no path separators: letters, digits, '-' and '_' only, at most 48 characters (it names RUNS_DIR/sweeps/<name>.db)",
    ),
    "bad metric": (
        "[study]\nmetric = 'val_f1'\n[space]\nbatch_size = [8]\n",
        "{where} [study] metric='val_f1' is not valid: one of val_accuracy, val_loss, accuracy, loss",
    ),
    "trials true": (
        "[study]\ntrials = true\n[space]\nbatch_size = [8]\n",
        "{where} [study] trials=True is not valid: a whole number >= 1",
    ),
    "trials a string": (
        "[study]\ntrials = '3'\n[space]\nbatch_size = [8]\n",
        "{where} [study] trials='3' is not valid: a whole number >= 1",
    ),
    "startup below 0": (
        "[study]\nstartup_trials = -1\n[space]\nbatch_size = [8]\n",
        "{where} [study] startup_trials=-1 is not valid: a whole number >= 0",
    ),
    "heartbeat 0": (
        "[study]\nheartbeat = 0\n[space]\nbatch_size = [8]\n",
        "{where} [study] heartbeat=0 is not valid: a whole number >= 1",
    ),
    "bad pruner": (
        "[study]\npruner = 'x'\n[space]\nbatch_size = [8]\n",
        "{where} [study] pruner='x' is not valid: one of median, hyperband, none",
    ),
    "bad sampler": (
        "[study]\nsampler = 'cmaes'\n[space]\nbatch_size = [8]\n",
        "{where} [study] sampler='cmaes' is not valid: one of tpe, random, grid",
    ),
    "no space": (
        "[study]\ntrials = 3\n",
        "{where} [space]='{}' is not valid: list at least one setting to search, e.g. learning_rate = [1e-3, 1e-2]",
    ),
    "grid with a range": (
        "[study]\nsampler = 'grid'\n[space]\nbatch_size = [8]\nlearning_rate = { low = 1e-4, high = 1e-2 }\n",
        '{where} [space] learning_rate={\'low\': 0.0001, \'high\': 0.01} is not valid: sampler = "grid" needs a list of values for every setting: give a list, or use sampler = "tpe" or "random"',
    ),
    "not a setting, close": (
        "[space]\nlearn = [0.1]\n",
        "{where} [space] learn=[0.1] is not valid: not a setting (did you mean learning_rate?): the keys of [space] are settings, lower case (python -m train settings)",
    ),
    "not a setting, three close ones": (
        "[space]\nexpox = [1]\n",
        "{where} [space] expox=[1] is not valid: not a setting (did you mean export, export_formats, export_quantize?): "
        "the keys of [space] are settings, lower case (python -m train settings)",
    ),
    "not a setting": (
        "[space]\nzzz = [1]\n",
        "{where} [space] zzz=[1] is not valid: not a setting: the keys of [space] are settings, lower case (python -m train settings)",
    ),
    "not searched": (
        "[space]\nmonitor = ['val_loss']\n",
        "{where} [space] monitor=['val_loss'] is not valid: says where a trial runs or what the study measures, so it cannot be searched",
    ),
    "empty list": (
        "[space]\nbatch_size = []\n",
        "{where} [space] batch_size=[] is not valid: an empty list: give at least one value",
    ),
    "twice": (
        "[space]\nbatch_size = [8, 16, 8]\n",
        "{where} [space] batch_size=[8, 16, 8] is not valid: a value is listed twice: list each once",
    ),
    "scalar": (
        "[space]\nbatch_size = 8\n",
        "{where} [space] batch_size=8 is not valid: a list of values [a, b, ...] or a range { low = ..., high = ... }",
    ),
    "range extra key": (
        "[space]\nbatch_size = { low = 8, high = 16, by = 2 }\n",
        "{where} [space] batch_size={'low': 8, 'high': 16, 'by': 2} is not valid: a range is { low = ..., high = ..., log = true|false, step = ... }",
    ),
    "range without high": (
        "[space]\nbatch_size = { low = 8 }\n",
        "{where} [space] batch_size={'low': 8} is not valid: a range is { low = ..., high = ..., log = true|false, step = ... }",
    ),
    "range without low": (
        "[space]\nbatch_size = { high = 8 }\n",
        "{where} [space] batch_size={'high': 8} is not valid: a range is { low = ..., high = ..., log = true|false, step = ... }",
    ),
    "range of a word": (
        "[space]\nmodel = { low = 1, high = 2 }\n",
        "{where} [space] model={'low': 1, 'high': 2} is not valid: MODEL is not a number: list its values instead",
    ),
    "empty range": (
        "[space]\nbatch_size = { low = 16, high = 8 }\n",
        "{where} [space] batch_size={'low': 16, 'high': 8} is not valid: an empty range (low 16 must be below high 8); for one value use a list",
    ),
    "log not bool": (
        "[space]\nlearning_rate = { low = 1e-4, high = 1e-2, log = 1 }\n",
        "{where} [space] learning_rate={'low': 0.0001, 'high': 0.01, 'log': 1} is not valid: log is true or false",
    ),
    "log from 0": (
        "[space]\nmin_delta = { low = 0.0, high = 0.5, log = true }\n",
        "{where} [space] min_delta={'low': 0.0, 'high': 0.5, 'log': True} is not valid: a log range needs low > 0",
    ),
    "step bool": (
        "[space]\nbatch_size = { low = 8, high = 16, step = true }\n",
        "{where} [space] batch_size={'low': 8, 'high': 16, 'step': True} is not valid: step must be a positive number (a whole number for whole-number settings)",
    ),
    "step a string": (
        "[space]\nbatch_size = { low = 8, high = 16, step = '2' }\n",
        "{where} [space] batch_size={'low': 8, 'high': 16, 'step': '2'} is not valid: step must be a positive number (a whole number for whole-number settings)",
    ),
    "step 0": (
        "[space]\nlearning_rate = { low = 0.1, high = 0.2, step = 0 }\n",
        "{where} [space] learning_rate={'low': 0.1, 'high': 0.2, 'step': 0} is not valid: step must be a positive number (a whole number for whole-number settings)",
    ),
    "step float for int": (
        "[space]\nbatch_size = { low = 8, high = 16, step = 2.0 }\n",
        "{where} [space] batch_size={'low': 8, 'high': 16, 'step': 2.0} is not valid: step must be a positive number (a whole number for whole-number settings)",
    ),
    "log and step": (
        "[space]\nlearning_rate = { low = 0.1, high = 0.5, log = true, step = 0.1 }\n",
        "{where} [space] learning_rate={'low': 0.1, 'high': 0.5, 'log': True, 'step': 0.1} is not valid: a range has either log = true or a step, not both",
    ),
    "step over": (
        "[space]\nbatch_size = { low = 8, high = 16, step = 9 }\n",
        "{where} [space] batch_size={'low': 8, 'high': 16, 'step': 9} is not valid: a step over high - low (8) leaves one value, low; for one value use a list",
    ),
    "coerce fails": (
        "[space]\nbatch_size = ['a']\n",
        "{where} [space] batch_size='a' is not valid: BATCH_SIZE expected a whole number, e.g. 512",
    ),
    "wrong type": (
        "[space]\nbatch_size = [8.0]\n",
        "{where} [space] batch_size=8.0 is not valid: BATCH_SIZE expected a whole number, e.g. 512",
    ),
    "bool for int": (
        "[space]\nbatch_size = [true]\n",
        "{where} [space] batch_size=True is not valid: BATCH_SIZE expected a whole number, e.g. 512",
    ),
    "inf": (
        "[space]\nlearning_rate = [inf]\n",
        "{where} [space] learning_rate=inf is not valid: LEARNING_RATE expected a finite number",
    ),
    "refused": (
        "[space]\nbatch_size = [0]\n",
        "{where} [space] batch_size=0 is not valid: BATCH_SIZE must be a positive whole number (at most 1048576)",
    ),
    "refused with others": (
        "[space]\nepochs = [4, 6]\nlr_warmup_epochs = [7]\n",
        "{where} [space] lr_warmup_epochs=7 is not valid: LR_WARMUP_EPOCHS the warm-up must end before the training does (EPOCHS=3): give less than 3",
    ),
}


@pytest.mark.parametrize("case", list(WHOLE))
def test_each_refusal_of_a_space_file_is_this_whole_line(tmp_path, case):
    text, line = WHOLE[case]
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        read_space(path, _settings(tmp_path))
    assert str(err.value) == line.replace("{where}", str(path))


def test_a_space_file_missing_or_not_utf8_is_named_with_the_fix(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as err:
        read_space(missing, _settings(tmp_path))
    assert str(err.value) == f"SPACE='{missing}' is not valid: file does not exist; write one like docs/sweeps.md shows"
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"[space]\nmodel = ['\xe9']\n")
    with pytest.raises(ConfigError) as err:
        read_space(latin, _settings(tmp_path))
    assert str(err.value) == (
        f"SPACE='{latin}' is not valid: cannot be read ('utf-8' codec can't decode byte 0xe9 in position 18: "
        "invalid continuation byte); give a readable UTF-8 TOML file"
    )


def test_study_flag_names_are_checked_as_the_file_s_and_replace_it(tmp_path):
    spec = read_space(_write(tmp_path, GOOD), _settings(tmp_path), "lr_2-b")
    assert spec == read_space(_write(tmp_path, GOOD.replace('"s"', '"lr_2-b"')), _settings(tmp_path))
    rule = "letters, digits, '-' and '_' only, at most 48 characters (it names RUNS_DIR/sweeps/<name>.db)"
    for name, why in (("a\\b", "no path separators: "), ("a/b", "no path separators: "), ("a b", "")):
        with pytest.raises(ConfigError) as err:
            read_space(_write(tmp_path, GOOD), _settings(tmp_path), name)
        assert str(err.value) == f"--study={name!r} is not valid: {why}{rule}"
    # A file's stem that names no study (a dot, a space) is refused with the two ways out, and --study is one.
    dotted = _write(tmp_path, "[space]\nbatch_size = [8, 16]\n", "lr.v2.toml")
    with pytest.raises(ConfigError) as err:
        read_space(dotted, _settings(tmp_path))
    assert str(err.value) == (
        f"{dotted} [study] name='lr.v2' is not valid: {rule}; the file's stem is the default: set [study] name "
        "or give --study NAME"
    )
    assert read_space(dotted, _settings(tmp_path), "lr-v2").name == "lr-v2"


def test_the_study_s_defaults_and_each_key_given_are_read(tmp_path):
    spec = read_space(_write(tmp_path, "[space]\nbatch_size = [8]\n", "plain.toml"), _settings(tmp_path))
    assert (spec.name, spec.trials, spec.startup_trials, spec.heartbeat, spec.pruner, spec.sampler) == (
        "plain",
        20,
        5,
        60,
        "median",
        "tpe",
    )
    given = '[study]\ntrials = 1\nstartup_trials = 0\nheartbeat = 1\npruner = "none"\nsampler = "grid"\n'
    spec = read_space(_write(tmp_path, given + "[space]\nbatch_size = [8, 16]\n"), _settings(tmp_path))
    assert (spec.trials, spec.startup_trials, spec.heartbeat, spec.pruner, spec.sampler) == (1, 0, 1, "none", "grid")


def test_a_value_another_setting_refuses_is_refused_with_that_setting_s_whole_message(tmp_path):
    # EPOCHS=2 is refused by LR_WARMUP_EPOCHS's rule: its own name and value must stay in the message.
    with pytest.raises(ConfigError) as err:
        read_space(_write(tmp_path, "[space]\nepochs = [2]\n"), _settings(tmp_path, epochs=5, lr_warmup_epochs=3))
    assert str(err.value) == (
        f"{tmp_path / 'space.toml'} [space] epochs=2 is not valid: LR_WARMUP_EPOCHS=3.0 is not valid: the warm-up "
        "must end before the training does (EPOCHS=2): give less than 2"
    )
