"""Where a study lives: the default SQLite file, a database URL, and its password never shown."""

from __future__ import annotations

import contextlib
import socket

import pytest

from train.cli import main
from train.config import load_settings
from train.errors import ConfigError, StorageError
from train.sweep.storage import default_url, scrub

SECRET = "s3cr%40t-pw"  # percent-encoded: the decoded form must not show either
URL = f"postgresql://optuna:{SECRET}@127.0.0.1:{{port}}/optuna"
SPACE = "[study]\nname = 's'\ntrials = 1\n[space]\nbatch_size = [8, 16]\n"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


def _sweep(tmp_path, storage: str | None = None, runs=None) -> int:
    """`python -m train sweep` of SPACE in-process, on `storage` (default: the runs directory's SQLite file)."""
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    storage_flags = ["--storage", storage] if storage is not None else []
    return main(
        ["sweep", str(space), *storage_flags, "--runs-dir", str(runs or tmp_path / "runs"), "--env-file", "/dev/null"]
    )


def _shows_no_secret(text: str) -> None:
    assert SECRET not in text and "s3cr@t-pw" not in text and "://optuna:" not in text, text


def test_sweep_storage_is_masked_in_every_settings_dump(tmp_path, capsys):
    url = URL.format(port=5432)
    settings = load_settings({"sweep_storage": url, "runs_dir": str(tmp_path)}, env_file=None, environ={})
    assert settings.sweep_storage == url  # the sweep itself connects with it
    _shows_no_secret(str(settings.to_dict()))
    assert settings.to_dict()["sweep_storage"] == "postgresql://***@127.0.0.1:5432/optuna"
    env = tmp_path / ".env"
    env.write_text(f"SWEEP_STORAGE={url}\n")
    assert main(["settings", "--env-file", str(env)]) == 0
    out = capsys.readouterr().out
    # Commented out: saved as a .env, the mask would replace the password.
    assert "# SWEEP_STORAGE=postgresql://***@127.0.0.1:5432/optuna  # its secret is masked here" in out
    _shows_no_secret(out)


def test_a_resume_given_a_storage_url_logs_the_new_value_without_the_password(tmp_path, caplog):
    """A fit resumed with SWEEP_STORAGE set (a trial continued by hand): the run's config.json holds
    it masked, so it reads as changed, and the line that says so shows it masked too."""
    import logging
    from pathlib import Path

    from builders import write_run
    from helpers import tiny_settings

    from train.run.resume import plan_run

    s = tiny_settings(tmp_path, lr_schedule="constant")
    run = write_run(
        Path(s.runs_dir) / "20260102-000000-bbbb",
        s.to_dict(),
        {"status": "interrupted"},
        checkpoints=["ckpt-000000004.npz"],
    )
    with caplog.at_level(logging.INFO, logger="train"):
        plan_run(s.replace(sweep_storage=URL.format(port=5432)), run.name).release()
    (line,) = [r.getMessage() for r in caplog.records if "resumes with new values" in r.getMessage()]
    assert "SWEEP_STORAGE: '' -> 'postgresql://***@127.0.0.1:5432/optuna'" in line
    _shows_no_secret(caplog.text)


def test_an_unreachable_database_is_one_storage_error_exit_7_without_the_password(tmp_path, capsys):
    url = URL.format(port=_closed_port())
    rc = _sweep(tmp_path, url)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert rc == 7 and err.startswith("StorageError: cannot open the study storage postgresql://***@127.0.0.1:"), err
    assert len(err.splitlines()) == 1
    _shows_no_secret(captured.out + captured.err)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (f"redis://u:{SECRET}@127.0.0.1/0", "a database URL"),
        (f"postgresql:/u:{SECRET}@host/db", "a database URL"),
        (f"mysql://u:{SECRET}@127.0.0.1:1/db", "no database driver"),
        ("postgresql://u:s3cr@t-pw@127.0.0.1:1/db", "reads as their end: write each @ there as %40"),
    ],
)
def test_a_wrong_storage_url_is_one_config_error_exit_2_without_the_password(tmp_path, capsys, url, words):
    rc = _sweep(tmp_path, url)
    captured = capsys.readouterr()
    assert rc == 2 and words in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    _shows_no_secret(captured.out + captured.err)


