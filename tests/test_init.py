"""train/__init__.py: Keras's plotting helpers do not pull matplotlib into every start; everyone else still gets it;
`train(settings)` is `fit` with the template's own callbacks, and takes checked settings only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import PROJECT_ROOT, extra_present, subprocess_env

# One TensorFlow start checks what a start imports and what a run without tracking imports: the
# fresh process is all either needs, and TensorFlow's import is most of its cost.
CHILD = """
import importlib.util, json, sys
from pathlib import Path
import train, tensorflow, keras
at_start = sorted(m for m in sys.modules if m.split(".")[0] == "matplotlib")
sys.path.insert(0, "tests")
from helpers import tiny_settings
r = train.train(tiny_settings(Path(sys.argv[1]), epochs=1, export=False, report="quick"))
mlflow = sorted(m for m in sys.modules if m.split(".")[0] == "mlflow" or m == "train.tracking.mlflow_run")
import matplotlib.pyplot as plt  # a user's own code (a model factory, a notebook) imports it as usual
print(json.dumps({"at_start": at_start, "pyplot": plt.__name__, "keras": keras.__version__, "status": r.status,
                  "mlflow": mlflow, "mlflow_installed": importlib.util.find_spec("mlflow") is not None}))
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path_factory.mktemp("run"))],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=PROJECT_ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_tensorflow_starts_without_matplotlib_and_user_code_still_imports_it(child):
    assert child["at_start"] == [] and child["pyplot"] == "matplotlib.pyplot"


@pytest.mark.slow
def test_a_run_without_tracking_imports_nothing_of_mlflow(child):
    """The tracking module and the client are imported only by a run that tracks (the tracking extra's
    own tests run it with a server)."""
    assert child["status"] == "completed" and child["mlflow"] == []
    if extra_present("mlflow"):  # the client is in the lock: nothing kept it out but the setting being off
        assert child["mlflow_installed"]


def test_train_tells_the_report_then_the_export_then_the_extras_then_the_callers_own(monkeypatch):
    """train.train is fit with the template's own callbacks first, made from the run's settings."""
    import train
    from train.config import Settings
    from train.results.export import ExportCallback
    from train.results.report import ReportCallback
    from train.training import fit

    seen = {}

    def fake_fit(settings, resume, force, restart, callbacks, continue_with, parts):
        seen.update(own=parts(settings.replace(report="quick", export=False)), callbacks=list(callbacks))

    monkeypatch.setattr(fit, "fit", fake_fit)
    mine = type("Mine", (), {"on_end": lambda self, status, stop: None})()
    train.train(Settings(), callbacks=[mine])
    report, export = seen["own"]
    assert isinstance(report, ReportCallback) and report.mode == "quick"
    assert isinstance(export, ExportCallback) and export.settings.export is False
    assert seen["callbacks"] == [mine]


def test_train_refuses_settings_that_were_not_checked_in_one_line():
    import train

    with pytest.raises(
        TypeError, match=r"^train\(\) takes checked settings, not dict: pass train.config.load_settings\(yours\)"
    ):
        train.train({"epochs": 3})


def test_a_notebook_gets_its_policy_determinism_and_random_generators_back_after_a_run(monkeypatch):
    """A run sets them for itself (PRECISION, DETERMINISTIC, SEED); the caller's own come back after it."""
    import random

    import keras
    import numpy as np
    from tensorflow.python.framework import config as tf_config

    import train
    from train.config import Settings
    from train.training import fit

    def fake_fit(settings, *args, **kw):  # what the device set-up does (train.setup.devices)
        keras.utils.set_random_seed(settings.seed)
        tf_config.enable_op_determinism()
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        raise KeyboardInterrupt  # and a run stopped by a notebook's interrupt gives them back too

    monkeypatch.setattr(fit, "fit", fake_fit)
    random.seed(1), np.random.seed(1)
    expected = random.random(), np.random.rand()
    random.seed(1), np.random.seed(1)
    with pytest.raises(KeyboardInterrupt):
        train.train(Settings(deterministic=True))
    assert keras.mixed_precision.global_policy().name == "float32"
    assert not tf_config.is_op_determinism_enabled()
    assert (random.random(), np.random.rand()) == expected


