"""MLflow tracking (optional): a run's settings, per-epoch metrics, tags and files in an MLflow run.

On only when MLFLOW_TRACKING_URI is set; otherwise this module is never imported, and neither is
`mlflow`. Only the chief writes (the caller, train.training.fit, starts it on the chief alone).

Tracking never costs the training. Every call to the server runs on one background thread fed by a
bounded queue: the training thread only queues, and never waits for the server. A start that fails,
for whatever reason, is one warning line, the manifest records that tracking was off and why, and
the run trains without it; a failed call later is a warning too, and the next epoch tries again. At
the end the run's files and status get FLUSH_SECONDS to reach the server (STOP_FLUSH_SECONDS after
a stop signal, well inside compose's stop_grace_period); whatever did not is named in one warning
line, and the process ends anyway.

A resumed run continues the same MLflow run: its id is kept in the manifest (`mlflow.run_id`). A
resume that starts a new MLflow run (the earlier segments tracked nowhere, or their MLflow run gone)
sends the epochs trained before it from metrics.csv, so the MLflow run holds the whole training.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import first_line
from ..locations import redact_uri
from ..run.manifest import lock_in_checkout, section, update_manifest
from ..run.metrics_files import finite, read_back, read_rows
from ..run.rundir import RunDir

log = logging.getLogger("train")

# The client retries a failing request 7 times with exponential backoff and waits 120 s for each
# answer: minutes per call when the server is gone. It reads these knobs only from the environment;
# a user's own values win. With these, a server that accepts and never answers costs one call about
# 2 x 10 s, on the tracking thread. Telemetry off: a training talks to the server it was given only.
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # The client's own "View run ... at" lines go to stdout, outside train.log: the start line has the link.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
HEALTH_TIMEOUT = 5.0  # seconds for the reachability check at start
QUEUE_SIZE = 32  # epochs' metrics waiting for a slow server; an epoch past that is not sent (a warning)
# Metrics a failed call did not log, sent with the next epoch's: at most this many in one call (the
# server takes 1,000 metrics a request), the oldest epochs left out past it (metrics.csv has them all).
LATE_METRICS = 900
FLUSH_SECONDS = 60.0  # at the end: the longest wait for the files and the status to reach the server
# After SIGTERM (docker stop) or MAX_MINUTES: docker-compose.yml gives 2 minutes before SIGKILL,
# which must also cover the step in progress, the checkpoint and the report.
STOP_FLUSH_SECONDS = 30.0
# Settings that are not params: where tracking goes is not a property of the training.
NOT_PARAMS = {"mlflow_tracking_uri", "mlflow_experiment"}
# mlflow RunStatus names for how a segment ended (train.training.fit statuses)
RUN_STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "budget": "KILLED"}
STOPPED = ("interrupted", "budget")
ARTIFACTS = ("manifest", "config", "report", "curves", "metrics")  # RunDir's files, uploaded at each end
STARTING = "the MLflow run's start"


class TrackingUnavailable(Exception):
    """The tracking server cannot be used now (a warning, never a failed run). `later`: it did not
    answer (down, restarting), so the start is tried again at each epoch's end."""

    def __init__(self, why: str, later: bool = False):
        super().__init__(why)
        self.later = later


class Opened(NamedTuple):
    """An MLflow run ready to log into."""

    client: Any
    run_id: str
    experiment_id: str
    resumed: bool = False
    earlier: str = ""  # what the start line says of the epochs sent from metrics.csv (a new run of a resume)