def test_the_default_study_is_sqlite_in_the_runs_directory(tmp_path):
    from sqlalchemy.engine import make_url

    from train.sweep.storage import sqlite_file

    assert default_url(tmp_path, "lr") == f"sqlite:///{tmp_path.resolve()}/sweeps/lr.db"
    # A ? (a query to SQLAlchemy) or a %41 (decoded by it) in RUNS_DIR: the study is still in RUNS_DIR/sweeps.
    odd = tmp_path / "runs?v2 %41#@"
    url = default_url(odd, "lr")
    assert make_url(url).database == str(odd.resolve() / "sweeps" / "lr.db") == str(sqlite_file(url))


def test_scrub_cuts_the_password_out_of_a_driver_message():
    url = URL.format(port=1)
    text = f'connection to {url} failed: password "{SECRET}" / "s3cr@t-pw" rejected'
    _shows_no_secret(scrub(text, url))


def test_scrub_masks_a_short_password_where_it_stands_alone_not_inside_words():
    url = "postgresql://u:p@127.0.0.1:1/db"
    text = scrub(
        f'(psycopg.OperationalError) connection to {url} failed: password "p" for user "u" in /var/run/postgresql', url
    )
    assert text == (
        '(psycopg.OperationalError) connection to postgresql://***@127.0.0.1:1/db failed: password "***" for user "u" '
        "in /var/run/postgresql"
    )


def test_the_storage_url_is_checked_with_the_settings(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings({"sweep_storage": f"ftp://u:{SECRET}@h/x"}, env_file=None, environ={})
    _shows_no_secret(str(err.value))
    for memory in ("sqlite://", "sqlite:///:memory:"):  # a study that would end with the sweep
        with pytest.raises(ConfigError, match=r"an in-memory database: the study would be gone when the sweep ends"):
            load_settings({"sweep_storage": memory}, env_file=None, environ={})
    # A folder with a space is a path SQLite opens (the default RUNS_DIR/sweeps/<study>.db may be one).
    spaced = "sqlite:////data/my runs/s.db"
    assert load_settings({"sweep_storage": spaced}, env_file=None, environ={}).sweep_storage == spaced
    with pytest.raises(
        ConfigError, match=r"is not valid: a URL without spaces \(one in a password is written %20\), a database URL"
    ):
        load_settings({"sweep_storage": "postgresql://u@h/my db"}, env_file=None, environ={})


@pytest.mark.parametrize("password", ["pa/ss-w0rd", "pa?ss-w0rd", "pa#ss-w0rd"])
def test_a_password_holding_a_url_delimiter_is_cut_out_of_a_driver_message(password):
    url = f"postgresql://optuna:{password}@127.0.0.1:5432/optuna"
    text = scrub(f"connection to {url} failed: password {password} rejected", url)
    assert "pa" not in text.replace("password", "") and "ss-w0rd" not in text, text
    assert "postgresql://***@127.0.0.1:5432/optuna" in text


def test_a_study_folder_that_cannot_be_made_is_one_storage_error_exit_7(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "sweeps").write_text("a file where the sweeps folder goes")
    rc = _sweep(tmp_path, runs=runs)
    err = capsys.readouterr().err.strip()
    assert rc == 7 and err.startswith(f"StorageError: cannot write {runs / 'sweeps'}"), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("password", ["Hunt/3rTw0", "Hunt?3rTw0"])
def test_a_password_holding_a_slash_or_question_mark_is_never_shown_by_the_sweep(tmp_path, capsys, password):
    url = f"postgresql://optuna:{password}@127.0.0.1:{_closed_port()}/optuna"
    rc = _sweep(tmp_path, url)
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert rc == 7 and "postgresql://***@127.0.0.1:" in shown, shown
    assert "Hunt" not in shown and "3rTw0" not in shown, shown


def test_a_trial_whose_process_died_before_its_first_heartbeat_is_stale_after_the_grace_from_its_start(tmp_path):
    import sqlite3
    from datetime import datetime, timedelta, timezone

    import optuna

    from train.sweep.space import read_space
    from train.sweep.storage import open_storage, open_study

    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    settings = load_settings({"runs_dir": str(tmp_path / "runs")}, env_file=None, environ={})
    spec = read_space(space, settings)
    url = default_url(tmp_path / "runs", spec.name)
    study = open_study(open_storage(url, 60), spec, url, None)
    # Created, then the process was killed before its heartbeat thread wrote anything.
    dead, fresh, beating = study.ask(), study.ask(), study.ask()
    study._storage.record_heartbeat(beating._trial_id)
    # Optuna 5 stores the start as UTC without a zone.
    long_ago = str(datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=2 * 60 + 5))
    with sqlite3.connect(tmp_path / "runs" / "sweeps" / "s.db") as db:
        db.execute(
            "UPDATE trials SET datetime_start = ? WHERE trial_id IN (?, ?)",
            (long_ago, dead._trial_id, beating._trial_id),
        )
    optuna.storages.fail_stale_trials(study)
    states = {t.number: t.state.name for t in study.get_trials()}
    # The dead one is failed and queued again; one that started within the grace, or whose
    # heartbeat is recent, keeps running.
    assert states == {dead.number: "FAIL", fresh.number: "RUNNING", beating.number: "RUNNING", 3: "WAITING"}
    assert study.get_trials()[3].system_attrs["retry_history"] == [dead.number]


