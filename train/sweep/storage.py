"""Where a study lives: SQLite in RUNS_DIR/sweeps/<study>.db, or SWEEP_STORAGE / --storage (a database).

Every message shows the URL through `redact_uri`, and a driver's error text has the password cut
out too, so neither the console nor a log ever holds it. A study is opened only after its space
file has been checked, and an existing study is compared with the file before anything is
written to it (a changed space, metric or sampler is refused: it would mix two searches).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path
from urllib.parse import unquote

from ..config import redact_uri
from ..errors import ConfigError, StorageError, first_line
from ..locations import userinfo
from ..run.files import ensure_writable, storage_error
from .space import SweepSpec

log = logging.getLogger("train")
SWEEPS_DIR = "sweeps"  # under RUNS_DIR: <study>.db and <study>/report.html
_SPACE_ATTR = "template:space"


def default_url(runs_dir: str | Path, study: str) -> str:
    # SQLAlchemy reads a ? as the start of a query and decodes %XX: both escaped, a RUNS_DIR holding
    # either keeps its study in RUNS_DIR/sweeps (not in a file named by the path up to the ?).
    path = str((Path(runs_dir) / SWEEPS_DIR / f"{study}.db").resolve())
    return "sqlite:///" + path.replace("%", "%25").replace("?", "%3F")


def sqlite_file(url: str) -> Path:
    """The file SQLAlchemy opens for a sqlite:/// URL: its path up to a query, percent-decoded."""
    return Path(unquote(url[len("sqlite:///") :].partition("?")[0]))


def scrub(text: str, url: str) -> str:
    """`text` with the URL and its password replaced by their masked forms."""
    text = text.replace(url, redact_uri(url))
    # The user part as redact_uri finds it (up to the last @: a password may hold / or ?), and its
    # password, as written and decoded, wherever a driver repeats them.
    user = userinfo(url)
    password = user.partition(":")[2]
    # Only where it stands on its own (a driver quotes it or puts it after `=` or `:`): a password as
    # short as `p` must not mask every p of the message.
    for secret in sorted(filter(None, {user, unquote(user), password, unquote(password)}), key=len, reverse=True):
        text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", "***", text)
    return text


def storage_failure(exc: BaseException | None) -> BaseException | None:
    """The database's error behind `exc`, or None. What Optuna raises when its database stops
    answering is the driver's error, its own StorageInternalError around it, or (when even reading
    the trial back fails) an UnboundLocalError of its own: the driver's error is in the chain."""
    found, seen = None, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        module = type(exc).__module__
        if module.startswith(("sqlalchemy", "psycopg", "pymysql", "MySQLdb", "sqlite3")):
            return exc  # the outermost driver error: SQLAlchemy's names the driver's own
        if module.startswith("optuna") and type(exc).__name__ == "StorageInternalError":
            found = exc
        exc = exc.__cause__ or exc.__context__
    return found


@contextlib.contextmanager
def storage_lost(url: str, then: str):
    """One StorageError line, `then` saying what to do, when the study's database stops answering."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        failure = storage_failure(exc)
        if failure is None:
            raise
        why = first_line(scrub(str(failure), with_driver(url)))
        raise StorageError(f"the study storage {redact_uri(url)} stopped answering ({why}): {then}") from None


def quiet_heartbeats() -> None:
    """A heartbeat thread of Optuna's whose database stopped answering: one WARNING line, not a
    traceback on the console (that trial's heartbeats stop; the sweep's next call says the rest)."""
    import threading

    previous = threading.excepthook
    if getattr(previous, "quiets_heartbeats", False):
        return

    def hook(args):
        failure = storage_failure(args.exc_value)
        if failure is None or "heartbeat" not in str(getattr(args.thread, "name", "")):
            return previous(args)
        log.warning("WARNING: study storage: a trial's heartbeat was not recorded (%s)", first_line(str(failure)))

    hook.quiets_heartbeats = True
    threading.excepthook = hook


def with_driver(url: str) -> str:
    """postgresql:// (and postgres://) through psycopg 3, the driver in the lock: SQLAlchemy's default
    for the bare scheme differs between its versions (psycopg2 before 2.1)."""
    scheme, sep, rest = url.partition("://")
    return f"postgresql+psycopg://{rest}" if sep and scheme in ("postgresql", "postgres") else url


def open_storage(url: str, heartbeat: int):
    """Optuna's RDB storage with heartbeats: a trial whose process stops sending them (SIGKILL, a lost
    machine) is failed after twice `heartbeat` seconds and queued again with its parameters and run;
    so is a trial whose process died before its first heartbeat, twice `heartbeat` after it started."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the sweep logs each trial in its own words
    if url.startswith("sqlite:///"):
        # A folder that cannot be made or written is the StorageError `fit` gives, not SQLite's traceback.
        ensure_writable(sqlite_file(url).parent)
        check_sqlite_file(url)
    import warnings

    def storage():
        # Optuna marks the heartbeat and its retry callback experimental; they are what is asked for here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return _storage_class()(
                with_driver(url),
                engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
                heartbeat_interval=heartbeat,
                grace_period=2 * heartbeat,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(),
            )

    try:
        for attempt in range(4):
            try:
                return storage()
            except Exception as exc:
                if not lost_the_schema_race(exc) or attempt == 3:
                    raise
                time.sleep(0.5 * (attempt + 1))
    except Exception as exc:
        raise cannot_open(url, exc) from None


