"""SPACE.toml -> a checked `SweepSpec`: the study's options and one `Param` per searched setting.

Plain Python (tomllib and the settings' own rules), no Optuna or TensorFlow: a bad file is refused
in milliseconds with one line naming the key, the value and the fix, before any study is opened.
Every value of the space is coerced and validated as the setting it is, so a learning rate of
`20` or a MODEL that does not exist is the same error here as in .env.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import tomllib

from ..config import Settings, _coerce
from ..errors import ConfigError

Others = tuple[tuple[str, list[Any]], ...]  # (setting, its searched values), each other searched setting

PRUNERS = ("median", "hyperband", "none")
SAMPLERS = ("tpe", "random", "grid")
STUDY_KEYS = ("name", "trials", "metric", "pruner", "sampler", "startup_trials", "heartbeat")
# Where a trial lives or what the study decides itself: never a searched parameter.
# VAL_SPLIT and VAL_FROM say which examples validate: trials compared on other examples (or on the test
# split) would be chosen on different data, so they are fixed for the whole study.
NOT_SEARCHED = {
    "runs_dir",
    "resume",
    "run_name",
    "sweep_storage",
    "workers",
    "worker_index",
    "monitor",
    "monitor_mode",
    "val_split",
    "val_from",
}
_NAME = re.compile(r"[A-Za-z0-9_-]{1,48}")


@dataclass(frozen=True)
class Param:
    """One searched setting: a list of choices, or a range low..high (int for whole-number settings)."""

    name: str  # the setting's field name, e.g. learning_rate
    choices: tuple | None = None
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    integer: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, False) or k == "name"}


@dataclass(frozen=True)
class SweepSpec:
    name: str
    trials: int
    metric: str  # the trials' MONITOR
    direction: str  # maximize | minimize, from MONITOR_MODE
    pruner: str
    sampler: str
    startup_trials: int  # trials that run to the end before the pruner may stop one, and TPE's random start
    heartbeat: int  # seconds between a trial's heartbeats; silent for twice this, it is retried
    params: tuple[Param, ...]
    source: str  # the file, for messages

    def space_record(self) -> str:
        """What makes a study this study (kept with it and compared when it is continued)."""
        return json.dumps(
            {
                "metric": self.metric,
                "direction": self.direction,
                "sampler": self.sampler,
                "pruner": self.pruner,
                "space": [p.to_dict() for p in self.params],
            },
            sort_keys=True,
        )

    def grid(self) -> dict[str, list]:
        return {p.name: list(p.choices or ()) for p in self.params}


def read_space(path: str | Path, settings: Settings, name: str | None = None) -> SweepSpec:
    """Parse and check SPACE.toml against `settings` (the fixed settings of every trial); `name` is
    --study's, over the file's [study] name and its stem (which it rescues when that names no study)."""
    path = Path(path)
    where = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("SPACE", where, "file does not exist; write one like docs/sweeps.md shows") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("SPACE", where, f"cannot be read ({exc}); give a readable UTF-8 TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("SPACE", where, f"not TOML: {exc}") from None
    extra = sorted(set(data) - {"study", "space"})
    if extra:
        raise ConfigError(f"{where} [{extra[0]}]", extra[0], "a space file has only the tables [study] and [space]")
    study = _table(data, "study", where)
    space = _table(data, "space", where)
    unknown = sorted(set(study) - set(STUDY_KEYS))
    if unknown:
        raise ConfigError(f"{where} [study] {unknown[0]}", study[unknown[0]], "keys: " + ", ".join(STUDY_KEYS))
    label = "--study" if name is not None else f"{where} [study] name"
    stem = name is None and "name" not in study  # the default: a file's stem may hold a dot or a space
    name = name if name is not None else study.get("name", path.stem)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        why = "no path separators: " if isinstance(name, str) and ("/" in name or "\\" in name) else ""
        fix = "; the file's stem is the default: set [study] name or give --study NAME" if stem else ""
        raise ConfigError(
            label,
            name,
            f"{why}letters, digits, '-' and '_' only, at most 48 characters (it names RUNS_DIR/sweeps/<name>.db){fix}",
        )
    metric = study.get("metric", settings.monitor)
    try:
        metric_settings = settings.replace(monitor=metric)
    except ConfigError as exc:
        raise ConfigError(f"{where} [study] metric", metric, exc.allowed) from None
    from ..training.loop import monitor_mode

    direction = "maximize" if monitor_mode(metric_settings) == "max" else "minimize"
    trials = _whole(study, "trials", 20, where, 1)
    startup = _whole(study, "startup_trials", 5, where, 0)
    heartbeat = _whole(study, "heartbeat", 60, where, 1)
    pruner = _choice(study, "pruner", "median", PRUNERS, where)
    sampler = _choice(study, "sampler", "tpe", SAMPLERS, where)
    if not space:
        raise ConfigError(
            f"{where} [space]", "{}", "list at least one setting to search, e.g. learning_rate = [1e-3, 1e-2]"
        )
    params = tuple(_param(key, value, metric_settings, where, _others(space, key)) for key, value in space.items())
    if sampler == "grid":
        ranged = next((p for p in params if p.choices is None), None)
        if ranged:
            raise ConfigError(
                f"{where} [space] {ranged.name}",
                {"low": ranged.low, "high": ranged.high},
                'sampler = "grid" needs a list of values for every setting: give a list, or use sampler = "tpe" or "random"',
            )
    return SweepSpec(name, trials, metric, direction, pruner, sampler, startup, heartbeat, params, where)


def _table(data: dict, key: str, where: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where} {key}", value, f"must be a table: [{key}]")
    return value


def _whole(study: dict, key: str, default: int, where: str, least: int) -> int:
    value = study.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{where} [study] {key}", value, f"a whole number >= {least}")
    return value


def _choice(study: dict, key: str, default: str, allowed: tuple, where: str) -> str:
    value = study.get(key, default)
    if value not in allowed:
        raise ConfigError(f"{where} [study] {key}", value, "one of " + ", ".join(allowed))
    return value


def _field(name: str) -> dataclasses.Field | None:
    return next((f for f in fields(Settings) if f.name == name), None)


def _param(key: str, value: Any, settings: Settings, where: str, others: Others = ()) -> Param:
    label = f"{where} [space] {key}"
    f = _field(key)
    if f is None:
        close = [g.name for g in fields(Settings) if g.name.startswith(key[:4])][:3]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(
            label,
            value,
            f"not a setting{hint}: the keys of [space] are settings, lower case (python -m train settings)",
        )
    if key in NOT_SEARCHED:
        raise ConfigError(label, value, "says where a trial runs or what the study measures, so it cannot be searched")
    if isinstance(value, list):
        if not value:
            raise ConfigError(label, value, "an empty list: give at least one value")
        choices = tuple(_value(f, v, settings, label, others) for v in value)
        if len(set(choices)) != len(choices):
            raise ConfigError(label, value, "a value is listed twice: list each once")
        return Param(key, choices=choices)
    if isinstance(value, dict):
        return _range(f, value, settings, label, others)
    raise ConfigError(label, value, "a list of values [a, b, ...] or a range { low = ..., high = ... }")


def _range(f: dataclasses.Field, spec: dict, settings: Settings, label: str, others: Others = ()) -> Param:
    extra = sorted(set(spec) - {"low", "high", "log", "step"})
    if extra or "low" not in spec or "high" not in spec:
        raise ConfigError(label, spec, "a range is { low = ..., high = ..., log = true|false, step = ... }")
    integer = f.type in ("int", int)
    if not integer and f.type not in ("float", float):
        raise ConfigError(label, spec, f"{f.name.upper()} is not a number: list its values instead")
    low, high = (_value(f, spec[k], settings, label, others) for k in ("low", "high"))
    if not low < high:
        raise ConfigError(
            label, spec, f"an empty range (low {low} must be below high {high}); for one value use a list"
        )
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(label, spec, "log is true or false")
    if log and low <= 0:
        raise ConfigError(label, spec, "a log range needs low > 0")
    step = spec.get("step")
    if step is not None:
        if (
            isinstance(step, bool)
            or not isinstance(step, (int, float))
            or step <= 0
            or (integer and not isinstance(step, int))
        ):
            raise ConfigError(label, spec, "step must be a positive number (a whole number for whole-number settings)")
        if log:
            raise ConfigError(label, spec, "a range has either log = true or a step, not both")
        if step > high - low:  # the range holds low alone: every trial would train the same value
            raise ConfigError(
                label, spec, f"a step over high - low ({high - low:g}) leaves one value, low; for one value use a list"
            )
    return Param(f.name, low=low, high=high, log=log, step=step, integer=integer)


def _others(space: dict, key: str) -> Others:
    """The other searched settings' values (a list's, a range's ends) that a value of `key` may meet in a trial."""
    found = []
    for name, given in space.items():
        f = _field(name)
        if f is None or name == key:
            continue
        if isinstance(given, dict):  # a range: its ends
            given = [given[end] for end in ("low", "high") if end in given]
        values = []
        for raw in given if isinstance(given, list) else ():  # anything else is refused in its own place
            with contextlib.suppress(ConfigError):  # a value refused in its own place, with its own line
                values.append(_coerce(f, raw))
        found.append((name, values))
    return tuple(found)


