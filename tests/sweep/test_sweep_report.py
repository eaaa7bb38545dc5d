"""RUNS_DIR/sweeps/<study>/report.html: self-contained, every part there, and drawn as such in headless Chromium."""

from __future__ import annotations

import re

import optuna
import pytest
from helpers import near, screenshot

from train.config import load_settings
from train.sweep.report import report_path, write_sweep_report
from train.sweep.space import read_space
from train.sweep.storage import default_url, open_storage, open_study

SPACE = (
    "[study]\nname = 'rep'\ntrials = 6\n[space]\n"
    "learning_rate = { low = 1e-4, high = 1e-2, log = true }\nmodel = ['cnn', 'cnn_bn']\n"
)


def _study(tmp_path):
    runs = tmp_path / "runs"
    (tmp_path / "space.toml").write_text(SPACE)
    spec = read_space(tmp_path / "space.toml", load_settings({"runs_dir": str(runs)}, env_file=None, environ={}))
    url = default_url(runs, "rep")
    study = open_study(open_storage(url, 60), spec, url, None)
    dists = {
        "learning_rate": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
        "model": optuna.distributions.CategoricalDistribution(["cnn", "cnn_bn"]),
    }
    for i, (lr, model, value) in enumerate(
        [(1e-4, "cnn", 0.6), (1e-3, "cnn_bn", 0.9), (5e-3, "cnn", 0.8), (2e-4, "cnn_bn", 0.7)]
    ):
        run = runs / f"20261201-00000{i}-000000-rep-t{i}"
        run.mkdir(parents=True)
        (run / "report.html").write_text("<html>run</html>")
        study.add_trial(
            optuna.trial.create_trial(
                params={"learning_rate": lr, "model": model},
                distributions=dists,
                value=value,
                user_attrs={"run": run.name},
            )
        )
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED, params={"learning_rate": 1e-4, "model": "cnn"}, distributions=dists
        )
    )
    return study, spec, runs


def test_the_report_names_the_best_trial_links_every_run_and_fetches_nothing(tmp_path):
    study, spec, runs = _study(tmp_path)
    path = write_sweep_report(study, spec, runs, "sqlite:///x.db")
    assert path == report_path(runs, "rep") == runs / "sweeps" / "rep" / "report.html"
    page = path.read_text()
    assert "best: trial 1, val_accuracy = 0.9, run 20261201-000001-000000-rep-t1" in page
    for heading in ("Optimisation history", "Each parameter against the metric", "Parameter importances", "Trials"):
        assert f"<h2>{heading}</h2>" in page
    links = re.findall(r"<a href='([^']+)'>", page)
    assert len(links) == 4 and all((path.parent / link).resolve().is_file() for link in links)
    assert "pruned" in page
    sources = re.findall(r"src=\"([^\"]+)\"", page)
    assert len(sources) == 4 and all(
        s.startswith("data:image/png;base64,") for s in sources
    )  # history, 2 params, importances
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")


def test_the_best_trial_is_chosen_on_validation_and_its_test_result_is_shown_beside_it(tmp_path):
    import json

    study, spec, runs = _study(tmp_path)
    best, other = runs / "20261201-000001-000000-rep-t1", runs / "20261201-000002-000000-rep-t2"
    tested = {"examples": 10000, "weights": {"best": {"epoch": 3, "loss": 0.3, "accuracy": 0.8812}}}
    (best / "manifest.json").write_text(json.dumps({"status": "completed", "test": tested}))
    # A trial with a better test result is not the best: the study never sees the test split.
    better = {"examples": 10000, "weights": {"best": {"epoch": 3, "loss": 0.2, "accuracy": 0.95}}}
    (other / "manifest.json").write_text(json.dumps({"status": "completed", "test": better}))
    page = write_sweep_report(study, spec, runs, "sqlite:///x.db").read_text()
    assert (
        "best: trial 1, val_accuracy = 0.9, run 20261201-000001-000000-rep-t1; test accuracy=0.8812 "
        "(its best weights; the study never sees it)"
    ) in page
    assert "accuracy=0.9500" not in page