def test_a_sqlite_file_of_another_program_is_refused_untouched(tmp_path, capsys):
    import sqlite3

    other = tmp_path / "notes.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
        db.execute("INSERT INTO notes VALUES ('kept')")
    db.close()
    before = other.read_bytes()
    rc = _sweep(tmp_path, f"sqlite:///{other}")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "a SQLite database of something else (tables notes)" in err and "SWEEP_STORAGE" in err, err
    assert len(err.splitlines()) == 1 and other.read_bytes() == before


def test_a_study_file_that_is_not_sqlite_is_named_so_not_blamed_on_a_database_server(tmp_path, capsys):
    junk = tmp_path / "s.db"
    junk.write_bytes(bytes(range(256)) * 8)
    rc = _sweep(tmp_path, f"sqlite:///{junk}")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and f"{junk} is not a SQLite database" in err and "running and reachable" not in err, err
    assert len(err.splitlines()) == 1


def test_a_study_file_this_user_cannot_write_is_one_storage_error_exit_7(tmp_path, capsys, monkeypatch):
    import os

    study = tmp_path / "runs" / "sweeps" / "s.db"
    study.parent.mkdir(parents=True)
    study.write_bytes(b"")
    real = os.access
    # Root writes a file whatever its mode: what a read-only file does to another user, told directly.
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(study) else real(p, mode, **kw))
    rc = _sweep(tmp_path)
    err = capsys.readouterr().err.strip()
    assert rc == 7 and err.startswith(f"StorageError: cannot write {study}") and "chmod u+w" in err, err
    assert len(err.splitlines()) == 1


