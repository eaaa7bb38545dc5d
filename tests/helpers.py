"""Shared test helpers (imported as `helpers`; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for `python -m train` in a subprocess: quiet TensorFlow, project importable."""
    env = {k: v for k, v in os.environ.items() if k.upper() not in _SETTING_NAMES}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(PROJECT_ROOT), **extra)
    return env


def _setting_names() -> set[str]:
    from dataclasses import fields

    from train.config import Settings

    return {f.name.upper() for f in fields(Settings)}


_SETTING_NAMES = _setting_names()
