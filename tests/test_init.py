"""train/__init__.py: Keras's plotting helpers do not pull matplotlib into every start; everyone else still gets it;
`train(settings)` is `fit` with the template's own callbacks, and takes checked settings only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import subprocess_env

CHILD = """
import json, sys
import train, tensorflow, keras
at_start = sorted(m for m in sys.modules if m.split(".")[0] == "matplotlib")
import matplotlib.pyplot as plt  # a user's own code (a model factory, a notebook) imports it as usual
print(json.dumps({"at_start": at_start, "pyplot": plt.__name__, "keras": keras.__version__}))
"""


@pytest.mark.slow
def test_tensorflow_starts_without_matplotlib_and_user_code_still_imports_it():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["at_start"] == [] and out["pyplot"] == "matplotlib.pyplot"


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
    mine = object()
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