def _value(f: dataclasses.Field, raw: Any, settings: Settings, label: str, others: Others = ()) -> Any:
    """One value, coerced and checked as the setting would be: with the other settings fixed, or with one
    other searched setting at one of its values (EPOCHS searched from 6 lets LR_WARMUP_EPOCHS be 5: a trial
    whose pair is refused fails alone, as docs/sweeps.md says)."""
    try:  # the field's own type, or refused: `true` for a whole number, TOML's nan and inf for a rate
        value = _coerce(f, raw)
    except ConfigError as exc:
        raise ConfigError(label, raw, _because(exc, f)) from None
    try:
        settings.replace(**{f.name: value})
    except ConfigError as exc:
        if not any(_valid(settings, {f.name: value, name: v}) for name, values in others for v in values):
            raise ConfigError(label, raw, _because(exc, f)) from None
    return value


def _valid(settings: Settings, values: dict[str, Any]) -> bool:
    try:
        settings.replace(**values)
    except ConfigError:
        return False
    return True


def _because(exc: ConfigError, f: dataclasses.Field) -> str:
    """The setting's own refusal of a value, for the space file's: `BATCH_SIZE must be >= 1`, not the
    value and "is not valid" a second time; another setting's refusal (a rule between two) whole."""
    return f"{exc.name} {exc.allowed}" if exc.name == f.name.upper() else str(exc)
