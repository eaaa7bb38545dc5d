"""Sweeps: trials per hour against a loop of `fit` processes, and TPE against random search at one budget.

A sweep runs its trials in one process (TensorFlow starts once); a plain loop starts one `python -m
train fit` per setting. Both train the same settings with DETERMINISTIC=true, so the trials must end
with the same final weights as the fits: the proof that a trial's result does not depend on the
trials before it in the same process. Figures are recorded, not asserted (the machine is shared).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import common
import pytest

LEARNING_RATES = (1e-3, 2e-3, 3e-3, 5e-3, 7e-3, 1e-2)


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("SWEEP_STORAGE", "RESUME", "RUNS_DIR")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(common.ROOT))
    return env


def _flags(npz: Path, runs: Path, quick: bool) -> list[str]:
    values = {
        "dataset": f"npz:{npz}",
        "runs_dir": str(runs),
        "model": "cnn",
        "epochs": 1,
        "batch_size": 64,
        "checkpoint_every": 0,
        "precision": "float32",
        "progress": "line",
        "report": "off",
        "peak_flops": "1e11",
    }
    return [x for k, v in values.items() for x in ("--" + k.replace("_", "-"), str(v))] + [
        "--no-export",
        "--deterministic",
        "--env-file",
        "/dev/null",
    ]


def _run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *cmd], env=_env(), capture_output=True, text=True, timeout=7200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return time.perf_counter() - t0


def _manifests(runs: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs.glob("2*/manifest.json"))]


def _small_npz(tmp_path: Path, quick: bool) -> Path:
    arrays, _ = common.mnist_arrays(True)  # small trials: the 2048/512 subset at most
    if quick:
        arrays = {k: v[: 256 if k.endswith("train") else 64] for k, v in arrays.items()}
    return common.write_npz(arrays, tmp_path / "small.npz")


@pytest.mark.processes
def test_sweep_trials_per_hour_against_a_loop_of_fit_processes(benchmark, quick, tmp_path):
    rates = LEARNING_RATES[: 1 if quick else len(LEARNING_RATES)]
    npz = _small_npz(tmp_path, quick)
    space = tmp_path / "space.toml"
    space.write_text(
        f"[study]\nname = 'rate'\ntrials = {len(rates)}\npruner = 'none'\nsampler = 'grid'\n"
        f"[space]\nlearning_rate = {list(rates)}\n"
    )
    sweep_runs, fit_runs = tmp_path / "sweep-runs", tmp_path / "fit-runs"

    def sweep() -> float:
        return _run(["-m", "train", "sweep", str(space), *_flags(npz, sweep_runs, quick)])

    def fits() -> float:
        return sum(
            _run(["-m", "train", "fit", *_flags(npz, fit_runs, quick), "--learning-rate", str(lr)]) for lr in rates
        )

    times = common.once(benchmark, lambda: common.interleave({"sweep": sweep, "fits": fits}, 1))
    by_lr = {}
    for which, runs in (("sweep", sweep_runs), ("fit", fit_runs)):
        for m in _manifests(runs):
            lr = m["sweep"]["params"]["learning_rate"] if which == "sweep" else None
            if lr is None:
                lr = json.loads((runs / m["run_id"] / "config.json").read_text())["learning_rate"]
            by_lr.setdefault(lr, {})[which] = m.get("final_weights_sha256")
    independent = all(v.get("sweep") and v.get("sweep") == v.get("fit") for v in by_lr.values())
    s, f = times["sweep"][0], times["fits"][0]
    common.record(
        benchmark,
        "11a. sweep: trials per hour, one sweep process / a loop of `fit` processes (same settings)",
        "> 1 (the sweep reuses its process), and every trial's final weights equal its fit's",
        common.ratio(f, s),
        independent and s < f,
        trials=len(rates),
        sweep_seconds=s,
        fit_loop_seconds=f,
        sweep_trials_per_hour=round(len(rates) / s * 3600, 1),
        fit_loop_trials_per_hour=round(len(rates) / f * 3600, 1),
        trials_equal_their_fits=independent,
    )


def _time_to_best(db: Path, study: str) -> tuple[float, float, int]:
    """(best value, seconds from the study's first trial start to the end of the trial that reached it, trials)."""
    import optuna

    trials = [
        t for t in optuna.load_study(study_name=study, storage=f"sqlite:///{db}").get_trials() if t.value is not None
    ]
    best = max(trials, key=lambda t: t.value)
    start = min(t.datetime_start for t in trials)
    return best.value, (best.datetime_complete - start).total_seconds(), len(trials)


@pytest.mark.processes
def test_time_to_best_val_accuracy_tpe_against_random_at_one_budget(benchmark, quick, tmp_path):
    trials = 2 if quick else 20
    npz = _small_npz(tmp_path, quick)
    results = {}

    def study(sampler: str) -> float:
        space = tmp_path / f"{sampler}.toml"
        space.write_text(
            f"[study]\nname = '{sampler}'\ntrials = {trials}\npruner = 'none'\nsampler = '{sampler}'\n"
            "startup_trials = 5\n[space]\nlearning_rate = { low = 1e-4, high = 3e-2, log = true }\n"
            "batch_size = [32, 64, 128]\n"
        )
        runs = tmp_path / f"{sampler}-runs"
        seconds = _run(["-m", "train", "sweep", str(space), *_flags(npz, runs, quick)])
        results[sampler] = _time_to_best(runs / "sweeps" / f"{sampler}.db", sampler)
        return seconds

    common.once(
        benchmark, lambda: common.interleave({"tpe": lambda: study("tpe"), "random": lambda: study("random")}, 1)
    )
    (tpe_best, tpe_s, _), (rnd_best, rnd_s, _) = results["tpe"], results["random"]
    common.record(
        benchmark,
        f"11b. sweep: time to the best val_accuracy, TPE / random, {trials} trials each",
        "< 1 with a best at least as good (one study each: a single draw, not a distribution)",
        common.ratio(tpe_s, rnd_s),
        None,
        trials=trials,
        tpe_best_val_accuracy=tpe_best,
        random_best_val_accuracy=rnd_best,
        tpe_seconds_to_best=tpe_s,
        random_seconds_to_best=rnd_s,
    )
