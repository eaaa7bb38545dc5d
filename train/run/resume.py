"""Which run a `fit` writes to, and with which settings: a new run, or one being resumed.

RESUME (or `--resume`) names a run by id or path, `latest`, or `auto` (the newest run if it did
not finish and was started with the same settings). A resumed run keeps its own settings: a
setting this invocation does not give (flag, environment or .env) keeps the run's value, never
its default. Of those given, the ones that do not change the result (config.RESUME_FREE: EPOCHS,
MAX_MINUTES, ...) are taken; any other that differs is refused, unless `--force`. RUN_NAME is
part of the run's directory name and stays the run's own.

Planning a resume writes nothing: the run is locked, its record read and every check that can be
made before TensorFlow is done here; `fit` checks the data and the checkpoint, and only then
writes the run's config.json and opens a new segment in its manifest. A refused or failed resume
leaves the record as it was.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import BATCH_PAIR, RESUME_FREE, WARMUP_ENDS, Settings, diff_settings, given, settings_from_dict
from ..digest import sha256_file
from ..errors import CheckpointError, ConfigError, ResumeMismatchError, RunRecordError, StorageError
from .files import ensure_writable, json_text, storage_error, write_json
from .find import create_run_dir, list_run_dirs, resolve_run
from .lock import RunLock
from .manifest import section
from .remote import local_dir
from .rundir import RunDir, read_run_settings, unknown_settings

log = logging.getLogger("train")


@dataclass
class RunPlan:
    """Where a fit writes and with what; holds the run's lock until `release`."""

    run_dir: Path
    settings: Settings  # the effective settings of this segment
    resumed: bool
    lock: RunLock
    restart: bool = False
    saved_config: dict[str, Any] | None = None  # config.json as found (resume only)
    manifest: dict[str, Any] = field(default_factory=dict)  # manifest.json as found (resume only)
    forced: list[str] = field(default_factory=list)  # differences accepted with --force
    recorded: bool = False  # this start has changed the run's record (a new run, or a resume's new segment)
    batch: dict[str, Any] | None = None  # a new run that set neither BATCH_SIZE nor LEARNING_RATE: what was chosen, why

    def write_config(self) -> None:
        """config.json changes only when a setting really changed (EPOCHS extended, --force)."""
        if self.saved_config != self.settings.to_dict():
            write_json(RunDir(self.run_dir).config, self.settings.to_dict())

    def config_sha256(self, written: bool = True) -> str:
        """config.json as this start leaves it (once write_config has run; `written` False: as it is, for a
        start that does not write it), for its manifest segment."""
        if written and self.saved_config is not None and self.saved_config != self.settings.to_dict():
            return hashlib.sha256(json_text(self.settings.to_dict()).encode("utf-8")).hexdigest()
        return sha256_file(RunDir(self.run_dir).config)

    def release(self) -> None:
        self.lock.release()


def has_checkpoints(run_dir: Path) -> bool:
    from .checkpoints import list_states  # numpy only, no TensorFlow

    return bool(list_states(RunDir(run_dir).checkpoints))