def cannot_open(url: str, exc: Exception) -> ConfigError | StorageError:
    """A database that cannot be opened, in one line without its password: no driver (exit 2), or
    SQLAlchemy's OperationalError, ArgumentError, ... (exit 7)."""
    if isinstance(exc, ImportError):
        return ConfigError(
            "SWEEP_STORAGE",
            redact_uri(url),
            f"no database driver for it ({exc.name or exc}): use postgresql:// (psycopg is in the lock)",
        )
    return StorageError(
        f"cannot open the study storage {redact_uri(url)}: {first_line(scrub(str(exc), with_driver(url)))}; "
        "check that the database is running and reachable, and the URL's user, password and database name"
    )


def lost_the_schema_race(exc: Exception) -> bool:
    """Workers started together on an empty database all create Optuna's tables and types; the losers
    of that race get a unique violation (IntegrityError), PostgreSQL's "type ... already exists"
    (DuplicateObject, a ProgrammingError to SQLAlchemy) or SQLite's "table ... already exists" (an
    OperationalError), and find them made when they try again."""
    name = type(exc).__name__
    return name == "IntegrityError" or (
        name in ("ProgrammingError", "OperationalError") and "already exists" in str(exc)
    )


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
OPTUNA_TABLES = {"studies", "trials", "version_info"}


def check_sqlite_file(url: str) -> None:
    """An existing SQLite file is opened only when it is a study's: Optuna writes its tables into any
    database it is given, so another program's file would be changed before anything failed.

    Checked with the sqlite3 module read-only, before Optuna opens it; an empty or absent file is a new
    study. A file this process cannot write is refused here too (SQLite would fail at the first trial)."""
    path = sqlite_file(url)
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise storage_error(path, exc) from None
    if head:
        _check_study_database(url, path, head)
    if not os.access(path, os.W_OK):
        raise StorageError(
            f"cannot write {path}: this user may not write the study's file (every trial is recorded in it): "
            "make it writable (chmod u+w, or chown to this user), or give SWEEP_STORAGE / --storage another file"
        )


def _check_study_database(url: str, path: Path, head: bytes) -> None:
    import sqlite3

    fix = "give SWEEP_STORAGE / --storage a new file (or a study's .db), or move this one away"
    if head != SQLITE_HEADER:
        raise ConfigError("SWEEP_STORAGE", redact_uri(url), f"{path} is not a SQLite database: {fix}")
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        raise ConfigError("SWEEP_STORAGE", redact_uri(url), f"{path} cannot be read as SQLite ({exc}): {fix}") from None
    if tables and not OPTUNA_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:3])
        raise ConfigError(
            "SWEEP_STORAGE",
            redact_uri(url),
            f"{path} is a SQLite database of something else (tables {shown}), not a study's: {fix}",
        )


def _storage_class():
    from optuna.storages import RDBStorage

    class HeartbeatStorage(RDBStorage):
        """Optuna counts a running trial stale only once it has sent a heartbeat; one whose process
        died between its creation and its first heartbeat (sent at once by a live one) would stay
        running for ever, and every later sweep would wait for it. Its start time stands in."""

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            return super()._get_stale_trial_ids(study_id) + _silent_since_start(self, study_id)

    return HeartbeatStorage


