"""train.training.callbacks: every callback is told every moment it has a method for, in order,
and the first that ends the run at an epoch says how (an extra's own callback: its tests)."""

from __future__ import annotations

import types
from pathlib import Path

from train.config import Settings
from train.training.callbacks import Callbacks


class Recorder:
    def __init__(self, name: str, log: list, ending=None):
        self.name, self.log, self.ending = name, log, ending

    def on_start(self, run_dir):
        self.log.append((self.name, "start", run_dir))

    def on_epoch_end(self, epoch, row, state):
        self.log.append((self.name, "epoch", epoch, row["loss"], state.global_step))
        return self.ending

    def on_complete(self, result):
        self.log.append((self.name, "complete", result.status))

    def on_end(self, status, stop):
        self.log.append((self.name, "end", status))

    def on_close(self, stop, error):
        self.log.append((self.name, "close", error))


def test_each_callback_is_told_in_order_and_a_missing_hook_or_none_is_left_out():
    log: list = []
    only_end = types.SimpleNamespace(on_end=lambda status, stop: log.append(("bare", "end", status)))
    calls = Callbacks([Recorder("a", log), None, only_end, Recorder("b", log)])
    calls.start(Path("run"))
    calls.train_begin(Path("run"))  # nobody has on_train_begin
    state = types.SimpleNamespace(global_step=12)
    assert calls.epoch_end(1, {"loss": 0.5}, state) is None
    calls.complete(types.SimpleNamespace(status="completed"))
    calls.end("completed", None)
    calls.close(None, None)
    assert log == [
        ("a", "start", Path("run")),
        ("b", "start", Path("run")),
        ("a", "epoch", 1, 0.5, 12),
        ("b", "epoch", 1, 0.5, 12),
        ("a", "complete", "completed"),
        ("b", "complete", "completed"),
        ("a", "end", "completed"),
        ("bare", "end", "completed"),
        ("b", "end", "completed"),
        ("a", "close", None),
        ("b", "close", None),
    ]


def test_every_callback_sees_the_epoch_that_one_of_them_ends():
    log: list = []
    calls = Callbacks([Recorder("pruner", log, ("pruned", "behind")), Recorder("tracker", log, ("stopped", "x"))])
    assert calls.epoch_end(2, {"loss": 1.0}, types.SimpleNamespace(global_step=4)) == ("pruned", "behind")
    assert [entry[0] for entry in log] == ["pruner", "tracker"]


def test_the_export_callback_exports_only_when_export_is_on(monkeypatch, tmp_path):
    from train.results import export

    made = []
    monkeypatch.setattr(export, "export_run", lambda run_dir, model, settings: made.append(run_dir) or {"ok": 1})
    for on in (False, True):
        result = types.SimpleNamespace(run_dir=tmp_path, model=object(), export=None)
        export.ExportCallback(Settings(export=on)).on_complete(result)
        assert result.export == ({"ok": 1} if on else None)
    assert made == [tmp_path]