def test_workers_that_lose_the_race_to_create_the_study_s_tables_open_it_when_they_try_again(monkeypatch):
    """Two sweeps started at once on an empty database: one makes Optuna's tables and enum
    types, the other gets "already exists" and finds them made on its next try."""
    from train.sweep import storage

    class ProgrammingError(Exception):  # SQLAlchemy's name for psycopg's DuplicateObject
        pass

    raised = [ProgrammingError('(psycopg.errors.DuplicateObject) type "studydirection" already exists')]
    made = object()

    def storage_class():
        def open_(*args, **kwargs):
            if raised:
                raise raised.pop()
            return made

        return open_

    monkeypatch.setattr(storage, "_storage_class", storage_class)
    slept = []
    monkeypatch.setattr(storage.time, "sleep", slept.append)
    assert storage.open_storage("postgresql://u@127.0.0.1:1/db", 60) is made
    assert not storage.lost_the_schema_race(ProgrammingError("syntax error at or near"))  # not a race: said at once
    IntegrityError = type("IntegrityError", (Exception,), {})  # a unique violation: the other worker's row
    assert storage.lost_the_schema_race(IntegrityError("duplicate key value violates unique constraint"))
    assert not storage.lost_the_schema_race(ValueError("type already exists"))
    # Two sweeps started at once on one machine's new SQLite file: the loser's CREATE TABLE.
    OperationalError = type("OperationalError", (Exception,), {})
    assert storage.lost_the_schema_race(OperationalError("(sqlite3.OperationalError) table studies already exists"))
    assert not storage.lost_the_schema_race(OperationalError("(sqlite3.OperationalError) unable to open database"))
    # Four tries, a little longer apart each time; a race lost every time is the error of the last.
    raised[:] = [ProgrammingError(f'type "studydirection" already exists ({n})') for n in range(4)]
    with pytest.raises(StorageError, match=r"already exists \(0\); check that the database is running"):
        storage.open_storage("postgresql://u@127.0.0.1:1/db", 60)
    assert slept == [0.5, 0.5, 1.0, 1.5]


def test_a_heartbeat_thread_whose_database_is_gone_is_one_warning_not_a_traceback(monkeypatch, caplog, capsys):
    import logging
    import threading

    import sqlalchemy.exc

    from train.sweep.storage import quiet_heartbeats

    handed_on = []
    # Its own hook to start from: one a sweep run in this process installed would already quiet heartbeats.
    monkeypatch.setattr(threading, "excepthook", lambda args: handed_on.append((args.thread.name, args.exc_type)))
    quiet_heartbeats()
    hook = threading.excepthook
    quiet_heartbeats()  # a second sweep in the process does not wrap it twice
    assert threading.excepthook is hook

    def gone():
        raise sqlalchemy.exc.OperationalError("UPDATE", {}, ConnectionRefusedError("connection refused"))

    def bug():
        raise KeyError("a bug, not the database")

    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="train"):
        for target, name in ((gone, "Thread-9 (_record_heartbeat)"), (bug, "Thread-8 (_record_heartbeat)")):
            thread = threading.Thread(target=target, name=name)  # Optuna's heartbeat thread's name
            thread.start()
            thread.join()
        other = threading.Thread(target=gone, name="Thread-7 (report)")  # not a heartbeat: as before
        other.start()
        other.join()
    assert "Traceback" not in capsys.readouterr().err
    assert [r.getMessage() for r in caplog.records] == [
        "WARNING: study storage: a trial's heartbeat was not recorded "
        "((builtins.ConnectionRefusedError) connection refused)"
    ]
    assert handed_on == [
        ("Thread-8 (_record_heartbeat)", KeyError),
        ("Thread-7 (report)", sqlalchemy.exc.OperationalError),
    ]


def test_the_database_error_found_is_the_outermost_drivers_through_causes_contexts_and_a_cycle():
    import sqlite3

    import optuna
    import psycopg

    from train.sweep.storage import storage_failure

    def chained(outer: BaseException, inner: BaseException, how: str) -> BaseException:
        setattr(outer, how, inner)
        return outer

    class MySQLError(Exception):  # what the MySQL drivers raise, not installed here
        pass

    for module in ("pymysql.err", "MySQLdb._exceptions"):
        MySQLError.__module__ = module
        error = MySQLError("gone")
        assert storage_failure(chained(RuntimeError("x"), error, "__context__")) is error
    for error in (psycopg.OperationalError("gone"), sqlite3.OperationalError("locked")):
        assert storage_failure(chained(ValueError("x"), error, "__cause__")) is error
    internal = optuna.exceptions.StorageInternalError("commit failed")
    driver = psycopg.OperationalError("server closed the connection")
    # Optuna's own error stands in only when no driver error is behind it; the outermost driver error wins.
    assert storage_failure(chained(UnboundLocalError("x"), internal, "__context__")) is internal
    assert storage_failure(chained(internal, driver, "__cause__")) is driver
    assert storage_failure(chained(driver, sqlite3.OperationalError("inner"), "__cause__")) is driver
    # Another error of Optuna's, or a class of that name from elsewhere, is not the database's.
    assert storage_failure(optuna.exceptions.DuplicatedStudyError("s")) is None
    assert storage_failure(type("StorageInternalError", (Exception,), {})()) is None
    assert storage_failure(None) is None
    # An error its own context (a handler that raised what it caught): the walk ends.
    looped = KeyError("k")
    looped.__context__ = chained(ValueError("v"), looped, "__context__")
    assert storage_failure(looped) is None