def auto_resume(settings: Settings, chosen: Callable[[], Settings] | None = None) -> str:
    """RESUME=auto: the newest run, if it did not finish and was started with these settings.

    `chosen()` (neither BATCH_SIZE nor LEARNING_RATE given): the settings with the pair a new run would
    take here, asked only when there is a run to compare: compared instead, and a run whose own pair
    was chosen so (its manifest's `batch`, on whichever machine) keeps it."""
    runs = list_run_dirs(settings.runs_dir)
    if not runs:
        return ""
    newest = RunDir(runs[-1])
    if not newest.manifest.is_file():
        return ""  # killed before its manifest: nothing was trained
    # An unreadable record is an error, not a reason to start over: auto cannot tell whether
    # that run finished, and the user should know its record is damaged.
    manifest = newest.read_manifest()
    status = manifest.get("status")
    saved = read_run_settings(newest.path, warn_unknown=False, need_data=False)
    # "running" is what a SIGKILLed or power-cut run leaves behind (or a run still going: the
    # lock then refuses it).
    if status not in ("interrupted", "budget", "running"):
        log.info("RESUME=auto: run %s %s; starting a new run", newest.name, _not_continued(status))
        return ""
    # Still going (RunBusyError), or being resumed or exported: refused before the choice below starts
    # TensorFlow; killed while "running": then resume it.
    RunLock(newest.path, reader=True).acquire().release()
    # RUN_NAME only labels the run: left out, it does not make a new run of the `up` after a stop.
    free = RESUME_FREE | ({"run_name"} - given(settings))
    compared = settings
    if chosen is not None and _pair_was_chosen(manifest, saved):
        free |= BATCH_PAIR  # chosen for the machine the run started on: left out again, the run's own pair
    elif chosen is not None:
        compared = chosen()  # the pair a new run would take here
    differ = diff_settings(saved, compared, free) + _unknown(newest.read_config())
    if differ:
        log.info(
            "RESUME=auto: run %s did not finish but its settings differ (%s); starting a new run",
            newest.name,
            "; ".join(differ),
        )
        return ""
    return str(newest.path)


def _not_continued(status: Any) -> str:
    """Why RESUME=auto passes over a run that ended: said at start, or a new run begins without a word."""
    if status == "completed":
        return "completed"
    return f"ended with status {status!r} (auto continues only a stopped or killed run)"


def _pair_was_chosen(manifest: dict[str, Any], saved: Settings) -> bool:
    """The run's BATCH_SIZE and LEARNING_RATE are the pair its start chose (not given, not --forced since),
    or, for a run without that record (started before runs chose it), the defaults it then took."""
    record = section(manifest, "batch")
    pair = (saved.batch_size, saved.learning_rate)
    if "batch" not in manifest:
        return pair == (Settings.batch_size, Settings.learning_rate)  # the class holds the defaults
    return (record.get("batch_size"), record.get("learning_rate")) == pair


def _unknown(config: dict[str, Any]) -> list[str]:
    """config.json keys this version has no setting for, as differences: training on would drop them."""
    return [
        f"{key}: not a setting of this version (written by a newer version, or edited by hand: use the version that "
        "wrote the run, or remove the key)"
        for key in unknown_settings(config)
    ]


def _trained(run_dir: Path, manifest: dict[str, Any]) -> bool:
    """Whether the run ever saved a state holding trained steps: a finished epoch (then it had checkpoints),
    or a state saved mid-epoch (every CHECKPOINT_EVERY steps, or at a stop) that the manifest records."""
    files = RunDir(run_dir)
    return (
        files.metrics.is_file()
        or bool(files.weights())
        or bool(manifest.get("epochs_completed"))
        or manifest.get("trained_state_saved") is True
    )


def plan_run(
    settings: Settings,
    resume: str | None,
    force: bool = False,
    restart: bool = False,
    choose: Callable[[Settings], tuple[Settings, dict[str, Any]]] | None = None,
) -> RunPlan:
    """Lock the run a fit will write and decide its settings; raise before writing anything.

    `choose(settings)`: what a new run that leaves settings to the machine takes (its settings and the
    manifest's record of why), asked before a new run's directory exists, so its config.json holds the
    choice from the first write."""
    if restart and not resume:
        raise _restart_alone()
    # Made once, and only where needed: it starts TensorFlow.
    choice = functools.cache(lambda: choose(settings)) if choose is not None else None
    auto = resume == "auto"
    if auto:
        resume = auto_resume(settings, (lambda: choice()[0]) if choice is not None else None)
    if not resume:
        if restart:
            raise _restart_alone()
        ensure_writable(local_dir(settings.runs_dir), "RUNS_DIR")  # its refusal before TensorFlow starts
        settings, batch = choice() if choice is not None else (settings, None)
        run_dir = create_run_dir(settings.runs_dir, settings.run_name)
        lock = RunLock(run_dir).acquire()
        try:
            write_json(RunDir(run_dir).config, settings.to_dict())
        except BaseException:
            lock.release()
            raise
        return RunPlan(run_dir, settings, False, lock, batch=batch)
    run_dir = resolve_run(settings.runs_dir, resume)
    lock = RunLock(run_dir).acquire()
    try:
        return _plan_resume(run_dir, lock, settings, force, restart, auto)
    except BaseException:
        lock.release()
        raise


