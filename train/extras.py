"""The optional parts that bring packages of their own, and the check that they are installed.

The core trains with requirements/cpu.lock (or gpu.lock) alone; each extra's packages are in
requirements/<extra>.lock, which `scripts/venv.sh --extra <extra>` installs (the image carries them).
A setting or command that needs an extra that is not installed is refused here, in one line naming
the command that adds it, before TensorFlow is imported and before anything is trained.
"""

from __future__ import annotations

import importlib
from importlib.util import find_spec

from .errors import ConfigError

# extra: the top-level modules it brings (requirements/<extra>.in, pyproject's optional-dependencies)
PACKAGES: dict[str, tuple[str, ...]] = {
    "serve": ("starlette", "uvicorn"),
    "mlflow": ("mlflow",),
    "sweep": ("optuna", "psycopg"),
    "store": ("obstore",),
    "onnx": ("tf2onnx", "onnx"),
}


# extra: (the setting that turns it on, "module:class" of its loop callback, made with the settings).
# Named, not imported: the core never imports an extra, and a fork that deletes one deletes its line.
CALLBACKS: dict[str, tuple[str, str]] = {
    "mlflow": ("mlflow_tracking_uri", "train.tracking.mlflow_run:MlflowCallback"),
}


def callbacks(settings) -> list:
    """The loop callbacks of the extras these settings turn on (train.training.callbacks)."""
    found = []
    for setting, target in CALLBACKS.values():
        if getattr(settings, setting, None):
            module, _, name = target.partition(":")
            found.append(getattr(importlib.import_module(module), name)(settings))
    return found


def missing(extra: str) -> list[str]:
    """The extra's modules this environment cannot import (found without importing them)."""
    return [name for name in PACKAGES[extra] if find_spec(name) is None]


def require(extra: str, name: str, value: object) -> None:
    """Refuse `name=value` when it needs `extra` and the extra is not installed here."""
    if gone := missing(extra):
        raise ConfigError(
            name,
            value,
            f"needs the {extra} extra ({' and '.join(gone)} {'is' if len(gone) == 1 else 'are'} not installed here): `scripts/venv.sh --extra {extra}`, "
            f"or `pip install --require-hashes --no-deps -r requirements/{extra}.lock` in another environment; "
            + ("the image's `serve` target has it" if extra == "serve" else "the image has it"),
        )


def require_for_training(settings) -> None:
    """The extras a training run's settings ask for: MLflow tracking, an ONNX export."""
    if settings.mlflow_tracking_uri:
        from .config import redact_uri

        require("mlflow", "MLFLOW_TRACKING_URI", redact_uri(settings.mlflow_tracking_uri))
    if "onnx" in settings.export_formats.lower():
        require("onnx", "EXPORT_FORMATS", settings.export_formats)