def test_a_postgres_url_gets_the_psycopg_driver_and_any_other_url_is_left_as_it_is():
    from train.sweep.storage import with_driver

    assert with_driver("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert with_driver("postgres://u:p@h/db?x=a://b") == "postgresql+psycopg://u:p@h/db?x=a://b"
    for url in ("postgresql+psycopg2://u@h/db", "sqlite:///x/postgresql.db", "postgresql", "mysql://u@h/postgres"):
        assert with_driver(url) == url


def test_scrub_masks_the_whole_user_part_before_its_password_and_a_password_holding_a_colon():
    # The longest first: "alice:b" whole, not "alice:***" after its password "b" alone.
    assert scrub("for alice:b at h", "postgresql://alice:b@h/db") == "for *** at h"
    url = "postgresql://u:pa:ss@h/db"  # the password is all after the user's first colon
    assert scrub('password "pa:ss" rejected', url) == 'password "***" rejected'


def test_the_storage_is_optunas_with_heartbeats_their_grace_the_retry_and_a_pre_ping_for_a_server(
    tmp_path, monkeypatch
):
    import warnings

    from optuna.storages import RetryHeartbeatStaleTrialCallback

    from train.sweep import storage

    made = []

    def storage_class():
        def make(url, **kwargs):
            warnings.warn("a warning of the driver's own", UserWarning, stacklevel=2)
            made.append((url, kwargs))
            return kwargs

        return make

    monkeypatch.setattr(storage, "_storage_class", storage_class)
    sqlite = f"sqlite:///{tmp_path / 'sweeps' / 's.db'}"
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        storage.open_storage("postgresql://u:p@127.0.0.1:1/db", 7)
        storage.open_storage(sqlite, 3)
    # Only Optuna's "experimental" warning is silenced, not what the driver says.
    assert [str(w.message) for w in warned] == ["a warning of the driver's own"] * 2
    (pg_url, pg), (lite_url, lite) = made
    assert (pg_url, lite_url) == ("postgresql+psycopg://u:p@127.0.0.1:1/db", sqlite)
    assert isinstance(pg.pop("heartbeat_stale_trial_callback"), RetryHeartbeatStaleTrialCallback)
    assert pg == {"engine_kwargs": {"pool_pre_ping": True}, "heartbeat_interval": 7, "grace_period": 14}
    lite.pop("heartbeat_stale_trial_callback")
    assert lite == {"engine_kwargs": None, "heartbeat_interval": 3, "grace_period": 6}


def test_each_sqlite_file_refused_is_named_whole_and_one_with_optunas_tables_or_none_is_taken(tmp_path):
    import sqlite3

    from train.errors import StorageError
    from train.sweep.storage import SQLITE_HEADER, check_sqlite_file

    fix = "give SWEEP_STORAGE / --storage a new file (or a study's .db), or move this one away"

    def refusal(path):
        with pytest.raises((ConfigError, StorageError)) as err:
            check_sqlite_file(f"sqlite:///{path}")
        return str(err.value)

    folder = tmp_path / "folder.db"
    folder.mkdir()
    assert (
        refusal(folder)
        == f"cannot write {folder}: a folder stands where this file is written: move the folder out of the way"
    )
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"hello")
    assert refusal(junk) == f"SWEEP_STORAGE='sqlite:///{junk}' is not valid: {junk} is not a SQLite database: {fix}"
    cut = tmp_path / "cut.db"
    cut.write_bytes(SQLITE_HEADER + bytes(200))
    assert refusal(cut) == (
        f"SWEEP_STORAGE='sqlite:///{cut}' is not valid: {cut} cannot be read as SQLite (file is not a database): {fix}"
    )
    other, some, empty, study = (tmp_path / f"{n}.db" for n in ("other", "some", "empty", "study"))
    for path, tables in (
        (other, "zeta alpha mid beta"),
        (some, "studies trials"),
        (empty, ""),
        (study, "studies trials version_info x"),
    ):
        with contextlib.closing(sqlite3.connect(path)) as db:
            for table in tables.split():
                db.execute(f"CREATE TABLE {table} (x)")
            db.execute("CREATE VIEW v AS SELECT 1")  # only tables count
    assert refusal(other) == (
        f"SWEEP_STORAGE='sqlite:///{other}' is not valid: {other} is a SQLite database of something else "
        f"(tables alpha, beta, mid), not a study's: {fix}"
    )
    assert "(tables studies, trials), not a study's" in refusal(some)
    check_sqlite_file(f"sqlite:///{empty}")
    check_sqlite_file(f"sqlite:///{study}")