def _restart_alone() -> ConfigError:
    return ConfigError(
        "--restart",
        True,
        "needs --resume RUN (resume=RUN in train()), the run it trains again from epoch 1 when its checkpoints are gone",
    )


def _plan_resume(
    run_dir: Path, lock: RunLock, settings: Settings, force: bool, restart: bool, auto: bool = False
) -> RunPlan:
    """`auto`: RESUME=auto chose the run (no --resume was given: a new run is RESUME= empty)."""
    files = RunDir(run_dir)
    saved_config = files.read_config()
    saved = read_run_settings(run_dir, warn_unknown=False, need_data=False)  # checked as asked
    # Missing beside checkpoints, it was lost (a run writes it first): the record of what trained them is gone.
    manifest = files.read_manifest(missing_ok=not has_checkpoints(run_dir))
    check_config(run_dir, manifest)
    asked = _asked(run_dir, saved, settings)
    diffs = diff_settings(saved, asked) + _unknown(saved_config)
    if diffs and not force:
        raise ResumeMismatchError(
            f"run {run_dir.name} was started with other settings ({'; '.join(diffs)}): "
            "resume with the same settings, or pass --force (force=True in train()) to continue with the new ones",
            "; ".join(diffs),
        )
    ckpt_dir = files.checkpoints
    # A run stopped or killed before its first state never trained: it simply starts at epoch 1.
    if restart and has_checkpoints(run_dir):
        raise CheckpointError(
            f"run {run_dir.name} has checkpoints in {ckpt_dir}: --restart (restart=True in train()) is only for a run "
            "whose checkpoints are gone; leave it out to resume the run"
        )
    if not restart and not has_checkpoints(run_dir) and _trained(run_dir, manifest):
        raise CheckpointError(
            f"run {run_dir.name} has no checkpoint in {ckpt_dir} (deleted or never written): there is nothing to "
            f"resume from. Pass --restart (restart=True in train()) to train it again from epoch 1 in the same "
            "directory, or start a new run "
            + (
                "instead (RESUME= empty: RESUME=auto chose this run)"
                if auto
                else "without --resume (resume=None in train())"
            )
        )
    # diff_settings shows a URL setting (SWEEP_STORAGE, ...) masked: its credential stays out of the log.
    told = RESUME_FREE - {"runs_dir", "resume"}
    free = [
        line + (" (not used: a smoke run trains one epoch)" if line.startswith("EPOCHS:") and asked.smoke else "")
        for line in diff_settings(saved, asked, ignore=frozenset(f.name for f in dataclasses.fields(Settings)) - told)
    ]
    if free:
        log.info("run %s resumes with new values of: %s", run_dir.name, "; ".join(free))
    # Checkpoints "gone" may be the folder itself (`rm -r checkpoints`): the run writes into it again.
    for sub in (files.checkpoints, files.tensorboard):
        try:
            sub.mkdir(exist_ok=True)
        except OSError as exc:
            raise storage_error(sub, exc) from exc
    return RunPlan(
        run_dir,
        asked,
        True,
        lock,
        restart=restart,
        saved_config=saved_config,
        manifest=manifest,
        forced=diffs if force else [],
    )


