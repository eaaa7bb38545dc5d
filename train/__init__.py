"""A reproducible TensorFlow training template: `train(settings)` and the pieces around it.

Importing the package imports no TensorFlow; `train(settings)` does, after the settings are valid.
"""

import contextlib
import importlib.abc
import os
import sys
import threading

__version__ = "0.1.0"


class _KerasPlotsWithoutMatplotlib(importlib.abc.MetaPathFinder):
    """Keras imports matplotlib (pyplot too) when it is imported, for plotting helpers of
    `keras.visualization` that this package never calls: 0.55 s of every TensorFlow start (2.95 s ->
    2.4 s on a 2-core Xeon). Refused to those modules only, as if matplotlib were not installed
    (Keras then says it is needed if one of them is called); the report imports matplotlib as usual."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] != "matplotlib":
            return None
        frame = sys._getframe(1)
        for _ in range(12):  # the importing module sits a few import-machinery frames up
            if frame is None:
                break
            module = frame.f_globals.get("__name__", "")
            if module.partition(".")[0] == "keras" and ".visualization" in module:
                raise ModuleNotFoundError(f"{name} is left to the report", name=name)
            frame = frame.f_back
        return None


if not any(isinstance(f, _KerasPlotsWithoutMatplotlib) for f in sys.meta_path):
    sys.meta_path.insert(0, _KerasPlotsWithoutMatplotlib())


def train(settings, resume=None, force=False, restart=False, callbacks=(), continue_with=None):
    """One run (train.training.fit.fit: `resume`, `force`, `restart`, `continue_with` are its), told
    of its moments by the template's own callbacks, the report's refresh and the export
    (train.results), then by each extra the settings turn on, then by `callbacks`. -> its Result."""
    from .config import Settings

    if not isinstance(settings, Settings):  # a dict of settings, a path to a .env: not checked, so refused
        if type(settings).__name__ == "Settings" and type(settings).__module__ == Settings.__module__:
            raise TypeError(  # a notebook's autoreload (importlib.reload) made a new class since
                "train() takes settings of this train.config, and these were made before it was loaded again "
                "(a reload, e.g. a notebook's autoreload after an edit): make them again with load_settings(...)"
            )
        raise TypeError(
            f"train() takes checked settings, not {type(settings).__name__}: pass "
            "train.config.load_settings(yours), e.g. train(load_settings({'epochs': 3})); it checks each value "
            "and fills the rest from .env, the environment and the defaults"
        )
    if resume is not None and not isinstance(resume, (str, os.PathLike)):  # resume=True: which run?
        raise TypeError(
            f"train(resume=...) names the run to continue, as RESUME does: its id or path, 'latest' or 'auto' "
            f"(text or a Path), not {type(resume).__name__} {resume!r}; e.g. train(settings, resume='latest')"
        )
    for name, value in (("force", force), ("restart", restart)):
        if value not in (True, False):  # force="no" is truthy: it would have forced a changed resume
            raise TypeError(f"train({name}=...) is True or False, not {type(value).__name__} {value!r:.60}")
    if continue_with is not None and not callable(continue_with):  # else a TypeError as a stopped run ends
        raise TypeError(
            f"train(continue_with=...) takes a function of the run's name that returns the line to continue it, "
            f"not {type(continue_with).__name__} {continue_with!r:.60}; e.g. continue_with=lambda name: f'... {{name}}'"
        )
    callbacks = _checked_callbacks(callbacks)
    _check_values(settings)
    check_before_training(settings)
    from .setup.hardware import turn_on_onednn

    turn_on_onednn()  # before TensorFlow's import, which reads it once
    from .models import start_of_run
    from .training.fit import fit

    continue_with = continue_with or (lambda name: python_continue(name, force))
    with _one_run_at_a_time(), _process_state_kept():
        start_of_run()  # MODEL's module as its file is now, then that code for the whole run
        return fit(settings, resume, force, restart, callbacks, continue_with, parts=_own_callbacks)


def python_continue(run_name: str, force: bool = False) -> str:
    """What a caller in Python is told continues a stopped run: the same call with `resume=` the run (a
    `python -m train fit --resume NAME` would look for it in the shell's RUNS_DIR, with its settings)."""
    return f"train(settings, resume={run_name!r}{', force=True' if force else ''}), with this call's settings"


def _check_values(settings) -> None:
    """Every value checked as load_settings checks it, for settings made in code (`Settings(epochs=0)`,
    `dataclasses.replace`), which nothing checked: 0 epochs "completed" an empty run, a batch of 0 failed
    with a ZeroDivisionError, epochs="2" with a TypeError, each after making a run directory. Settings of
    load_settings or `.replace` were checked when made: not again."""
    import dataclasses

    from .config import knows_given, validate, wrongly_typed
    from .errors import ConfigError

    if knows_given(settings):
        return
    if wrong := wrongly_typed(dataclasses.asdict(settings)):
        key, value, what = wrong
        raise ConfigError(
            key.upper(), value, f"must be {what} (load_settings({{...}}) converts and checks the values it is given)"
        )
    validate(settings)


def _checked_callbacks(callbacks) -> list:
    """The callbacks as a list, read once (a generator checked here would reach the run empty); a Keras
    callback is refused before the run starts: its on_epoch_end(epoch, logs) would fail the run
    with a TypeError at the end of its first epoch (the loop calls on_epoch_end(epoch, row, state))."""
    from collections.abc import Iterable

    from .training.callbacks import HOOKS

    # One callback, its class or a function given as the list: Python's own "not iterable" said none of that.
    one = any(hasattr(callbacks, h) for h in HOOKS) or not isinstance(callbacks, Iterable)
    if callbacks is not None and not isinstance(callbacks, (list, tuple)) and one:
        raise TypeError(f"train(callbacks=...) takes a list of callbacks, not {_one_callback(callbacks)}")
    callbacks = list(callbacks or ())
    keras = sys.modules.get("keras")  # not imported: no Keras callback can have been made
    for c in callbacks:
        if keras is not None and isinstance(c, keras.callbacks.Callback):
            raise TypeError(
                f"train(callbacks=...) takes the template's callbacks, not Keras callbacks: {type(c).__name__} is a "
                "keras.callbacks.Callback, whose methods take other arguments; write an object with the methods "
                "train.training.callbacks lists (on_epoch_end(epoch, row, state), ...), or use the setting that "
                "does it (early stopping: PATIENCE; TensorBoard logs are in RUN/tensorboard)"
            )
    for c in callbacks:
        _check_callback(c)
    return callbacks


def _one_callback(given) -> str:
    """What was given instead of the list, and the list to give."""
    from .training.callbacks import HOOKS

    if isinstance(given, type):
        return f"the class {given.__name__}: callbacks=[{given.__name__}()]"
    hooked = any(hasattr(given, h) for h in HOOKS)
    if not hooked:  # a function, a number, ...: no callback at all
        what = "a function" if callable(given) else f"{type(given).__name__} {str(given)[:40]}"
        return f"{what}: a callback is an object with on_epoch_end(epoch, row, state) or another of its methods"
    return f"one {type(given).__name__}: callbacks=[yours]"


def _check_callback(c) -> None:
    """A class given for its instance failed the run at its first epoch's end (`on_epoch_end() missing 1
    required positional argument`); an object with no hook (a function, a misspelt method) was never called."""
    from .training.callbacks import HOOKS

    if isinstance(c, type) and any(hasattr(c, h) for h in HOOKS):
        raise TypeError(
            f"train(callbacks=...) takes callback objects, not the class {c.__name__}: callbacks=[{c.__name__}()]"
        )
    if c is not None and not any(hasattr(c, h) for h in HOOKS):
        raise TypeError(
            f"train(callbacks=...): {type(c).__name__} {c!r:.60} has none of a callback's methods ({', '.join(HOOKS)}), "
            "so the run would never call it; write an object with them, e.g. on_epoch_end(epoch, row, state)"
        )


def check_before_training(settings) -> None:
    """What `python -m train fit` refuses before TensorFlow loads, refused for a caller in Python too
    (one line each): an extra the settings ask for and this environment lacks, an export format whose
    runtime is missing (else found only after the whole training, at the export), bfloat16 under an
    ONEDNN_MAX_CPU_ISA that crashes on it."""
    from .extras import require_for_training
    from .results.export import other_formats
    from .setup.hardware import check_precision_fits_isa_now

    require_for_training(settings)
    if settings.export and (formats := other_formats(settings)) is not None:
        formats.check()
    check_precision_fits_isa_now(settings.precision)


_TRAINING = threading.Lock()  # held by the one train() of this process


@contextlib.contextmanager
def _one_run_at_a_time():
    """One train() per process: the console and train.log's handlers, the precision policy, the seeds
    and the stop signals are the process's, so a second run (a notebook's other thread) would take
    them from the first (its train.log stops mid-run). Refused in one line, before anything changes."""
    if not _TRAINING.acquire(blocking=False):
        from .errors import RunBusyError

        raise RunBusyError(
            "a run is already training in this process (another thread's train()): one process trains "
            "one run at a time; wait for it to return (or stop it), then train"
        )
    try:
        yield
    finally:
        _TRAINING.release()


@contextlib.contextmanager
def _process_state_kept():
    """A run sets process-wide state for itself: Keras's global dtype policy (PRECISION), TensorFlow's
    op determinism (DETERMINISTIC), the Python and NumPy random generators (SEED). A caller who goes
    on in the same process (a notebook) gets its own back: a model built after a bfloat16 run is
    float32 again, a run without DETERMINISTIC runs without it. (TensorFlow's global seed stays SEED.)"""
    import random

    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    policy, determinism = _policy(), _determinism()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        if "keras" in sys.modules:
            import keras

            keras.mixed_precision.set_global_policy(policy or keras.config.floatx())
        if "tensorflow" in sys.modules and _determinism() != determinism:
            from tensorflow.python.framework import config as tf_config

            (tf_config.enable_op_determinism if determinism else tf_config.disable_op_determinism)()


def _policy():
    """Keras's global dtype policy, None before Keras is imported (then the default, floatx)."""
    return sys.modules["keras"].mixed_precision.global_policy() if "keras" in sys.modules else None


def _determinism() -> bool:
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.framework import config as tf_config

    return tf_config.is_op_determinism_enabled()


def _own_callbacks(settings) -> list:
    """For the run's settings (a resume's come from its config.json): the report's refresh, the export."""
    from .results.export import ExportCallback
    from .results.report import ReportCallback

    return [ReportCallback(settings.report), ExportCallback(settings)]