def test_a_second_train_while_another_thread_trains_is_refused_in_one_line(monkeypatch):
    """Logging, the precision and the seeds are the process's: a second run would cut the first's train.log."""
    import threading

    import train
    from train.config import Settings
    from train.errors import RunBusyError
    from train.training import fit

    started, release = threading.Event(), threading.Event()

    def fake_fit(*args, **kw):
        started.set()
        release.wait(30)
        return "first"

    monkeypatch.setattr(fit, "fit", fake_fit)
    box = {}
    first = threading.Thread(target=lambda: box.update(result=train.train(Settings())))
    first.start()
    assert started.wait(30)
    try:
        with pytest.raises(RunBusyError, match=r"^a run is already training in this process \(another thread's"):
            train.train(Settings())
    finally:
        release.set()
        first.join(30)
    assert box["result"] == "first"
    assert train.train(Settings()) == "first"  # once it returned, the next run trains


def test_train_refuses_a_missing_export_runtime_before_it_trains_as_fit_does(monkeypatch):
    """From Python too, EXPORT_FORMATS whose runtime is missing stops before training, not at its export."""
    import train
    from train.config import Settings
    from train.errors import ConfigError
    from train.results import export
    from train.training import fit

    class Formats:
        def check(self):
            raise ConfigError("EXPORT_FORMATS", "savedmodel,litert", "its runtime is missing")

    monkeypatch.setattr(export, "other_formats", lambda settings: Formats())
    monkeypatch.setattr(fit, "fit", lambda *a, **kw: pytest.fail("trained"))
    with pytest.raises(ConfigError, match="its runtime is missing"):
        train.train(Settings())
    monkeypatch.setattr(fit, "fit", lambda *a, **kw: "trained")
    assert train.train(Settings(export=False)) == "trained"  # nothing exported: nothing to check


def test_a_refused_train_holds_no_lines_for_a_run_that_never_came(tmp_path):
    """Lines are held for the train.log a run opens; a start refused before there is a run (here: a
    resume of a run that is not there) gives them up, so a notebook that goes on does not keep them."""
    import logging

    import train
    from train.config import load_settings
    from train.errors import TemplateError
    from train.run.train_log import _Held

    settings = load_settings({"runs_dir": str(tmp_path), "resume": "no-such-run"}, env_file=None, environ={})
    with pytest.raises(TemplateError, match="no-such-run"):
        train.train(settings)
    assert not [h for h in logging.getLogger("train").handlers if isinstance(h, _Held)]


def test_a_run_stopped_under_train_is_continued_by_the_python_call_not_a_shell_command(monkeypatch):
    """Its last line said `python -m train fit --resume RUN`: pasted in a shell, that looks in the shell's
    RUNS_DIR (./runs), not in the one the notebook gave (RunNotFound), with none of its settings."""
    import train
    from train.config import Settings
    from train.training import fit

    told = []
    monkeypatch.setattr(fit, "fit", lambda settings, resume, force, *args, **kw: told.append(args[2]("RUN-1")))
    train.train(Settings())
    train.train(Settings(), force=True)
    train.train(Settings(), continue_with=lambda name: f"mine {name}")
    assert told == [
        "train(settings, resume='RUN-1'), with this call's settings",
        "train(settings, resume='RUN-1', force=True), with this call's settings",
        "mine RUN-1",
    ]


