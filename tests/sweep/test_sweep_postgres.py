"""Two sweep processes on one PostgreSQL study (a real server, tests/servers_pg.py): each trial runs once."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from faults import env
from servers_pg import PASSWORD, PostgresServer
from test_sweep_signals import _flags

from train.run.find import list_run_dirs

pytestmark = pytest.mark.slow


def test_two_sweeps_on_one_postgres_study_run_exactly_its_trials_each_once(tmp_path, postgres_url):
    study = "pg-" + uuid.uuid4().hex[:8]  # one server for the session: each test its own study
    space = tmp_path / "space.toml"
    space.write_text(
        f"[study]\nname = '{study}'\ntrials = 5\npruner = 'none'\nsampler = 'random'\n"
        "[space]\nlearning_rate = { low = 1e-4, high = 1e-2, log = true }\n"
    )
    cmd = [sys.executable, "-m", "train", "sweep", str(space), "--env-file", "/dev/null", *_flags(tmp_path, 1)]
    procs = []
    for i in range(2):
        out = open(tmp_path / f"worker-{i}.out", "w")
        extra = {"SWEEP_STORAGE": postgres_url}
        procs.append((subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env(**extra)), i))
        out.close()
    outputs = []
    for proc, i in procs:
        rc = proc.wait(timeout=1200)
        outputs.append((tmp_path / f"worker-{i}.out").read_text())
        assert rc == 0, outputs[-1]

    runs = list_run_dirs(tmp_path / "runs")
    manifests = [json.loads((r / "manifest.json").read_text()) for r in runs]
    trials = sorted(m["sweep"]["trial"] for m in manifests)
    assert len(runs) == 5 and len(set(trials)) == 5, trials  # five runs, five different trials
    assert all(m["status"] == "completed" for m in manifests)

    import optuna

    from train.sweep.storage import with_driver
    from train.sweep.study import counted

    every = optuna.load_study(study_name=study, storage=with_driver(postgres_url)).get_trials()
    kept = counted(every)
    assert sorted(t.number for t in kept) == trials and all(t.state.name == "COMPLETE" for t in kept)
    assert {t.user_attrs["run"] for t in kept} == {r.name for r in runs}  # each trial's own run, once
    surplus = [t for t in every if t not in kept]
    assert all(t.user_attrs.get("surplus") and t.state.name == "FAIL" and "run" not in t.user_attrs for t in surplus)

    for text in [*outputs, *(json.dumps(m) for m in manifests), *((r / "config.json").read_text() for r in runs)]:
        assert PASSWORD not in text
    assert manifests[0]["sweep"]["storage"].startswith("postgresql://***@127.0.0.1:")


@pytest.mark.parametrize("change", ["password", "database"])
def test_a_wrong_password_or_database_is_one_storage_error_exit_7_without_the_password(
    tmp_path, capsys, postgres_url, change
):
    from train.cli import main

    space = tmp_path / "space.toml"
    space.write_text("[study]\nname = 'w'\ntrials = 1\n[space]\nbatch_size = [8, 16]\n")
    wrong = "wr0ng-pw"
    url = (
        postgres_url.replace(PASSWORD, wrong) if change == "password" else postgres_url.rsplit("/", 1)[0] + "/nosuchdb"
    )
    rc = main(["sweep", str(space), "--storage", url, "--runs-dir", str(tmp_path / "runs"), "--env-file", "/dev/null"])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert rc == 7 and err.startswith("StorageError: cannot open the study storage postgresql://***@127.0.0.1:"), err
    assert len(err.splitlines()) == 1
    assert wrong not in captured.out + captured.err and PASSWORD not in captured.out + captured.err


def test_the_study_server_stopped_mid_trial_is_warned_then_one_storage_error_and_the_next_sweep_counts_the_run(
    tmp_path, capsys, monkeypatch
):
    """The real server stops (pg_ctl's fast stop) at the end of a trial's first epoch: the epoch's
    value is not reported (a WARNING line; the training goes on, unpruned), telling the result
    fails (one StorageError line, exit 7, the finished run kept), and once the server is back the
    sweep counts that run's result without training it again. A server of its own: the session's
    is shared by other tests."""
    import optuna

    import train
    from train.cli import main
    from train.sweep.storage import with_driver

    server = PostgresServer()
    real, stopped = train.train, []

    class StopTheServer:
        def on_epoch_end(self, epoch, row, state):
            if epoch == 1:
                server.stop()
                stopped.append(epoch)

    def trains(settings, resume="", callbacks=(), **kwargs):  # the real training; the server stopped in it
        return real(settings, resume=resume, callbacks=[StopTheServer(), *callbacks], **kwargs)

    space = tmp_path / "space.toml"
    # The trial the lost server could not be told of is still running in the study: the next sweep
    # takes it over once its heartbeat is stale, twice `heartbeat` seconds.
    space.write_text(
        "[study]\nname = 'lost'\ntrials = 1\npruner = 'none'\nheartbeat = 1\n[space]\nlearning_rate = [0.001, 0.002]\n"
    )
    sweep = ["sweep", str(space), "--storage", server.url, "--env-file", "/dev/null", *_flags(tmp_path, 2)]
    try:
        monkeypatch.setattr("train.train", trains)
        rc = main(sweep)
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert stopped == [1] and rc == 7, err
        assert err[-1].startswith("StorageError: the study storage postgresql://***@127.0.0.1:"), err
        assert "stopped answering" in err[-1] and "run the sweep again" in err[-1], err
        warned = [line for line in captured.out.splitlines() if "WARNING: study storage" in line]
        (epoch,) = [line for line in warned if "not reported" in line]
        assert "epoch 1's val_accuracy not reported ((psycopg.OperationalError)" in epoch, warned
        assert epoch.endswith("the trial trains on, unpruned") and "epoch 2/2: " in captured.out
        # The trial's heartbeat thread (every second here) may find the server gone first on a slow
        # machine: one line of its own, never a traceback.
        assert all("not reported" in w or "a trial's heartbeat was not recorded" in w for w in warned), warned
        assert "Traceback" not in captured.out + captured.err
        (run,) = list_run_dirs(tmp_path / "runs")
        assert json.loads((run / "manifest.json").read_text())["status"] == "completed"

        server.start()
        monkeypatch.setattr("train.train", lambda *a, **k: pytest.fail("a finished run was trained again"))
        assert main(sweep) == 0
        (trial,) = optuna.load_study(study_name="lost", storage=with_driver(server.url)).get_trials(
            states=[optuna.trial.TrialState.COMPLETE]
        )
        assert trial.user_attrs["run"] == run.name and list_run_dirs(tmp_path / "runs") == [run]
        assert PASSWORD not in "".join(capsys.readouterr())
    finally:
        server.remove()
