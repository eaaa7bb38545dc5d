"""Two sweep processes on one PostgreSQL study (a real server, tests/servers_pg.py): each trial runs once."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from faults import env
from servers_pg import PASSWORD
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
