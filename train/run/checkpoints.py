"""Resumable checkpoints: one file per state, written atomically, with a LATEST pointer.

A state is a single `.npz` holding every model variable, every optimizer variable and a JSON
header (epoch, step in epoch, global step, best metric, effective batch size, variable paths and
shapes). One file means one atomic `os.replace`; the pointer is updated last, so a kill at any
moment leaves a loadable state. Loading reads every array in full (zip CRCs catch bit flips and
truncation) and falls back to older states with a warning naming the bad file.
"""

from __future__ import annotations

import json
import logging
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, DivergedError
from .files import atomic_write, write_text

log = logging.getLogger("train")
LATEST = "LATEST"
_NAME = re.compile(r"^ckpt-(\d{9})\.npz$")
# What reading a damaged state raises: a truncated or bit-flipped zip, a header that is not JSON text.
_UNREADABLE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


@dataclass
class Loaded:
    path: Path
    meta: dict[str, Any]
    model_arrays: list[np.ndarray]
    optimizer_arrays: list[np.ndarray]


def _vars_info(variables) -> list[list]:
    return [[v.path, list(v.shape)] for v in variables]


def save_state(ckpt_dir: Path, model, state: dict[str, Any], keep: int) -> Path:
    """Write a resumable state; return its path. Older states beyond `keep` are deleted afterwards."""
    model_vars, opt_vars = list(model.variables), list(model.optimizer.variables)
    arrays = {f"m{i:05d}": np.asarray(v.numpy()) for i, v in enumerate(model_vars)}
    arrays.update({f"o{i:05d}": np.asarray(v.numpy()) for i, v in enumerate(opt_vars)})
    for v, key in zip(model_vars, sorted(k for k in arrays if k.startswith("m"))):
        arr = arrays[key]
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            # A diverged state must never replace the last good one.
            raise DivergedError(
                f"variable {v.path} holds NaN/inf at global step {state['global_step']}: training diverged; the last "
                f"good checkpoint in {ckpt_dir} is kept. Lower LEARNING_RATE, check the data for NaN, or use PRECISION=float32"
            )
    meta = dict(state, model_variables=_vars_info(model_vars), optimizer_variables=_vars_info(opt_vars))
    header = np.frombuffer(json.dumps(meta, default=str).encode(), dtype=np.uint8)
    path = ckpt_dir / f"ckpt-{int(state['global_step']):09d}.npz"
    atomic_write(path, lambda p: np.savez(p, __meta__=header, **arrays))
    write_text(ckpt_dir / LATEST, path.name + "\n")  # the pointer moves only once the state is safe
    for old in list_states(ckpt_dir)[keep:]:
        if old != path:
            old.unlink(missing_ok=True)
    return path


def list_states(ckpt_dir: Path) -> list[Path]:
    """States newest first (by global step)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted((p for p in ckpt_dir.iterdir() if _NAME.match(p.name)), reverse=True)


def read_state(path: Path) -> Loaded:
    """Read and verify one state in full; raise CheckpointError when it cannot be trusted."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(npz["__meta__"].tobytes().decode())
            names = sorted(k for k in npz.files if k != "__meta__")
            data = {k: npz[k] for k in names}  # reading every member checks its CRC
    except _UNREADABLE as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc})") from None
    model_arrays = [data[k] for k in names if k.startswith("m")]
    opt_arrays = [data[k] for k in names if k.startswith("o")]
    if len(model_arrays) != len(meta.get("model_variables", ())) or len(opt_arrays) != len(
        meta.get("optimizer_variables", ())
    ):
        raise CheckpointError(f"checkpoint {path} is incomplete: variable count does not match its header")
    return Loaded(path, meta, model_arrays, opt_arrays)


def latest_header(ckpt_dir: Path) -> dict[str, Any] | None:
    """The JSON header (epoch, step, best, ...) of the newest readable state, without its arrays."""
    for path in list_states(ckpt_dir):
        try:
            with np.load(path, allow_pickle=False) as npz:
                return json.loads(npz["__meta__"].tobytes().decode())
        except _UNREADABLE:
            continue
    return None


def load_latest(ckpt_dir: Path) -> Loaded | None:
    """The newest valid state; None when there has never been one.

    A corrupt newest state falls back to the previous one with a warning; when states exist but
    none is valid, that is an error (never a silent fresh start).
    """
    # Newest by step, not by the pointer: a kill between a state's os.replace and the pointer's
    # update leaves a complete newer state (it was fsynced before it got its name) and a pointer
    # one interval behind. The pointer is for people and tools; it never names a partial file.
    states = list_states(ckpt_dir)
    if not states:
        return None
    problems = []
    for path in states:
        try:
            return read_state(path)
        except CheckpointError as exc:
            log.warning("WARNING: %s; falling back to an older checkpoint", exc)
            problems.append(path.name)
    raise CheckpointError(
        f"no valid checkpoint in {ckpt_dir} (unreadable: {', '.join(problems)}); "
        "start a new run without --resume (resume=None in train()), or restore the files from a backup"
    )


def _check_shapes(kind: str, variables, saved: list, arrays: list[np.ndarray], path: Path) -> None:
    current = _vars_info(variables)
    if len(current) != len(saved):
        raise CheckpointError(
            f"checkpoint {path.name} has {len(saved)} {kind} variables, the current model has {len(current)}: "
            "the architecture changed; resume with the run's own MODEL or start a new run"
        )
    for (name, shape), (saved_name, saved_shape), arr in zip(current, saved, arrays):
        if list(shape) != list(saved_shape) or list(arr.shape) != list(shape):
            raise CheckpointError(
                f"{kind} variable {name} has shape {tuple(shape)} in the model but {tuple(saved_shape)} in "
                f"checkpoint {path.name} (saved as {saved_name}): the architecture changed; resume with the "
                "run's own settings or start a new run"
            )


def restore(model, loaded: Loaded) -> None:
    """Assign a loaded state to a compiled model and its optimizer, checking every shape first."""
    _check_shapes("model", model.variables, loaded.meta["model_variables"], loaded.model_arrays, loaded.path)
    optimizer = model.optimizer
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    try:
        _check_shapes(
            "optimizer", optimizer.variables, loaded.meta["optimizer_variables"], loaded.optimizer_arrays, loaded.path
        )
    except CheckpointError as exc:
        raise CheckpointError(f"the optimizer state cannot be restored: {exc}") from None
    for v, arr in zip(model.variables, loaded.model_arrays):
        v.assign(arr)
    for v, arr in zip(optimizer.variables, loaded.optimizer_arrays):
        v.assign(arr)
    log.info("restored from checkpoint: %s", loaded.path)


def weights_sha256(model) -> str:
    """A hash of every model variable's bytes: equal hashes mean bit-identical weights."""
    import hashlib

    h = hashlib.sha256()
    for v in model.variables:
        arr = np.ascontiguousarray(v.numpy())
        h.update(v.path.encode())
        h.update(str(arr.dtype).encode())
        h.update(arr.tobytes())
    return h.hexdigest()