def check_reachable(uri: str, timeout: float = HEALTH_TIMEOUT) -> None:
    """An http(s) tracking server answers its /health endpoint (databricks is checked by use)."""
    if not uri.startswith(("http://", "https://")):
        return
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (the user's own server)
            response.read(64)
    except urllib.error.HTTPError as exc:  # 502-504 from a proxy in front of a server restarting: later
        raise TrackingUnavailable(f"{redact_uri(url)} answered HTTP {exc.code}", later=exc.code >= 500) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingUnavailable(f"{redact_uri(url)} cannot be reached ({reason})", later=True) from None


def tags_from_manifest(manifest: dict[str, Any]) -> dict[str, str]:
    """commit, lock hash, data fingerprint and image, as the manifest records them."""
    git = manifest.get("git") or {}
    lock = manifest.get("requirements_lock") or {}
    commit = str(git.get("commit") or "unknown") + (" (uncommitted changes)" if git.get("dirty") else "")
    return {
        "commit": commit,
        "mlflow.source.git.commit": str(git.get("commit") or ""),
        "lock": lock_in_checkout(lock["file"]) if lock.get("file") else "unknown",
        "lock_sha256": str(lock.get("sha256") or "unknown"),
        "data_fingerprint": str(section(manifest, "data").get("fingerprint") or "unknown"),
        "dataset": str(section(manifest, "data").get("dataset") or "unknown"),
        "image": image_of(manifest),
        "run_dir": str(manifest.get("run_id") or ""),
    }


def image_of(manifest: dict[str, Any]) -> str:
    """The image a run was made in, as `invoke build` tags it; 'none' for a run from a checkout."""
    if manifest.get("image"):
        return str(manifest["image"])
    source = section(manifest, "git").get("source")
    if source == "git" or source is None:
        return "none (a git checkout)"
    from ..reproduce.image import ImageOptions, image_tag

    try:
        return image_tag(manifest, ImageOptions(Path(".")))[0]
    except Exception:  # no commit or lock recorded: say where the commit came from instead
        return f"an image ({source})"


def params_from_settings(settings: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in settings.items() if k not in NOT_PARAMS}


def epoch_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of one metrics.csv row (empty and non-finite values left out)."""
    return {key: float(value) for key, value in row.items() if finite(value)}


class Tracker:
    """One training segment's side of an MLflow run.

    The training thread calls log_epoch and finish; one daemon thread opens the MLflow run
    (`open_run`) and then makes every call to the server, in order. Nothing here raises into the
    training, and only finish waits, with a deadline. The manifest is written by the training thread
    alone (record), as the training writes it too.
    """

    def __init__(self, run_dir: Path, uri: str, open_run: Callable[[], Opened]):
        # Only ever shown (messages, the manifest): the client holds the URI it connects to.
        self.files, self.uri = RunDir(run_dir), redact_uri(uri)
        self.client = self.run_id = self.experiment_id = None
        self.off: str | None = None  # why tracking is off for this segment
        self._started = threading.Event()  # open_run returned or failed
        self._cond = threading.Condition()
        self._jobs: deque[tuple[str, Callable[[], Any], bool]] = deque()
        self._pending = [STARTING]  # names of what is queued or being sent
        self._dropped: list[str] = []  # epochs' metrics not queued: the queue was full
        self._failing: str | None = None  # why the last epoch's metrics were not logged (None: they were)
        self._late: list[tuple[str, list]] = []  # (what, metrics) a failed call did not log; the tracking thread's
        self._retry: Callable[[], Opened] | None = None  # the start, tried again: the server did not answer
        self._ending = self._closed = self._upload_failed = False
        self._finishing = False  # finish was called: a start tried again now is the last try
        self._recorded: tuple | None = None
        self._thread = threading.Thread(target=self._work, args=(open_run,), name="mlflow-tracking", daemon=True)
        self._thread.start()

    def log_epoch(self, row: dict[str, Any], global_step: int) -> None:
        """Queue one metrics.csv row at `global_step`; returns at once."""
        self.record()
        now, values = int(time.time() * 1000), epoch_metrics(row)
        what = f"epoch {row['epoch']} metrics" if "epoch" in row else "epoch metrics"

        def send():
            from mlflow.entities import Metric

            metrics = [Metric(k, v, now, global_step) for k, v in values.items()]
            late, self._late = self._late, []
            if self.client is None:  # the server has not answered the start yet: sent once it does
                self._keep_late(late + [(what, metrics)])
                return
            try:
                self.client.log_batch(
                    self.run_id, metrics=[m for _, ms in late for m in ms] + metrics, synchronous=True
                )
            except Exception as exc:  # kept for the next epoch's call: a server back after a restart gets them all
                if not _transient(exc):  # refused for what it is (a 4xx): sent again, it would fail every call
                    raise
                self._keep_late(late + [(what, metrics)])
                raise
            if late:
                self._say(logging.INFO, "MLflow: %s sent late, with %s", _names([w for w, _ in late]), what)

        if not self._put(what, send, bounded=True):
            self._say(
                logging.WARNING,
                "WARNING: MLflow: %s not sent: %d calls already wait for the server at %s; training goes on",
                what,
                QUEUE_SIZE,
                self.uri,
            )

    def finish(self, status: str, stop=None) -> None:
        """The run's files as artifacts, then the MLflow run's status (KILLED for a resumable stop).

        Waits for them at most FLUSH_SECONDS, or STOP_FLUSH_SECONDS when the run stopped or a stop
        (the StopFlag `stop`) is asked for meanwhile; past that, one warning names what was not sent.
        """
        self._finishing = True
        deadline = _Deadline(status in STOPPED, stop)
        deadline.wait(self._started.is_set)  # first: the manifest uploaded names the MLflow run
        if self._retry is not None:  # the start's last try, before the manifest is recorded and uploaded
            self._put(STARTING, lambda: None)
            deadline.wait(lambda: not self._is_pending(STARTING))
        self.record()
        for path in (getattr(self.files, name) for name in ARTIFACTS):
            if path.is_file():
                self._put(path.name, lambda p=path: self.client.log_artifact(self.run_id, str(p)), upload=True)
        export = self.files.export.path
        if export.is_dir():
            self._put(
                export.name + "/", lambda: self.client.log_artifacts(self.run_id, str(export), export.name), upload=True
            )
        self._put("run status", lambda: self.client.set_terminated(self.run_id, RUN_STATUS.get(status, "FAILED")))
        with self._cond:
            self._ending = True
            self._cond.notify()
        deadline.wait(lambda: not self._thread.is_alive())
        with self._cond:
            self._closed = True  # the thread, still waiting for the server, says nothing more
            left = self._dropped + self._pending
        if not self._started.is_set():
            self.off = f"{self.uri} did not answer within {deadline.seconds:.0f} s"
        self.record()
        if left:
            log.warning(
                "WARNING: MLflow: not sent within %.0f s (no answer from %s): %s; the run directory has all of it",
                deadline.seconds,
                self.uri,
                _names(left),
            )

    def record(self) -> None:
        """The manifest's `mlflow`: the MLflow run logged into, or that tracking is off and why (an
        earlier segment's run stays recorded, so a later resume can continue it)."""
        if not self._started.is_set() and self.off is None:
            return
        state = ("off", self.off) if self.off is not None else ("on", self.run_id)
        if state == self._recorded:
            return
        path = self.files.manifest
        try:
            if self.off is None:
                value = {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": self.uri}
                value["tracking"] = "on"
            else:
                previous = self.files.read_manifest().get("mlflow") or {}
                value = {k: previous[k] for k in ("run_id", "experiment_id", "tracking_uri") if k in previous}
                value.update(tracking="off", reason=self.off)
            update_manifest(path, mlflow=value)
            self._recorded = state
        except Exception as exc:  # a full disk is the training's to report, at its next write
            log.error("could not record MLflow tracking in %s: %s", path, _why(exc))

    # --- the tracking thread --------------------------------------------------------------------

    def _work(self, open_run: Callable[[], Opened]) -> None:
        try:
            self._open(open_run)
        finally:
            self._started.set()
            self._done(STARTING)
        while True:
            with self._cond:
                while not self._jobs and not self._ending and not self._closed:
                    self._cond.wait()
                if self._closed or not self._jobs:
                    return
                what, call, upload = self._jobs.popleft()
                # The start is tried again at the newest epoch's end (each try may wait HEALTH_TIMEOUT for a
                # server that accepts and never answers), and once at the end.
                newer = any(w.startswith("epoch ") for w, _, _ in self._jobs)
            epoch = what.startswith("epoch ")
            if self._retry is not None and ((epoch and not newer) or self._finishing):
                self._open(self._retry)
                if self.off is None and not epoch and self._late:  # no epoch's call left to carry them
                    self._try("metrics of the epochs before", self._send_late)
            # After one failed upload the others are not tried: each would wait out its retries.
            if (self.off is None or (epoch and self._retry)) and not (upload and self._upload_failed):
                if not self._try(what, call) and upload:
                    self._upload_failed = True
            self._done(what)

    def _open(self, open_run: Callable[[], Opened]) -> None:
        """Create or continue the MLflow run. A server that does not answer is tried again later (the
        epochs' metrics kept meanwhile); any other failure turns tracking off for this segment."""
        first = self._retry is None
        try:
            opened = open_run()
        except Exception as exc:  # whatever it is (a server error, a refused login, a bug): never raised
            why = _why(exc) if isinstance(exc, TrackingUnavailable) else f"{type(exc).__name__}: {_why(exc)}"
            self.off = why
            answered = not (isinstance(exc, TrackingUnavailable) and exc.later)  # refused, not unanswered
            again = not answered and not self._finishing
            self._retry = open_run if again else None
            if again and first:
                self._say(
                    logging.WARNING,
                    "WARNING: MLflow: %s (MLFLOW_TRACKING_URI=%s): the run is started in MLflow once it answers, "
                    "tried at each epoch's end; training goes on",
                    why,
                    self.uri,
                )
            elif not again:
                self._say(
                    logging.WARNING,
                    "WARNING: MLflow tracking off for this run: %s (MLFLOW_TRACKING_URI=%s); training goes on",
                    why if first or answered else f"the server never answered ({why})",
                    self.uri,
                )
            return
        self.client, self.run_id, self.experiment_id = opened.client, opened.run_id, opened.experiment_id
        self.off, self._retry = None, None
        how = "continuing" if opened.resumed else "logging to"
        self._say(
            logging.INFO,
            "MLflow: %s run %s in experiment %s at %s%s%s%s",
            how,
            self.run_id,
            self.experiment_id,
            self.uri,
            _browser_link(self.uri, self.experiment_id, self.run_id),
            opened.earlier,
            "" if first else " (the server answered late; the epochs before are sent with the next call)",
        )

    def _send_late(self) -> None:
        late, self._late = self._late, []
        self.client.log_batch(self.run_id, metrics=[m for _, ms in late for m in ms], synchronous=True)
        self._say(logging.INFO, "MLflow: %s sent late", _names([w for w, _ in late]))

    def _keep_late(self, late: list[tuple[str, list]]) -> None:
        """Metrics not logged yet, for the next call: the oldest epochs left out past LATE_METRICS."""
        while len(late) > 1 and sum(len(ms) for _, ms in late) > LATE_METRICS:
            late.pop(0)
        self._late = late

    def _put(self, what: str, call: Callable[[], Any], bounded: bool = False, upload: bool = False) -> bool:
        with self._cond:
            if self._closed:
                return True
            if bounded and len(self._jobs) >= QUEUE_SIZE:
                self._dropped.append(what)
                return False
            self._jobs.append((what, call, upload))
            self._pending.append(what)
            self._cond.notify()
            return True

    def _done(self, what: str) -> None:
        with self._cond:
            self._pending.remove(what)

    def _is_pending(self, what: str) -> bool:
        with self._cond:
            return what in self._pending

    def _try(self, what: str, call) -> bool:
        epoch = what.startswith("epoch ")
        try:
            call()
            if epoch:
                self._failing = None
            return True
        except Exception as exc:  # tracking must never cost the run
            why = f"{type(exc).__name__}: {_why(exc)}"
            # A server down for many epochs is one warning, not one an epoch; "sent late" says it is back.
            if not (epoch and why == self._failing):
                self._say(logging.WARNING, "WARNING: MLflow: %s not logged (%s); training goes on", what, why)
            if epoch:
                self._failing = why
            return False

    def _say(self, level: int, *args) -> None:
        if not self._closed:
            log.log(level, *args)


class _Deadline:
    """How long finish waits: FLUSH_SECONDS, cut to STOP_FLUSH_SECONDS from the moment a stop is asked for."""

    def __init__(self, stopped: bool, stop=None):
        self.stop, self.stopped = stop, stopped or bool(stop is not None and stop.reason)
        self.seconds = STOP_FLUSH_SECONDS if self.stopped else FLUSH_SECONDS
        self.started = time.monotonic()
        self.end = self.started + self.seconds

    def wait(self, done: Callable[[], bool]) -> bool:
        while not done():
            now = time.monotonic()
            if not self.stopped and self.stop is not None and self.stop.reason:
                self.stopped = True
                self.end = min(self.end, now + STOP_FLUSH_SECONDS)
                self.seconds = self.end - self.started
            if now >= self.end:
                return False
            time.sleep(min(0.05, self.end - now))
        return True


def _browser_link(uri: str, experiment_id, run_id) -> str:
    """' (in a browser: URL)' for a tracking server's web UI, as MLflow's client builds it; '' for a
    URI without one (a file store, a database)."""
    if not uri.lower().startswith(("http://", "https://")):
        return ""
    return f" (in a browser: {uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id})"


def _names(whats: list[str]) -> str:
    """'the MLflow run's start, metrics of epochs 1-3, 5, manifest.json, run status'."""
    epochs = sorted({int(w.split()[1]) for w in whats if w.startswith("epoch ") and w.split()[1].isdigit()})
    others = [w for w in whats if not (w.startswith("epoch ") and w.split()[1].isdigit())]
    if not epochs:
        return ", ".join(others)
    spans, first = [], epochs[0]
    for a, b in zip(epochs, epochs[1:] + [None]):
        if b != a + 1:
            spans.append(str(first) if first == a else f"{first}-{a}")
            first = b
    text = f"metrics of epoch{'s' if len(epochs) > 1 else ''} {', '.join(spans)}"
    return ", ".join([*(o for o in others if o == STARTING), text, *(o for o in others if o != STARTING)])


class MlflowCallback:
    """The run in MLflow (train.training.callbacks): started once the run's record is written, each
    epoch's row at the loop's global step, and the run's files and status at the end."""

    def __init__(self, settings):
        self.settings, self.tracker = settings, None

    def on_train_begin(self, run_dir: Path) -> None:
        s = self.settings
        self.tracker = start(s.mlflow_tracking_uri, s.mlflow_experiment, run_dir, s.to_dict())

    def on_epoch_end(self, epoch: int, row: dict[str, Any], state) -> None:
        if self.tracker:
            self.tracker.log_epoch(row, state.global_step)  # never raises

    def on_end(self, status: str, stop) -> None:
        if self.tracker:  # waits for the server, with a deadline; never raises
            self.tracker.finish(status, stop)


def start(uri: str, experiment: str, run_dir: Path, settings: dict[str, Any]) -> Tracker:
    """Create (or, on resume, continue) the MLflow run of `run_dir` on the tracker's own thread;
    returns at once. A start that fails is one warning there, and the tracker then sends nothing."""
    for key, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        manifest: dict[str, Any] | Exception = RunDir(run_dir).read_manifest()
    except Exception as exc:  # damaged meanwhile: the training reports that at its next write
        manifest = exc
    try:  # here, not on the thread: importing is no call to the server, and holds the import lock
        import mlflow.entities  # noqa: F401
    except Exception:
        pass  # the thread meets the same error and turns tracking off, saying why

    earlier = [] if isinstance(manifest, Exception) else earlier_epochs(run_dir, manifest)
    # Their time: before this segment's first epoch, which may end before the server answers the start.
    before = int(time.time() * 1000)

    def open_run() -> Opened:
        if isinstance(manifest, Exception):
            raise manifest
        check_reachable(uri)
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag

        client = MlflowClient(tracking_uri=uri)
        previous = manifest.get("mlflow") or {}
        run_id = _continue(client, previous, uri) if previous.get("run_id") else None
        resumed = run_id is not None
        if run_id is None:
            experiment_id = _experiment_id(client, experiment)
            run_id = client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        params = params_from_settings(settings)
        if resumed:  # params cannot change once logged; a resume may change EPOCHS and the like
            logged = client.get_run(run_id).data.params
            params = {k: v for k, v in params.items() if k not in logged}
        client.log_batch(
            run_id,
            params=[Param(k, v) for k, v in params.items()],
            tags=[RunTag(k, v) for k, v in tags_from_manifest(manifest).items()],
            synchronous=True,
        )
        if resumed and earlier:  # a segment tracked nowhere, or epochs its server never got: only those
            sent = _send_earlier(client, run_id, _not_in(client, run_id, earlier), before, "missing from it")
        else:
            sent = _send_earlier(client, run_id, earlier, before) if earlier else ""
        return Opened(client, run_id, client.get_run(run_id).info.experiment_id, resumed, sent)

    return Tracker(run_dir, uri, open_run)


def earlier_epochs(run_dir: Path, manifest: dict[str, Any]) -> list[tuple[int, int, dict[str, float]]]:
    """(epoch, step, metrics) of each metrics.csv row trained before this segment, at the global step
    its epoch ended on: the steps of each epoch, ceil(n_train / its batch size), added up (as the loop
    counts them). A batch size changed within an epoch (--force mid-epoch, AUTO_BATCH) makes that epoch
    other steps: the difference from where this segment starts (the manifest's `distribution`, less the
    steps of the epoch it resumes within) is put on the last epoch whose batch size changed, so the rows
    line up with the ones this segment logs. Only rows numbered 1, 2, 3... in order: a row repeated or
    missing (an edited file) ends them, as it would put two epochs at one step. Read before the
    segment's first epoch is written; [] when there are none or the file does not say enough."""
    segments = manifest.get("segments") or [{}]
    done, n_train = segments[-1].get("epoch_from"), section(manifest, "data").get("n_train")
    if not (isinstance(done, int) and done > 0 and isinstance(n_train, int) and n_train > 0):
        return []
    try:
        rows = [read_back(row) for _, row in read_rows(RunDir(run_dir).metrics)[1]]
    except (OSError, UnicodeError, csv.Error):
        return []
    out, step, batches = [], 0, []
    for row in rows:
        epoch, batch = row.get("epoch"), row.get("batch_size")
        if (
            not (isinstance(epoch, int) and isinstance(batch, int) and batch > 0)
            or epoch != len(out) + 1
            or epoch > done
        ):
            break
        step += math.ceil(n_train / batch)
        out.append((epoch, step, epoch_metrics(row)))
        batches.append(batch)
    start = _start_step(manifest, segments[-1])
    changed = [i for i in range(1, len(batches)) if batches[i] != batches[i - 1]]
    if out and out[-1][0] == done and start is not None and start != step and changed:
        i, off = changed[-1], start - step
        if out[i][1] + off > out[i - 1][1]:
            out = out[:i] + [(epoch, at + off, values) for epoch, at, values in out[i:]]
    return out


def _start_step(manifest: dict[str, Any], segment: dict[str, Any]) -> int | None:
    """The global step the epoch before this segment ended on: where it starts, less the steps of the
    epoch it resumes within (`resumed_from`: "... (epoch N, step S)"); None when not recorded."""
    spread = manifest.get("distribution")
    start = (
        spread[-1].get("from_global_step")
        if isinstance(spread, list) and spread and isinstance(spread[-1], dict)
        else None
    )
    within = re.search(r"step (\d+)\)$", str(segment.get("resumed_from") or ""))
    if not isinstance(start, int) or isinstance(start, bool) or within is None:
        return None
    return start - int(within.group(1))


def _not_in(client, run_id: str, earlier: list[tuple[int, int, dict[str, float]]]) -> list:
    """The epochs of `earlier` the continued MLflow run has no `epoch` metric of ([] when it cannot say:
    nothing is sent twice)."""
    try:
        logged = {int(m.value) for m in client.get_metric_history(run_id, "epoch")}
    except Exception:
        return []
    return [e for e in earlier if e[0] not in logged]


def _send_earlier(client, run_id: str, earlier: list, now: int, said: str = "trained before it") -> str:
    """The epochs before this segment, (epoch, step, metrics) at time `now`, into the MLflow run; what
    the start line says of them."""
    if not earlier:
        return ""
    from mlflow.entities import Metric

    metrics = [Metric(k, v, now, step) for _, step, values in earlier for k, v in values.items()]
    what = _names([f"epoch {epoch} metrics" for epoch, _, _ in earlier])
    try:
        for i in range(0, len(metrics), LATE_METRICS):
            client.log_batch(run_id, metrics=metrics[i : i + LATE_METRICS], synchronous=True)
    except Exception as exc:  # the run is made: tracking goes on without them
        log.warning(
            "WARNING: MLflow: %s %s not sent (%s); metrics.csv has them",
            what,
            said.replace(" it", " this MLflow run"),
            _why(exc),
        )
        return ""
    return f"; {what} ({said}) sent from metrics.csv"


def _continue(client, previous: dict[str, Any], uri: str) -> str | None:
    """The recorded MLflow run, marked running again; None when this server does not know it.

    Looked up by its id whatever URI it was tracked at: one server has many names (http://mlflow:5000
    from compose, http://127.0.0.1:5000 on the host, a trailing slash), and a run id is unique."""
    uri = redact_uri(uri)  # as the manifest records it, and as it is shown
    before = previous.get("tracking_uri")
    try:
        found = client.get_run(previous["run_id"])
    except Exception as exc:
        log.warning(
            "WARNING: MLflow: run %s%s not found at %s (%s): a new MLflow run is started",
            previous["run_id"],
            f" (tracked at {before})" if before not in (None, uri) else "",
            uri,
            _why(exc),
        )
        return None
    # A deleted run is still returned (until `mlflow gc`), but the server refuses every write to it.
    if getattr(found.info, "lifecycle_stage", "active") == "deleted":
        log.warning("WARNING: MLflow: run %s was deleted at %s: a new MLflow run is started", previous["run_id"], uri)
        return None
    client.update_run(previous["run_id"], status="RUNNING")
    return previous["run_id"]


def _experiment_id(client, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name)
        except Exception:  # made meanwhile by another run starting at once (RESOURCE_ALREADY_EXISTS)
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    # A deleted experiment keeps its name (until `mlflow gc`), and the server refuses new runs in it.
    if getattr(found, "lifecycle_stage", "active") == "deleted":
        raise TrackingUnavailable(
            f"the experiment {name!r} (id {found.experiment_id}) is deleted in MLflow: restore it (the UI, or "
            f"`mlflow experiments restore --experiment-id {found.experiment_id}`), or set MLFLOW_EXPERIMENT to another name"
        )
    return found.experiment_id


# What the client's error on a server that does not answer ends with, after 300 characters of its
# request and connection pool: the one part that says what happened.
_NO_ANSWER = re.compile(
    r"Connection refused|Connection reset by peer|Read timed out|Connection aborted|No route to host|"
    r"Name or service not known|Temporary failure in name resolution|Network is unreachable",
    re.IGNORECASE,
)


def _transient(exc: BaseException) -> bool:
    """A failed call that may succeed later: no answer, or a server error (5xx, 429), not a refusal of
    what was sent (4xx). The client reports a connection it could not make as a 500."""
    status = getattr(exc, "get_http_status_code", None)
    if callable(status):
        try:
            code = int(status())
        except Exception:
            return True
        return code >= 500 or code == 429
    return isinstance(exc, (OSError, TimeoutError)) or bool(_NO_ANSWER.search(str(exc)))


def _why(exc: BaseException) -> str:
    """A server's error page or a client's traceback, as one line of our log."""
    found = _NO_ANSWER.search(str(exc)) if "API request to" in str(exc) else None
    if found:
        return f"no answer from the server: {found.group(0)}"
    return first_line(exc, 300) or type(exc).__name__