def check_config(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Refuse a config.json that is not the one the run last wrote (edited by hand, in a bucket too).

    The settings a resume keeps come from that file, so an edit would change the run without a
    word. Its latest segment's `config_sha256` says what it held; runs recorded before segments
    kept one are resumed as before."""
    segments = [s for s in manifest.get("segments") or [] if isinstance(s, dict)]
    recorded = segments[-1].get("config_sha256") if segments else None
    if not recorded:
        return
    allowed = {recorded}
    if segments[-1].get("status") in ("running", "failed") and len(segments) > 1:
        # Killed or failed as it started: a segment is recorded before the config.json it changes.
        allowed.add(segments[-2].get("config_sha256"))
    files = RunDir(run_dir)
    actual = sha256_file(files.config)
    if actual not in allowed:
        raise RunRecordError(
            f"run {run_dir.name}: {files.config} was changed after the run wrote it (sha256 {actual[:12]}..., "
            f"the manifest's last segment recorded {str(recorded)[:12]}...): restore the file, or start a new "
            "run; a setting is changed on resume by giving it, with --force (force=True in train()) when it changes "
            "the result"
        )


def check_data(plan: RunPlan, fingerprint: str, source: str, force: bool) -> None:
    """Refuse a resume on data whose bytes changed since the run last trained (unless --force)."""
    before = section(plan.manifest, "data").get("fingerprint") if plan.resumed else None
    if not before or before == fingerprint:
        return
    change = f"DATA: fingerprint {before[:12]}... -> {fingerprint[:12]}... ({source})"
    if not force:
        raise ResumeMismatchError(
            f"run {plan.run_dir.name} was trained on other data ({change}): the same path holds new contents; "
            "resume on the run's own data, start a new run, or pass --force (force=True in train()) to continue on "
            "the new data "
            "(recorded in the manifest's segments)",
            change,
        )
    plan.forced.append(change)


# Where this process trains, not what the run is: always this invocation's (the manifest's
# `distribution` records how many workers trained each stretch).
PER_PROCESS = {"workers", "worker_index"}


def _asked(run_dir: Path, saved: Settings, settings: Settings) -> Settings:
    """The run's recorded settings with the ones this invocation gave on top.

    A setting left out keeps the run's value, so `--resume RUN` alone never changes a run (its
    EPOCHS do not fall back to the default). RUN_NAME names the run's directory: a resumed run
    keeps its own, whatever is given.
    """
    values = saved.to_dict()
    # The invocation's own values as given, not as shown (to_dict masks a URL's secret, which this
    # process needs to connect with).
    values.update({k: v for k, v in dataclasses.asdict(settings).items() if k in given(settings) | PER_PROCESS})
    if settings.run_name != saved.run_name and "run_name" in given(settings):
        log.info("RUN_NAME=%s not used: a resumed run keeps its own name (%r)", settings.run_name, saved.run_name)
    values["run_name"] = saved.run_name
    if "runs_dir" not in given(settings) and not _holds(values["runs_dir"], run_dir):
        values["runs_dir"] = str(run_dir.parent)  # the run was moved: RUNS_DIR is where it is now
    try:
        return settings_from_dict(values)
    except ConfigError as exc:
        asked = given(settings)
        if not (exc.allowed.startswith(WARMUP_ENDS) and "epochs" in asked and "lr_warmup_epochs" not in asked):
            raise
        # The warm-up is the run's own, which only --force changes: the EPOCHS given is what to change.
        raise ConfigError(
            "EPOCHS",
            values["epochs"],
            f"run {run_dir.name} warms up over LR_WARMUP_EPOCHS={exc.value:g} epochs and {WARMUP_ENDS}: "
            f"give more than {exc.value:g}",
        ) from None


def _holds(runs_dir: str, run_dir: Path) -> bool:
    try:
        return local_dir(runs_dir).expanduser().resolve() == run_dir.resolve().parent
    except (StorageError, OSError, RuntimeError):  # a store this process did not open, a path that cannot resolve
        return False
