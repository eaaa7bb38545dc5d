"""The optional parts, one registration line each, and the check that what they need is installed.

The core trains with requirements/cpu.lock (or gpu.lock) alone; each extra's packages are in
requirements/<extra>.lock, which `scripts/venv.sh --extra <extra>` installs (the image carries them).
An extra that runs a command-line tool instead (DVC) keeps that tool in an environment of its own,
requirements/<extra>.lock installed by scripts/venv-<extra>.sh, and brings nothing into this one.
An extra with a folder of its own owns, in it and found by name (the core never imports an extra):
  settings.py   `Section`, a frozen dataclass of its settings (train.sections.setting), joined into
                train.config.Settings; optionally `check(settings)` (run by validate), `saved(values)`
                (a run's saved values, before they are read back), `turned_on(settings)` (the setting
                that asks for it in a training run), `callback(settings)` (its loop callback),
                `flags(command)` (flags of its settings on a core command: `export --format`) and
                `check_environ(settings, environ)` (what the environment says, checked as settings load)
  start.py      the workers extra's `join(settings, stop, epochs)`, which train.training.fit calls first
  command.py    `add_command(sub)` and `run(args)`: `python -m train <extra>`
Deleting such a folder and its line below leaves a template without it: no setting, no command.
A setting or command that needs an extra that is not installed is refused here, in one line naming
the command that adds it, before TensorFlow is imported and before anything is trained.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from types import ModuleType

from .errors import ConfigError
from .locations import redact_uri


@dataclass(frozen=True)
class Extra:
    modules: tuple[str, ...]  # the top-level modules it brings (requirements/<extra>.in, optional-dependencies)
    package: str = ""  # its folder (settings.py, command.py, ...)
    tool: str = ""  # a command it runs from an environment of its own (scripts/venv-<extra>.sh), never in this one


EXTRAS: dict[str, Extra] = {
    "serve": Extra(("starlette", "uvicorn"), "train.serve"),
    "sweep": Extra(("optuna", "psycopg"), "train.sweep"),
    "mlflow": Extra(("mlflow",), "train.tracking"),
    "store": Extra(("obstore",), "train.store"),
    # LiteRT and ONNX files: LiteRT's converter is TensorFlow's own, so only ONNX's brings packages.
    "onnx": Extra(("tf2onnx", "onnx"), "train.formats"),
    "dvc": Extra((), "train.dvc", tool="dvc"),
    # Several machines on TensorFlow's own MultiWorkerMirroredStrategy: nothing beyond TensorFlow.
    "workers": Extra((), "train.workers"),
}


NO_STORE = (  # RUNS_DIR=s3://... in a fork that deleted train/store: refused by validation and on opening
    "a store URL needs the store extra, whose folder (train/store) this template does not have: give a local folder"
)


def part(extra: str, name: str) -> ModuleType | None:
    """`<package>.<name>` of the extra named `extra` (train.run.remote: the store's `remote`), or None
    when this template has no such extra, folder or module: the core reaches an extra only this way."""
    return _part(EXTRAS[extra], name) if extra in EXTRAS else None


def _part(extra: Extra, name: str) -> ModuleType | None:
    """`<package>.<name>` of an extra, or None when it has no such module (or no folder)."""
    try:
        if not extra.package or find_spec(f"{extra.package}.{name}") is None:
            return None
    except ModuleNotFoundError:  # its folder is gone (a fork deleted it and kept the line)
        return None
    return importlib.import_module(f"{extra.package}.{name}")


@cache
def sections_by_name() -> dict[str, ModuleType]:
    """Each extra's settings module (its `Section` and hooks), by the extra's name."""
    found = {name: _part(extra, "settings") for name, extra in EXTRAS.items()}
    return {name: module for name, module in found.items() if module is not None}


def sections() -> list[ModuleType]:
    return list(sections_by_name().values())


def commands() -> dict[str, str]:
    """The commands the extras add: `python -m train <extra>` -> its command module."""
    return {name: f"{e.package}.command" for name, e in EXTRAS.items() if e.package and _part(e, "command")}


def callbacks(settings) -> list:
    """The loop callbacks of the extras these settings turn on (train.training.callbacks)."""
    return [
        section.callback(settings)
        for section in sections()
        if hasattr(section, "callback") and section.turned_on(settings)
    ]


def flags(command: str) -> dict[str, tuple[str, str]]:
    """The flags the extras add to a core command (their settings' `flags(command)`): flag -> (the
    setting it sets, its help); e.g. the formats extra's `export --format`."""
    found: dict[str, tuple[str, str]] = {}
    for section in sections():
        if hasattr(section, "flags"):
            found.update(section.flags(command))
    return found


def missing(extra: str) -> list[str]:
    """The extra's modules this environment cannot import (found without importing them)."""
    return [name for name in EXTRAS[extra].modules if find_spec(name) is None]


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


def require_section(extra: str, settings) -> None:
    """The extra is installed when these settings ask for it (its section's `turned_on`)."""
    section = sections_by_name().get(extra)
    if section is not None and hasattr(section, "turned_on") and (name := section.turned_on(settings)):
        require(extra, name, redact_uri(str(getattr(settings, name.lower()))))


def require_for_training(settings) -> None:
    """The extras a training run's settings ask for (MLflow tracking, an ONNX export) are installed."""
    for extra in sections_by_name():
        require_section(extra, settings)