@pytest.mark.slow
def test_chromium_draws_the_history_the_params_and_the_importances(tmp_path):
    study, spec, runs = _study(tmp_path)
    path = write_sweep_report(study, spec, runs, "sqlite:///x.db")
    img = screenshot(path, tmp_path / "shot.png", size=(1280, 2400))
    assert near(img, "#d62728").sum() > 50  # the best-so-far line
    assert near(img, "#1f77b4").sum() > 200  # the trials' points
    assert near(img, "#2ca02c").sum() > 500  # the importance bars


def test_report_only_writes_the_page_again_and_runs_no_trial(tmp_path, capsys):
    from train.cli import main

    study, _spec, runs = _study(tmp_path)
    before = len(study.get_trials())
    flags = ["--report-only", "--runs-dir", str(runs), "--env-file", "/dev/null", "--run-name", "mine"]
    rc = main(["sweep", str(tmp_path / "space.toml"), *flags])
    out, err = capsys.readouterr()
    assert rc == 0 and f"wrote {report_path(runs, 'rep')}" in out
    assert "RUN_NAME" not in out + err  # a report names no trial's run: no warning that RUN_NAME is not used
    assert "best: trial 1" in report_path(runs, "rep").read_text()
    assert len(study.get_trials()) == before


def test_report_only_of_a_study_that_is_not_there_is_one_line_and_makes_nothing(tmp_path, capsys):
    from train.cli import main

    _study(tmp_path)  # study "rep"; this file names another
    (tmp_path / "other.toml").write_text(SPACE.replace("'rep'", "'other'"))
    runs, sweeps = tmp_path / "runs", sorted((tmp_path / "runs" / "sweeps").iterdir())
    flags = ["--report-only", "--runs-dir", str(runs), "--env-file", "/dev/null"]
    assert main(["sweep", str(tmp_path / "other.toml"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"ConfigError: {tmp_path / 'other.toml'} [study] name='other' is not valid: there is no study other in "
        f"{default_url(runs, 'other')} to report on: run the sweep first (without --report-only), or check the "
        "study's name (--study), RUNS_DIR and --storage"
    )
    assert sorted((runs / "sweeps").iterdir()) == sweeps  # no other.db, no other/report.html
    url = default_url(runs, "rep")  # a database that holds other studies: none is created in it
    assert main(["sweep", str(tmp_path / "space.toml"), "--study", "typo", "--storage", url, *flags]) == 2
    assert "there is no study typo in" in capsys.readouterr().err
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == ["rep"]
    empty = tmp_path / "empty.db"  # a database without Optuna's tables: none is made in it
    empty.touch()
    assert main(["sweep", str(tmp_path / "space.toml"), "--storage", f"sqlite:///{empty}", *flags]) == 2
    assert "there is no study rep in" in capsys.readouterr().err and empty.stat().st_size == 0
    empty.write_text("notes")  # not a database at all: the sweep's own refusal of it
    assert main(["sweep", str(tmp_path / "space.toml"), "--storage", f"sqlite:///{empty}", *flags]) == 2
    assert f"{empty} is not a SQLite database" in capsys.readouterr().err


def test_every_status_a_run_ends_with_has_a_visible_badge_in_its_report():
    from train.results.report import CSS

    coloured = set()
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", CSS):
        if "background:" in body:
            coloured |= {s.strip().lstrip(".") for s in selectors.split(",")}
    # The badge's text is white: a status without a background would be invisible (a pruned trial's run).
    assert {"completed", "running", "interrupted", "budget", "failed", "pruned"} <= coloured


def test_a_trials_parameters_read_as_a_person_would_and_a_smoke_trial_is_marked(tmp_path):
    import json

    study, spec, runs = _study(tmp_path)
    dists = {
        "learning_rate": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
        "model": optuna.distributions.CategoricalDistribution(["cnn", "cnn_bn"]),
    }
    run = runs / "20261201-000009-000000-rep-t5"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"smoke": True}))
    study.add_trial(
        optuna.trial.create_trial(
            params={"learning_rate": 0.0034829345123, "model": "cnn"},
            distributions=dists,
            value=0.5,
            user_attrs={"run": run.name},
        )
    )
    page = write_sweep_report(study, spec, runs, "sqlite:///x.db").read_text()
    assert "learning_rate=0.00348, model=cnn" in page and "0.0034829345" not in page
    assert re.search(r"<td>5 \(smoke\)</td>", page)
    assert not re.search(r"<td>1 \(smoke\)", page)  # the other trials' runs were no smoke runs
