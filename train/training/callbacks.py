"""What a run tells the parts around it, in the shape of Keras callbacks.

A callback is any object with some of these methods (each optional), called on the chief only, in
the order the callbacks were given:

  on_start(run_dir)                the run directory and its manifest exist (before devices and data)
  on_train_begin(run_dir)          the run's record is written (config, manifest segment, data)
  on_epoch_end(epoch, row, state)  after the epoch's state is saved: its metrics.csv row and the
                                   loop's state; None goes on, (status, reason) ends the run there
  on_complete(result)              every epoch trained (not stopped): the final weights are saved and
                                   the test split evaluated; `result.model` is the trained model
  on_end(status, stop)             the manifest is closed: the run's status and its stop flag
  on_close(stop, error)            train.log is closed too, the run's last moment: `error` is the line
                                   of the error that ends it, None when it returned; raising here (the
                                   store, whose last files did not arrive) is that error

The report's refresh, the export, MLflow, a sweep's pruner and a store's uploads are callbacks: the loop and `fit`
know this list and nothing of who is on it. A callback that must never cost the run catches its own
errors; one that raises (the export, stopped by a signal) ends the run as any error of the loop does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

HOOKS = ("on_start", "on_train_begin", "on_epoch_end", "on_complete", "on_end", "on_close")  # as listed above


class Callbacks:
    def __init__(self, items: Iterable[Any] = ()):
        self.items = [c for c in items if c is not None]

    def _each(self, hook: str, *args: Any) -> list[Any]:
        return [getattr(c, hook)(*args) for c in self.items if hasattr(c, hook)]

    def start(self, run_dir: Path) -> None:
        self._each("on_start", run_dir)

    def train_begin(self, run_dir: Path) -> None:
        self._each("on_train_begin", run_dir)

    def epoch_end(self, epoch: int, row: dict[str, Any], state) -> tuple[str, str] | None:
        """Every callback sees the epoch; the first that ends the run says how."""
        return next((ending for ending in self._each("on_epoch_end", epoch, row, state) if ending), None)

    def complete(self, result) -> None:
        self._each("on_complete", result)

    def end(self, status: str, stop) -> None:
        self._each("on_end", status, stop)

    def close(self, stop, error: str | None) -> None:
        self._each("on_close", stop, error)
