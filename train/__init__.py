"""A reproducible TensorFlow training template: `train(settings)` and the pieces around it.

Importing the package imports no TensorFlow; `train(settings)` does, after the settings are valid.
"""

import importlib.abc
import sys

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
        raise TypeError(
            f"train() takes checked settings, not {type(settings).__name__}: pass "
            "train.config.load_settings(yours), e.g. train(load_settings({'epochs': 3})); it checks each value "
            "and fills the rest from .env, the environment and the defaults"
        )
    from .training.fit import fit

    return fit(settings, resume, force, restart, callbacks, continue_with, parts=_own_callbacks)


def _own_callbacks(settings) -> list:
    """For the run's settings (a resume's come from its config.json): the report's refresh, the export."""
    from .results.export import ExportCallback
    from .results.report import ReportCallback

    return [ReportCallback(settings.report), ExportCallback(settings)]
