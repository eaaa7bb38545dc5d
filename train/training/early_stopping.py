"""Early stopping: PATIENCE epochs without an improvement of MONITOR by more than MIN_DELTA end the run.

Keras's EarlyStopping rule, with its state in the run's own state (saved in every checkpoint), so
the count survives a stop and a resume: `patience_reference` is the last value that counted as an
improvement, `patience_wait` the epochs since. The best weights (best.weights.h5, saved on any
improvement) are what the run exports, whatever epoch it stopped at. No TensorFlow here.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from ..run.metrics_files import metric_text

log = logging.getLogger("train")


@dataclass(frozen=True)
class Patience:
    patience: int  # 0: never stop early
    min_delta: float
    mode: str  # max | min
    monitor: str

    def update(self, state, value: float | None) -> None:
        """Count one finished epoch whose MONITOR was `value` (None or NaN counts as no improvement).

        `state` is the loop's (train.training.loop.LoopState): its `patience_reference`,
        `patience_wait` and `best` are read and written where they are saved."""
        reference = state.patience_reference
        better = (
            value is not None
            and math.isfinite(value)
            and (
                reference is None
                or (value > reference + self.min_delta if self.mode == "max" else value < reference - self.min_delta)
            )
        )
        if better:
            state.patience_reference, state.patience_wait = value, 0
        else:
            state.patience_wait += 1

    def exhausted(self, state) -> bool:
        return self.patience > 0 and state.patience_wait >= self.patience

    def reason(self, state) -> str:
        return (
            f"early stopping: {self.monitor} has not improved by more than MIN_DELTA={self.min_delta:g} for "
            f"{state.patience_wait} epochs (PATIENCE={self.patience}); best {self.monitor} "
            f"{_fmt(state.best)}, its weights are in best.weights.h5"
        )


def _fmt(value) -> str:
    return metric_text(value) if isinstance(value, (int, float)) else "-"


def record_ending(manifest_path: Path, reason: str) -> None:
    """Why the run ended, in the manifest and in its current segment (a resume starts a new one).

    Informative only: a manifest damaged meanwhile or a full disk is logged, and the run ends as
    it would have (its state is already saved).
    """
    from ..errors import StorageError
    from ..run.files import read_json, write_json

    try:
        manifest = read_json(manifest_path) if manifest_path.is_file() else {}
        manifest["ended_because"] = reason
        segments = manifest.get("segments")
        if isinstance(segments, list) and segments and isinstance(segments[-1], dict):
            segments[-1]["ended_because"] = reason
        write_json(manifest_path, manifest)
    except (StorageError, ValueError, TypeError) as exc:
        log.error("could not record why the run ended in %s: %s", manifest_path, exc)