def _spec(tmp_path, text=SPACE):
    from train.sweep.space import read_space

    space = tmp_path / "space.toml"
    space.write_text(text)
    return read_space(space, load_settings({"runs_dir": str(tmp_path / "runs")}, env_file=None, environ={}))


def test_the_pruner_waits_for_the_study_s_startup_trials_and_hyperband_starts_at_one_epoch(tmp_path):
    from train.sweep.storage import make_pruner

    median = make_pruner(_spec(tmp_path, SPACE.replace("trials = 1", "trials = 1\nstartup_trials = 3")))
    assert (median._n_startup_trials, median._n_warmup_steps) == (3, 0)
    assert make_pruner(_spec(tmp_path, SPACE.replace("trials = 1", "pruner = 'hyperband'")))._min_resource == 1

    def pruned(startup: int) -> list[bool]:
        """Hyperband's verdicts at epoch 1 on six poor trials, after three finished good ones."""
        import optuna

        spec = _spec(tmp_path, SPACE.replace("trials = 1", f"pruner = 'hyperband'\nstartup_trials = {startup}"))
        study = optuna.create_study(
            study_name="s", direction="maximize", pruner=make_pruner(spec), sampler=optuna.samplers.RandomSampler(0)
        )
        for _ in range(3):
            trial = study.ask()
            for epoch in range(1, 10):
                trial.report(0.9, epoch)
                trial.should_prune()
            study.tell(trial, 0.9)
        poor = [study.ask() for _ in range(6)]
        for trial in poor:
            trial.report(0.1, 1)
        return [trial.should_prune() for trial in poor]

    assert any(pruned(3)) and not any(pruned(4))  # hyperband too waits for startup_trials finished trials


def test_a_study_made_with_another_search_is_refused_naming_the_first_difference_and_one_not_there_too(tmp_path):
    from train.sweep.storage import _difference, open_storage, open_study

    url = "postgresql://u:pw@127.0.0.1:1/x"  # shown masked, never opened: the study is in `storage`
    before = _spec(tmp_path)
    storage = open_storage(default_url(tmp_path / "runs", "s"), 60)
    with pytest.raises(ConfigError) as err:
        open_study(storage, before, url, None, create=False)
    assert str(err.value) == (
        f"{before.source} [study] name='s' is not valid: there is no study s in postgresql://***@127.0.0.1:1/x to "
        "report on: run the sweep first (without --report-only), or check the study's name (--study), RUNS_DIR and --storage"
    )
    made = open_study(storage, before, url, None)
    assert open_study(storage, before, url, None, create=False)._study_id == made._study_id
    after = _spec(tmp_path, SPACE.replace("[8, 16]", "[8, 32]").replace("[study]", "[study]\nsampler = 'random'"))
    with pytest.raises(ConfigError) as err:
        open_study(storage, after, url, None)
    assert str(err.value) == (
        f"{after.source} [study] name='s' is not valid: study s in postgresql://***@127.0.0.1:1/x was made with another "
        'search (sampler: "tpe" then, "random" now); give this one another name, or restore the file it was made with'
    )
    assert _difference("{", "{}") == "an unreadable record" and _difference('{"a": 1}', '{"a": 1}') == "?"
    assert _difference('{"b": [1]}', '{"a": 2, "b": [1]}') == "a: null then, 2 now"


