"""MLflow tracking (optional): a run's settings, per-epoch metrics, tags and files in an MLflow run.

On only when MLFLOW_TRACKING_URI is set; otherwise this module is never imported, and neither is
`mlflow`. Only the chief writes (the caller, train.fit, starts it on the chief alone). Tracking never
costs the training: a server that cannot be reached at start is one warning line and the run trains
without it; an error later is a warning too, and the next epoch tries again.

A resumed run continues the same MLflow run: its id is kept in the manifest (`mlflow.run_id`).
"""

from __future__ import annotations

import logging
import math
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .manifest import update_manifest
from .rundir import RunDir

log = logging.getLogger("train")

# The client retries a failing request 7 times with exponential backoff and waits 120 s for each
# answer: minutes of a stalled training per call when the server is gone. It reads these knobs
# only from the environment; a user's own values win.
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
HEALTH_TIMEOUT = 5.0  # seconds for the reachability check at start
# Settings that are not params: where tracking goes is not a property of the training.
NOT_PARAMS = {"mlflow_tracking_uri", "mlflow_experiment"}
# mlflow RunStatus names for how a segment ended (train.fit statuses)
RUN_STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "budget": "KILLED"}
ARTIFACTS = ("manifest", "config", "report", "curves", "metrics")  # RunDir's files, uploaded at each end


class TrackingUnavailable(Exception):
    """The tracking server cannot be used now (a warning, never a failed run)."""


def check_reachable(uri: str, timeout: float = HEALTH_TIMEOUT) -> None:
    """An http(s) tracking server answers its /health endpoint (databricks is checked by use)."""
    if not uri.startswith(("http://", "https://")):
        return
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (the user's own server)
            response.read(64)
    except urllib.error.HTTPError as exc:
        raise TrackingUnavailable(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingUnavailable(f"{url} cannot be reached ({reason})") from None


def tags_from_manifest(manifest: dict[str, Any]) -> dict[str, str]:
    """commit, lock hash, data fingerprint and image, as the manifest records them."""
    git = manifest.get("git") or {}
    lock = manifest.get("requirements_lock") or {}
    commit = str(git.get("commit") or "unknown") + (" (uncommitted changes)" if git.get("dirty") else "")
    return {
        "commit": commit,
        "mlflow.source.git.commit": str(git.get("commit") or ""),
        "lock": Path(str(lock.get("file") or "unknown")).name,
        "lock_sha256": str(lock.get("sha256") or "unknown"),
        "data_fingerprint": str((manifest.get("data") or {}).get("fingerprint") or "unknown"),
        "dataset": str((manifest.get("data") or {}).get("dataset") or "unknown"),
        "image": image_of(manifest),
        "run_dir": str(manifest.get("run_id") or ""),
    }


def image_of(manifest: dict[str, Any]) -> str:
    """The image a run was made in, as `invoke build` tags it; 'none' for a run from a checkout."""
    if manifest.get("image"):
        return str(manifest["image"])
    source = (manifest.get("git") or {}).get("source")
    if source == "git" or source is None:
        return "none (a git checkout)"
    from .reproduce_image import ImageOptions, image_tag

    try:
        return image_tag(manifest, ImageOptions(Path(".")))[0]
    except Exception:  # no commit or lock recorded: say where the commit came from instead
        return f"an image ({source})"


def params_from_settings(settings: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in settings.items() if k not in NOT_PARAMS}


def epoch_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of one metrics.csv row (empty and non-finite values left out)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[key] = float(value)
    return out


class Tracker:
    """One training segment's side of an MLflow run. Every method only warns on failure."""

    def __init__(self, client, run_id: str, run_dir: Path):
        self.client, self.run_id, self.files = client, run_id, RunDir(run_dir)

    def log_epoch(self, row: dict[str, Any], global_step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, global_step) for k, v in epoch_metrics(row).items()]
        self._try("epoch metrics", lambda: self.client.log_batch(self.run_id, metrics=metrics, synchronous=True))

    def finish(self, status: str) -> None:
        """The run's files as artifacts, then the MLflow run's status (KILLED for a resumable stop)."""
        files = [getattr(self.files, name) for name in ARTIFACTS]
        uploads = [(p.name, lambda p=p: self.client.log_artifact(self.run_id, str(p))) for p in files if p.is_file()]
        export = self.files.export.path
        if export.is_dir():
            uploads.append((export.name, lambda: self.client.log_artifacts(self.run_id, str(export), export.name)))
        for name, upload in uploads:
            if not self._try(name, upload):
                break  # a server that failed one upload would fail the others too, each after its retries
        self._try("run status", lambda: self.client.set_terminated(self.run_id, RUN_STATUS.get(status, "FAILED")))

    def _try(self, what: str, call) -> bool:
        try:
            call()
            return True
        except Exception as exc:  # tracking must never cost the run
            log.warning(
                "WARNING: MLflow: %s not logged (%s: %s); training goes on", what, type(exc).__name__, _first_line(exc)
            )
            return False


def start(uri: str, experiment: str, run_dir: Path, settings: dict[str, Any]) -> Tracker | None:
    """Create (or, on resume, continue) the MLflow run of `run_dir`; None, with one warning, when it cannot."""
    manifest_path = RunDir(run_dir).manifest
    try:
        check_reachable(uri)
        for key, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(key, value)
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        manifest = RunDir(run_dir).read_manifest()
        previous = manifest.get("mlflow") or {}
        run_id = _continue(client, previous, uri) if previous.get("run_id") else None
        resumed = run_id is not None
        if run_id is None:
            experiment_id = _experiment_id(client, experiment)
            run_id = client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        tracker = Tracker(client, run_id, run_dir)
        params = params_from_settings(settings)
        if resumed:  # params cannot change once logged; a resume may change EPOCHS and the like
            logged = client.get_run(run_id).data.params
            params = {k: v for k, v in params.items() if k not in logged}
        from mlflow.entities import Param, RunTag

        client.log_batch(
            run_id,
            params=[Param(k, v) for k, v in params.items()],
            tags=[RunTag(k, v) for k, v in tags_from_manifest(manifest).items()],
            synchronous=True,
        )
        experiment_id = client.get_run(run_id).info.experiment_id
    except Exception as exc:
        log.warning(
            "WARNING: MLflow tracking off for this run: %s (MLFLOW_TRACKING_URI=%s); training goes on",
            _first_line(exc),
            uri,
        )
        return None
    update_manifest(manifest_path, mlflow={"run_id": run_id, "experiment_id": experiment_id, "tracking_uri": uri})
    log.info(
        "MLflow: %s run %s in experiment %s at %s",
        "continuing" if resumed else "logging to",
        run_id,
        experiment_id,
        uri,
    )
    return tracker


def _continue(client, previous: dict[str, Any], uri: str) -> str | None:
    """The recorded MLflow run, marked running again; None when this server does not know it."""
    if previous.get("tracking_uri") not in (None, uri):
        log.warning(
            "WARNING: MLflow: the run was tracked at %s, now MLFLOW_TRACKING_URI=%s: a new MLflow run is started there",
            previous["tracking_uri"],
            uri,
        )
        return None
    try:
        client.get_run(previous["run_id"])
    except Exception as exc:
        log.warning(
            "WARNING: MLflow: run %s not found at %s (%s): a new MLflow run is started",
            previous["run_id"],
            uri,
            _first_line(exc),
        )
        return None
    client.update_run(previous["run_id"], status="RUNNING")
    return previous["run_id"]


def _experiment_id(client, name: str) -> str:
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
