"""The `sweep` sub-command of `python -m train`: its flags here, its work in study.py.

train.cli adds it through train.extras, so that dropping sweeps is deleting this folder and
its line there. Importing this module is cheap: Optuna and TensorFlow load only when a sweep runs,
after the space file and every setting have been checked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ConfigError
from ..run.metrics_files import metric_text


def add_command(sub: argparse._SubParsersAction) -> None:
    from ..commands import add_env_file
    from ..commands.fit import add_setting_flags

    sw = sub.add_parser(
        "sweep",
        allow_abbrev=False,
        help="search hyperparameters with Optuna: every trial an ordinary run (docs/sweeps.md)",
    )
    sw.add_argument("space", metavar="SPACE.toml", help="the study and the settings to search ([study], [space])")
    sw.add_argument(
        "--trials", type=_positive, default=None, help="the study's total number of trials (default: the file's)"
    )
    sw.add_argument(
        "--storage",
        default=None,
        help="database URL of the study (default SWEEP_STORAGE, else SQLite in RUNS_DIR/sweeps)",
    )
    sw.add_argument("--study", default=None, help="the study's name (default: the file's [study] name, else its stem)")
    sw.add_argument("--report-only", action="store_true", help="write the study's report.html again and run no trial")
    add_env_file(sw)
    add_setting_flags(sw)


def _warn_run_name(settings) -> None:
    """RUN_NAME (a flag, .env or the environment) names no trial's run: one line, not silence."""
    if settings.run_name:
        import logging

        logging.getLogger("train").warning(
            "WARNING: RUN_NAME=%s is not used: a sweep names each trial's run <run id>-<study>-t<trial number>",
            settings.run_name,
        )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--trials {text!r}: a whole number >= 1")
    return value


def run(args: argparse.Namespace) -> int:
    settings = _checked_settings(args)
    from .space import read_space

    spec = read_space(args.space, settings, args.study)
    from .storage import default_url

    url = settings.sweep_storage or default_url(settings.runs_dir, spec.name)
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from ..run.train_log import setup_logging

    setup_logging(None)
    if args.report_only:  # names no run: a RUN_NAME (from .env, say) is nothing to warn of here
        from .report import report_only

        print(f"wrote {report_only(spec, settings.runs_dir, url)}")
        return 0
    _warn_run_name(settings)
    import shlex

    from ..commands import command_line
    from ..locations import redact_argv, runs_dir_flag
    from .report import best_trial_test
    from .study import run_sweep

    result = run_sweep(spec, settings, url, args.trials, command=shlex.join(redact_argv(command_line(args))))
    print(f"{finished_line(result)}; report {result.report}")
    if result.best:
        best = result.best
        print(
            f"best: trial {best['trial']} {spec.metric}={metric_text(best['value'])} {best['params']} (run {best['run']})"
        )
        tested = best_trial_test(settings.runs_dir, str(best["run"])) if best.get("run") else None
        if tested:  # chosen on validation; the test split says how it does on data nothing was chosen by
            print(f"  test: {tested} (its best weights, the test split evaluated once; not what the study optimised)")
        from ..run.rundir import RunDir

        export = RunDir(Path(settings.runs_dir) / str(best["run"])).export.path
        if export.is_dir():
            print(f"  its export: {export}")
        else:
            print(f"  export it: python -m train export {best['run']}" + runs_dir_flag(settings.runs_dir))
    else:
        print("best: none yet (no trial completed)", file=sys.stderr)
    return 0


def finished_line(result) -> str:
    """How many trials finished, against the total asked; a study that had more already (a lower
    --trials, a one-point space) says so instead of "6 of 2"."""
    if result.finished > result.total:
        return (
            f"study {result.study}: {result.finished} trial(s) finished, more than the {result.total} asked "
            "(a study's total only grows: a lower --trials runs nothing)"
        )
    return f"study {result.study}: {result.finished} of {result.total} trial(s) finished"


def _checked_settings(args: argparse.Namespace):
    """The sweep's settings, refused before TensorFlow when they cannot work: a bucket RUNS_DIR, a
    missing extra, a missing runtime of an export format."""
    from .. import check_before_training
    from ..commands import settings_for
    from ..extras import require
    from ..locations import looks_like_url

    settings = settings_for(args)
    if args.storage is not None:
        settings = settings.replace(sweep_storage=args.storage)
    if looks_like_url(settings.runs_dir):
        # The study's report and its SQLite file are written under RUNS_DIR as local paths.
        raise ConfigError(
            "RUNS_DIR",
            settings.runs_dir,
            "a sweep keeps its trials' runs and its report in a local RUNS_DIR (a bucket is not supported "
            "for sweeps yet): give a local folder, e.g. --runs-dir ./runs",
        )
    require("sweep", "sweep", args.space)
    _one_process(settings)
    check_before_training(settings)  # its extras, its export formats' runtimes, bfloat16's ISA
    return settings


def _one_process(settings) -> None:
    """A cluster (WORKERS, TF_CONFIG, several SkyPilot nodes) is refused: each trial would wait for its
    other workers, whose own sweeps propose other parameters. A study spreads over machines instead."""
    from .. import extras

    cluster = extras.part("workers", "cluster")
    if cluster is None:  # no workers extra: the core refuses a launcher's cluster already
        return
    import os

    found = cluster.read_cluster(settings.workers, settings.worker_index, os.environ)
    if found.multi:
        value = settings.workers if found.source == "WORKERS" else os.environ[found.source]
        fix = "launch each sweep on one node" if found.source == "SKYPILOT_NODE_IPS" else "unset it"
        raise ConfigError(
            found.source,
            value[:80],
            f"names {found.size} workers, but a sweep trains each trial in this one process: {fix}, and "
            "start a sweep on each machine against one SWEEP_STORAGE instead (docs/sweeps.md)",
        )