def test_the_study_is_made_and_loaded_with_the_sweep_s_sampler_pruner_and_direction(tmp_path):
    import optuna

    from train.sweep.storage import open_storage, open_study

    url = default_url(tmp_path / "runs", "s")
    spec = _spec(tmp_path, SPACE.replace("trials = 1", "trials = 1\nmetric = 'val_accuracy'\nstartup_trials = 2"))
    storage = open_storage(url, 60)
    sampler = optuna.samplers.RandomSampler(seed=1)
    for study in (open_study(storage, spec, url, sampler), open_study(storage, spec, url, sampler)):
        assert study.sampler is sampler and study.direction == optuna.study.StudyDirection.MAXIMIZE
        assert isinstance(study.pruner, optuna.pruners.MedianPruner) and study.pruner._n_startup_trials == 2


def test_a_study_another_worker_made_a_moment_ago_is_loaded_and_compared(tmp_path, monkeypatch):
    import optuna

    from train.sweep.storage import open_storage, open_study

    url = "postgresql://u:pw@127.0.0.1:1/x"  # shown masked, never opened: the study is in `storage`
    storage = open_storage(default_url(tmp_path / "runs", "s"), 60)
    spec = _spec(tmp_path)
    made = {}
    create = optuna.create_study

    def raced(space):
        def create_study(**kw):  # the other worker's study is in the database before ours
            monkeypatch.setattr(optuna, "create_study", create)
            made["study"] = open_study(storage, _spec(tmp_path, SPACE.replace("[8, 16]", space)), url, None)
            raise optuna.exceptions.DuplicatedStudyError("taken")

        monkeypatch.setattr(optuna, "create_study", create_study)

    raced("[8, 16]")
    sampler = optuna.samplers.RandomSampler(seed=1)
    study = open_study(storage, spec, url, sampler)
    assert study._study_id == made["study"]._study_id and study.sampler is sampler
    storage = open_storage(default_url(tmp_path / "other", "s"), 60)
    raced("[8, 32]")
    with pytest.raises(ConfigError) as err:
        open_study(storage, spec, url, sampler)
    assert str(err.value) == (
        f"{spec.source} [study] name='s' is not valid: study s in postgresql://***@127.0.0.1:1/x was made with another "
        'search (space: [{"choices": [8, 32], "name": "batch_size"}] then, [{"choices": [8, 16], "name": '
        '"batch_size"}] now); give this one another name, or restore the file it was made with'
    )


def test_a_database_error_while_opening_the_study_is_one_storage_error_without_the_password(tmp_path, monkeypatch):
    import optuna
    import sqlalchemy.exc

    from train.sweep.storage import open_study

    class DriverError(Exception):
        pass

    DriverError.__module__ = "psycopg.errors"
    url = "postgresql://u:pw-42@127.0.0.1:1/x"
    spec = _spec(tmp_path)
    for exc in (
        sqlalchemy.exc.OperationalError("SELECT", {}, Exception("password pw-42 refused\nmore")),
        DriverError("password pw-42 refused\nmore"),
        optuna.exceptions.StorageInternalError("password pw-42 refused\nmore"),
    ):

        def load_study(exc=exc, **kw):
            raise exc

        monkeypatch.setattr(optuna, "load_study", load_study)
        with pytest.raises(StorageError) as err:
            open_study(object(), spec, url, None)
        assert str(err.value).startswith("the study storage postgresql://***@127.0.0.1:1/x failed: ")
        assert str(err.value).endswith("password *** refused; check the database"), str(err.value)
    monkeypatch.setattr(optuna, "load_study", lambda **kw: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # not the database's: a bug, shown as it is
        open_study(object(), spec, url, None)
