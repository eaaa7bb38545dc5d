"""The record `reproduce` reads (manifest.json, config.json, metrics.csv), checked in full before any rerun.

A rerun takes minutes to hours: a value that cannot be used (a commit that is not a hash, a
metric that is not a number, a field of the wrong type) must stop the command before it, in one
line naming the file, the field and the value, never as a traceback once the rerun is done.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ReproduceError, ReproduceRecordError
from ..run.lock import RunLock
from ..run.metrics_files import read_rows
from ..run.rundir import RunDir, unknown_settings

COMMIT = re.compile(r"[0-9a-fA-F]{40}")
SHA256 = re.compile(r"[0-9a-fA-F]{64}")
RESTORE = "restore the file from a backup: a record its run did not write cannot be reproduced"
UNTRACEABLE = "only a commit hash names the code a run was made with: restore the file from a backup, or rerun by hand"


# (field, what it must be, check) for the manifest's fields that reproduce reads. Absent or null is
# allowed for each (an older or unfinished run); the checks that need a value say so themselves.
def _text(v: Any) -> bool:
    return isinstance(v, str)


def _object(v: Any) -> bool:
    return isinstance(v, dict)


# Called at each check, not once while _MANIFEST is built: mutation testing reaches it only so.
def _matches(pattern: re.Pattern, v: Any) -> bool:
    return isinstance(v, str) and bool(pattern.fullmatch(v))


_MANIFEST = [
    ("git", "a JSON object", _object),
    ("git.commit", "a full 40-hex commit hash (a branch, a tag or HEAD moves)", lambda v: _matches(COMMIT, v)),
    ("git.dirty", "true, false or null", lambda v: isinstance(v, bool)),
    ("git.source", "text", _text),
    ("requirements_lock", "a JSON object", _object),
    ("requirements_lock.file", "text", _text),
    ("requirements_lock.sha256", "a 64-hex sha256", lambda v: _matches(SHA256, v)),
    ("data", "a JSON object", _object),
    ("data.fingerprint", "text", _text),
    ("precision", "a JSON object", _object),
    ("precision.policy", "text", _text),
    ("gpus", "a JSON list", lambda v: isinstance(v, list)),
    ("build_info", "a JSON object", _object),
    ("tensorflow", "text", _text),
    ("keras", "text", _text),
    ("python", "text", _text),
    ("status", "text", _text),
    ("final_weights_sha256", "a 64-hex sha256", lambda v: _matches(SHA256, v)),
    ("epochs_completed", "a whole number >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
]


def _lookup(record: dict[str, Any], dotted: str) -> Any:
    """The value at `dotted`; None when it is absent or sits under something that is no object."""
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    for name, what, ok in _MANIFEST:
        value = _lookup(manifest, name)
        if value is not None and not ok(value):
            fix = UNTRACEABLE if name.startswith("git") else RESTORE
            raise ReproduceRecordError(path, name, value, f"is not {what}", fix)


def check_config(path: Path, config: dict[str, Any], commit: Any = None) -> None:
    """Each known setting has its type and passes the settings' own rules (unknown keys: a newer version).

    `commit`: the run's (manifest), named in the fix for a MODEL or DATASET name this checkout does not
    register: a name the run's commit registered and the checkout has dropped or renamed since."""
    from ..config import settings_from_dict, wrongly_typed

    if wrong := wrongly_typed(config):
        key, value, what = wrong
        raise ReproduceRecordError(path, key, value, f"is not {what}", RESTORE)
    if unknown := unknown_settings(config):  # the rerun could not take it: refused as `fit --resume` does
        name, _, hint = unknown[0].partition(" ")  # hint: "(did you mean X?)" or ""
        key = next(k for k in config if str(k).upper() == name)
        raise ReproduceRecordError(
            path,
            key,
            config[key],
            f"is not a setting of this version{' ' + hint if hint else ''}, written by a newer version or added by hand",
            "reproduce with the version that wrote the run, or remove the key",
        )
    try:
        settings_from_dict(config)
    except ConfigError as exc:
        if data_not_here(exc):
            return  # the record is sound; whether the data can be had is the data check's (train.reproduce.rerun)
        fix = RESTORE
        if exc.name in ("MODEL", "DATASET") and ":" not in str(exc.value):
            at = f"commit {commit}" if _matches(COMMIT, commit) else "commit"
            fix = (
                f"not registered in this checkout, whose code checks the record and the data: if the run's {at} "
                "registers it, run reproduce from a checkout of that commit; else restore the file from a backup"
            )
        raise ReproduceRecordError(path, exc.name.lower(), exc.value, f"is not valid: {exc.allowed}", fix) from None