def test_a_keras_callback_is_refused_before_the_run_starts(monkeypatch):
    """callbacks=[keras.callbacks.EarlyStopping()] trained an epoch, then failed the run with `TypeError:
    EarlyStopping.on_epoch_end() takes from 2 to 3 positional arguments but 4 were given`."""
    import keras

    import train
    from train.config import Settings
    from train.training import fit

    monkeypatch.setattr(fit, "fit", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(
        TypeError,
        match=r"^train\(callbacks=\.\.\.\) takes the template's callbacks, not Keras callbacks: EarlyStopping is a "
        r"keras\.callbacks\.Callback, .*\(early stopping: PATIENCE; TensorBoard logs are in RUN/tensorboard\)$",
    ):
        train.train(Settings(), callbacks=[object(), keras.callbacks.EarlyStopping()])


def test_resume_that_names_no_run_is_one_type_error(monkeypatch):
    """train(settings, resume=True) failed with `unsupported operand type(s) for /: 'PosixPath' and 'bool'`."""
    from pathlib import Path

    import train
    from train.config import Settings
    from train.training import fit

    seen = []
    monkeypatch.setattr(fit, "fit", lambda settings, resume, *a, **k: seen.append(resume))
    for wrong in (True, 3):
        with pytest.raises(TypeError) as info:
            train.train(Settings(), resume=wrong)
        assert str(info.value) == (
            "train(resume=...) names the run to continue, as RESUME does: its id or path, 'latest' or 'auto' (text "
            f"or a Path), not {type(wrong).__name__} {wrong!r}; e.g. train(settings, resume='latest')"
        )
    train.train(Settings(), resume=Path("runs/x"))
    train.train(Settings(), resume="latest")
    assert seen == [Path("runs/x"), "latest"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"epochs": 0}, "EPOCHS=0 is not valid: must be a positive whole number (at most 100000)"),
        ({"batch_size": 0}, "BATCH_SIZE=0 is not valid: must be a positive whole number (at most 1048576)"),
        (
            {"epochs": "2"},
            "EPOCHS='2' is not valid: must be a whole number (load_settings({...}) converts and checks the values it "
            "is given)",
        ),
    ],
)
def test_settings_made_in_code_are_checked_before_the_run_starts(monkeypatch, changes, message):
    """train(Settings(epochs=0)) "completed" a run of no epochs; a batch of 0 failed with ZeroDivisionError,
    epochs="2" with a TypeError: each after making a run directory."""
    import train
    from train.config import Settings
    from train.errors import ConfigError
    from train.training import fit

    monkeypatch.setattr(fit, "fit", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(ConfigError) as info:
        train.train(Settings(**changes))
    assert str(info.value) == message


def test_settings_made_before_a_reload_of_the_config_are_told_so():
    """After importlib.reload(train.config) (a notebook's autoreload) the settings made before are of the old
    Settings class: the refusal said `train() takes checked settings, not Settings`."""
    import train

    stale = type("Settings", (), {"__module__": "train.config"})()  # what the class before the reload makes
    with pytest.raises(TypeError) as info:
        train.train(stale)
    assert str(info.value) == (
        "train() takes settings of this train.config, and these were made before it was loaded again (a reload, "
        "e.g. a notebook's autoreload after an edit): make them again with load_settings(...)"
    )


class _OnEpochEnd:
    def on_epoch_end(self, epoch, row, state):
        return None


class _OnEnd:  # a hook other than on_epoch_end and on_start
    def on_end(self, status, stop):
        return None


def _a_function(epoch, row, state):
    return None


@pytest.mark.parametrize(
    "given, instead",
    [
        (_OnEpochEnd(), "one _OnEpochEnd: callbacks=[yours]"),
        (_OnEnd(), "one _OnEnd: callbacks=[yours]"),
        (_OnEnd, "the class _OnEnd: callbacks=[_OnEnd()]"),
        (
            _a_function,
            "a function: a callback is an object with on_epoch_end(epoch, row, state) or another of its methods",
        ),
        (3, "int 3: a callback is an object with on_epoch_end(epoch, row, state) or another of its methods"),
    ],
)
def test_one_callback_not_in_a_list_is_one_type_error(monkeypatch, given, instead):
    """callbacks=Mine() (not [Mine()]), or a function, failed with `'Mine' object is not iterable`."""
    import train
    from train.config import Settings
    from train.training import fit

    monkeypatch.setattr(fit, "fit", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(TypeError) as info:
        train.train(Settings(), callbacks=given)
    assert str(info.value) == f"train(callbacks=...) takes a list of callbacks, not {instead}"


def test_callbacks_given_as_a_generator_reach_the_run(monkeypatch):
    """callbacks=(c for c in mine): the check for Keras callbacks read the generator, and the run got none
    of them (no error: the caller's callbacks were simply never called)."""
    import train
    from train.config import Settings
    from train.training import fit

    class Mine:
        def on_epoch_end(self, epoch, row, state):
            return None

    mine = [Mine(), Mine()]
    seen = []
    monkeypatch.setattr(fit, "fit", lambda settings, resume, force, restart, callbacks, *a, **k: seen.extend(callbacks))
    train.train(Settings(), callbacks=(c for c in mine))
    assert seen == mine


def test_a_callback_class_or_an_object_with_no_hook_is_refused_before_the_run(monkeypatch):
    """callbacks=[Mine] (the class) trained an epoch, then failed the run with `on_epoch_end() missing 1
    required positional argument`; a function, or each letter of callbacks="mine", was never called."""
    import train
    from train.config import Settings
    from train.training import fit

    class Mine:
        def on_epoch_end(self, epoch, row, state):
            return None

    def on_epoch_end(epoch, row, state):
        return None

    monkeypatch.setattr(fit, "fit", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(TypeError) as info:
        train.train(Settings(), callbacks=[Mine])
    assert str(info.value) == "train(callbacks=...) takes callback objects, not the class Mine: callbacks=[Mine()]"
    hooks = "on_start, on_train_begin, on_epoch_end, on_complete, on_end, on_close"
    for wrong, shown in (([on_epoch_end], "function <function"), ("mine", "str 'm'"), ([1], "int 1")):
        with pytest.raises(TypeError) as info:
            train.train(Settings(), callbacks=wrong)
        assert str(info.value).startswith(f"train(callbacks=...): {shown}"), info.value
        assert str(info.value).endswith(
            f"has none of a callback's methods ({hooks}), so the run would never call it; write an object with "
            "them, e.g. on_epoch_end(epoch, row, state)"
        )


def test_a_continue_with_that_is_not_a_function_is_refused_before_the_run(monkeypatch):
    """continue_with="mine" was taken, and a run stopped by a signal or MAX_MINUTES failed with `'str' object
    is not callable` as it wrote its last line."""
    import train
    from train.config import Settings
    from train.training import fit

    monkeypatch.setattr(fit, "fit", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(TypeError) as info:
        train.train(Settings(), continue_with="mine")
    assert str(info.value) == (
        "train(continue_with=...) takes a function of the run's name that returns the line to continue it, not str "
        "'mine'; e.g. continue_with=lambda name: f'... {name}'"
    )


def test_force_or_restart_other_than_true_or_false_is_refused_before_the_run(monkeypatch):
    """force="no" is truthy: a resume with changed settings was forced, the opposite of what was written."""
    import numpy as np

    import train
    from train.config import Settings
    from train.training import fit

    monkeypatch.setattr(fit, "fit", lambda *a, **k: "trained")
    for name in ("force", "restart"):
        for wrong in ("no", "False", None, 2):
            with pytest.raises(TypeError) as info:
                train.train(Settings(), **{name: wrong})
            assert str(info.value) == f"train({name}=...) is True or False, not {type(wrong).__name__} {wrong!r}"
        for right in (True, False, 1, 0, np.True_):
            assert train.train(Settings(), **{name: right}) == "trained"