def _silent_since_start(storage, study_id: int) -> list[int]:
    """Running trials with no heartbeat at all that started more than the grace period ago."""
    from datetime import datetime, timedelta

    from optuna.storages._rdb.models import TrialModel
    from optuna.storages._rdb.storage import _create_scoped_session
    from optuna.trial import TrialState

    # The property reads as this machine's local time whatever Optuna stored (local time before
    # Optuna 5, UTC since), so it is compared with this process's clock, not the database's.
    before = datetime.now() - timedelta(seconds=storage.grace_period or 2 * storage.heartbeat_interval)
    with _create_scoped_session(storage.scoped_session) as session:
        silent = (
            session.query(TrialModel)
            .filter(TrialModel.study_id == study_id)
            .filter(TrialModel.state == TrialState.RUNNING)
            .filter(~TrialModel.heartbeats.any())
            .all()
        )
        return [t.trial_id for t in silent if t.datetime_start is not None and t.datetime_start < before]


def no_study(spec: SweepSpec, url: str) -> ConfigError:
    """What `--report-only` says of a study that is not there (a typo in its name, another RUNS_DIR)."""
    return ConfigError(
        f"{spec.source} [study] name",
        spec.name,
        f"there is no study {spec.name} in {redact_uri(url)} to report on: run the sweep first (without "
        "--report-only), or check the study's name (--study), RUNS_DIR and --storage",
    )


def holds_no_studies(url: str) -> bool:
    """Whether the database has no Optuna tables: opening Optuna's storage would create them, which
    reporting must not. A database that cannot be opened is open_storage's one line."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(with_driver(url))
        try:
            return not sqlalchemy.inspect(engine).has_table("studies")
        finally:
            engine.dispose()
    except Exception as exc:
        raise cannot_open(url, exc) from None


def open_study(storage, spec: SweepSpec, url: str, sampler, create: bool = True):
    """Create the study (unless not `create`: then `no_study`), or load it and check it is the same
    search; never changes one that differs."""
    import optuna

    record = spec.space_record()
    try:
        try:
            study = optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler, pruner=make_pruner(spec))
        except KeyError:
            study = None
        if study is not None:
            saved = study.user_attrs.get(_SPACE_ATTR)
            if saved is not None and saved != record:
                raise ConfigError(
                    f"{spec.source} [study] name",
                    spec.name,
                    f"study {spec.name} in {redact_uri(url)} was made with another search ({_difference(saved, record)}); "
                    "give this one another name, or restore the file it was made with",
                )
            return study
        if not create:
            raise no_study(spec, url)
        try:
            study = optuna.create_study(
                study_name=spec.name,
                storage=storage,
                sampler=sampler,
                pruner=make_pruner(spec),
                direction=spec.direction,
            )
        except optuna.exceptions.DuplicatedStudyError:  # another worker created it a moment ago
            return open_study(storage, spec, url, sampler)
        study.set_user_attr(_SPACE_ATTR, record)
        return study
    except ConfigError:
        raise
    except Exception as exc:
        if type(exc).__module__.startswith(("sqlalchemy", "psycopg", "optuna.exceptions")):
            raise StorageError(
                f"the study storage {redact_uri(url)} failed: {first_line(scrub(str(exc), url))}; check the database"
            ) from None
        raise


def make_pruner(spec: SweepSpec):
    import optuna

    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.startup_trials, n_warmup_steps=0)
    if spec.pruner == "hyperband":
        return _hyperband(spec.startup_trials)
    return optuna.pruners.NopPruner()


def _hyperband(startup_trials: int):
    """Optuna's HyperbandPruner (from epoch 1) that, as MedianPruner does, stops no trial before the study
    has `startup_trials` finished ones: Optuna's takes no such number. A subclass, because Optuna's TPE
    sampler looks for a HyperbandPruner to sample within each of its brackets."""
    import optuna
    from optuna.trial import TrialState

    class Hyperband(optuna.pruners.HyperbandPruner):
        def prune(self, study, trial) -> bool:
            verdict = super().prune(study, trial)  # always asked: it records the trial's value at each rung
            return verdict and len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) >= startup_trials

    return Hyperband(min_resource=1)


def _difference(saved: str, now: str) -> str:
    try:
        a, b = json.loads(saved), json.loads(now)
    except ValueError:
        return "an unreadable record"
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return ", ".join(f"{k}: {json.dumps(a.get(k))} then, {json.dumps(b.get(k))} now" for k in keys[:1]) or "?"