def data_not_here(exc: ConfigError) -> bool:
    """DATASET names a file or folder this machine does not have (the data is elsewhere, not the record damaged)."""
    kind, _, path = str(exc.value).partition(":")
    return exc.name == "DATASET" and kind in ("npz", "images") and bool(path) and not Path(path).expanduser().exists()


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """metrics.csv as {epoch: {column: value}} (empty cells left out); {} when there is none."""
    try:
        header, raw = read_rows(path, errors="replace")
    except OSError as exc:  # a folder, a named pipe (never waited on) or a socket in its place
        raise ReproduceError(f"{path} is unreadable ({type(exc).__name__}: {exc}); {RESTORE}") from None
    rows: dict[int, dict[str, float]] = {}
    for line, row in raw:
        where = f"line {line}"
        if None in row or None in row.values():
            cells = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None) or [])
            raise ReproduceRecordError(path, where, cells, f"cells where the header has {len(header)}", RESTORE)
        values = {}
        for column, text in row.items():
            if text.strip() == "":
                continue
            try:
                values[column] = float(text)
            except ValueError:
                raise ReproduceRecordError(
                    path, f"{where}, column {column}", text, "is not a number", RESTORE
                ) from None
        epoch = values.get("epoch")
        if epoch is None or epoch != int(epoch) or epoch < 1:
            raise ReproduceRecordError(
                path, f"{where}, column epoch", row.get("epoch"), "is not an epoch number (1, 2, ...)", RESTORE
            )
        rows[int(epoch)] = values
    return rows


def check_record(run_dir: Path, manifest: dict[str, Any], config: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Every file of the record, field by field; the metrics rows by epoch."""
    run = RunDir(run_dir)
    check_manifest(run.manifest, manifest)
    check_config(run.config, config, _lookup(manifest, "git.commit"))
    return read_metrics(run.metrics)


def check_comparable(
    run_dir: Path, manifest: dict[str, Any], config: dict[str, Any], epochs: int | None, rows: dict[int, dict]
) -> None:
    """What the verdict will compare the rerun with is in the record: the final weights' hash or a metrics row."""
    run = RunDir(run_dir)
    total = config.get("epochs") or 0
    if epochs and epochs < total:
        if epochs not in rows:
            have = f"epochs {min(rows)}..{max(rows)}" if rows else "no rows"
            raise ReproduceRecordError(
                run.metrics,
                "epoch",
                epochs,
                f"has no row ({have}): the rerun would have nothing to compare with",
                "choose --epochs among the epochs recorded",
            )
        return
    status, done = manifest.get("status"), manifest.get("epochs_completed")
    if status == "running" and RunLock(run_dir).held():
        raise ReproduceRecordError(
            run.manifest, "status", status, "is not 'completed': the run is still training", "reproduce it once it ends"
        )
    if status != "completed":
        # A killed run ("running") never closed its manifest: metrics.csv has a row for each epoch it finished.
        trained = max(rows, default=0) if status == "running" else done
        fix = (
            f"reproduce its first {trained} epoch(s) with --epochs {trained}"
            if trained
            else "it never finished an epoch"
        )
        if trained and config.get("lr_schedule") == "cosine":  # whose --epochs is refused (train.reproduce.rerun)
            fix = (
                "--epochs cannot stop a cosine schedule early: finish the run first "
                f"(`python -m train fit --resume {run.name}`), then reproduce it"
            )
        raise ReproduceRecordError(
            run.manifest, "status", status, "is not 'completed': the run has no final result", fix
        )
    if config.get("deterministic") and not manifest.get("final_weights_sha256"):
        raise ReproduceRecordError(
            run.manifest, "final_weights_sha256", None, "is missing: a DETERMINISTIC run is judged by it", RESTORE
        )
    final = done or total
    if not config.get("deterministic") and final not in rows:
        raise ReproduceRecordError(
            run.metrics,
            "epoch",
            final,
            "has no row: the rerun's final metrics would have nothing to compare with",
            RESTORE,
        )
