"""RUNS_DIR/sweeps/<study>/report.html: the study at a glance, self-contained like a run's report.

The optimisation history (each trial's value and the best so far), each parameter against the
metric, the parameters' importances (Optuna's PED-ANOVA, which needs no scikit-learn), and a table
of the trials linking each run's own report.html, with the best trial named at the top. Pictures
are matplotlib PNGs inline; no script, nothing fetched. Written at the end of every sweep process
and by `python -m train sweep SPACE.toml --report-only`.
"""

from __future__ import annotations

import html
import logging
import math
import os
from pathlib import Path

from ..results.html import CSS, img, note, num, table
from ..results.plots import plain_text, png_bytes
from ..run.files import ensure_writable
from ..run.rundir import RunDir, write_text
from .space import SweepSpec
from .storage import SWEEPS_DIR
from .trials import retry_text

log = logging.getLogger("train")


def report_path(runs_dir: str | Path, study: str) -> Path:
    return Path(runs_dir) / SWEEPS_DIR / study / "report.html"


def report_only(spec: SweepSpec, runs_dir: str, url: str) -> Path:
    from ..config import redact_uri
    from .storage import check_sqlite_file, holds_no_studies, no_study, open_storage, open_study, sqlite_file

    # Reporting makes nothing: no SQLite file where none was, no Optuna tables in a database without
    # them, no study in a database that lacks it (an empty one would also fix that name's search to
    # this file's space).
    if url.startswith("sqlite:///"):
        if not sqlite_file(url).is_file():
            raise no_study(spec, url)
        check_sqlite_file(url)  # another program's file is refused as a sweep refuses it
    if holds_no_studies(url):
        raise no_study(spec, url)
    study = open_study(open_storage(url, spec.heartbeat), spec, url, None, create=False)
    return write_sweep_report(study, spec, runs_dir, redact_uri(url))


def write_sweep_report(study, spec: SweepSpec, runs_dir: str | Path, shown: str) -> Path:
    from .trials import best_trial, counted

    trials = sorted(counted(study.get_trials(deepcopy=False)), key=lambda t: t.number)
    path = report_path(runs_dir, spec.name)
    ensure_writable(path.parent)  # a read-only RUNS_DIR/sweeps: one StorageError line, as `fit` gives
    write_text(path, render(spec, trials, best_trial(study), _importances(study), shown, path.parent, runs_dir))
    return path


def _importances(study) -> dict[str, float] | str:
    import optuna

    try:
        import warnings

        from optuna.importance import PedAnovaImportanceEvaluator

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "too few trials": the page shows equal bars, and says so below
            return optuna.importance.get_param_importances(study, evaluator=PedAnovaImportanceEvaluator())
    except Exception as exc:  # too few finished trials, one value only: said on the page
        return f"not computed: {type(exc).__name__}: {exc}".splitlines()[0]


def render(spec: SweepSpec, trials, best, importances, shown: str, here: Path, runs_dir) -> str:
    e = html.escape
    lead = (
        f"best: trial {best['trial']}, {e(spec.metric)} = {num(best['value'])}, run {e(str(best['run']))}"
        + _tested(runs_dir, best.get("run"))
        if best
        else "best: none yet (no trial has completed)"
    )
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>study {e(spec.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>study {e(spec.name)}</h1>",
        f"<p class='lead' id='best'>{lead}</p>",
        table(
            [
                ("metric", f"{e(spec.metric)} ({spec.direction})"),
                ("trials", f"{sum(t.state.is_finished() for t in trials)} finished of {len(trials)} counted"),
                ("sampler / pruner", f"{spec.sampler} / {spec.pruner}"),
                ("storage", e(shown)),
            ]
        ),
        "<h2>Optimisation history</h2>",
        img(history_png(spec, trials), "optimisation history"),
        "<h2>Each parameter against the metric</h2>",
        *(img(param_png(spec, trials, p.name), f"{p.name} against {spec.metric}") for p in spec.params),
        "<h2>Parameter importances</h2>",
        note(importances)
        if isinstance(importances, str)
        else img(importance_png(importances), "parameter importances"),
        "<h2>Trials</h2>",
        _trials_table(spec, trials, best, here, runs_dir),
        "</body></html>",
    ]
    return "\n".join(parts)


def _tested(runs_dir, run) -> str:
    """The best trial's test split result, beside the validation value the study chose it by."""
    if not run:
        return ""
    text = best_trial_test(runs_dir, run)
    return f"; test {html.escape(text)} (its best weights; the study never sees it)" if text else ""


def best_trial_test(runs_dir, run: str) -> str | None:
    """A trial run's best weights on the test split (`accuracy=0.9912`), from its manifest; None
    when it has none (no test split, not finished, or an unreadable record)."""
    from ..errors import RunRecordError
    from ..results.run_records import on_test_text
    from ..training.test_split import on_test

    try:
        manifest = RunDir(Path(runs_dir) / run).read_manifest(missing_ok=True)
    except (RunRecordError, OSError):
        return None
    return on_test_text(on_test(manifest))


def _trials_table(spec: SweepSpec, trials, best, here: Path, runs_dir) -> str:
    e = html.escape
    rows = []
    for t in trials:
        run = t.user_attrs.get("run")
        report = RunDir(Path(runs_dir) / run).report if run else None
        link = (
            f"<a href='{e(os.path.relpath(report, here))}'>{e(run)}</a>"
            if report and report.is_file()
            else e(str(run or "-"))
        )
        retry_of = t.system_attrs.get("retry_history") or []  # trials it replaces: the run is theirs
        mark = (
            (f" ({retry_text(retry_of)})" if retry_of else "")
            + (" (smoke)" if run and _smoke(Path(runs_dir) / run) else "")
            + (" (best)" if best and best["trial"] == t.number else "")
        )
        value = "" if t.value is None else num(t.value)
        rows.append(
            (
                str(t.number) + mark,
                t.state.name.lower(),
                value,
                e(", ".join(f"{k}={_shown(v)}" for k, v in t.params.items())),
                link,
            )
        )
    return table(rows, ("trial", "state", spec.metric, "parameters", "run"))


def _shown(value) -> str:
    """A parameter as a person reads it: 3 significant digits for a sampled float (0.00348, not 0.0034829345...)."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _smoke(run_dir: Path) -> bool:
    """A trial trained with SMOKE=true (one epoch of a small subset): its value says little, the table says so."""
    try:
        return RunDir(run_dir).read_config().get("smoke") is True
    except Exception:  # a run whose record is unreadable: the table still shows the trial
        return False


def _values(trials):
    return [(t.number, t.value, t.params) for t in trials if t.value is not None and math.isfinite(t.value)]


def _figure(width: float = 7.0, height: float = 3.2):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="tight")


@plain_text
def history_png(spec: SweepSpec, trials) -> bytes:
    fig = _figure()
    ax = fig.add_subplot()
    points = _values(trials)
    if points:
        xs, ys = [n for n, _, _ in points], [v for _, v, _ in points]
        ax.scatter(xs, ys, color="#1f77b4", label="trial")
        better = max if spec.direction == "maximize" else min
        running = [better(ys[: i + 1]) for i in range(len(ys))]
        ax.step(xs, running, where="post", color="#d62728", label="best so far")
        ax.legend(loc="best")
    else:
        ax.text(0.5, 0.5, "no completed trial yet", ha="center", va="center", transform=ax.transAxes)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel(spec.metric)
    ax.grid(True, alpha=0.3)
    return png_bytes(fig)


@plain_text
def param_png(spec: SweepSpec, trials, name: str) -> bytes:
    fig = _figure(5.0, 3.0)
    ax = fig.add_subplot()
    points = [(p.get(name), v) for _, v, p in _values(trials) if name in p]
    param = next(p for p in spec.params if p.name == name)
    if points:
        if param.choices is not None:
            labels = [str(c) for c in param.choices]
            ax.scatter([labels.index(str(x)) for x, _ in points], [v for _, v in points], color="#1f77b4")
            ax.set_xticks(range(len(labels)), labels)
        else:
            ax.scatter([x for x, _ in points], [v for _, v in points], color="#1f77b4")
            if param.log:
                from matplotlib.ticker import FuncFormatter, NullFormatter

                ax.set_xscale("log")
                # Plain numbers: the default 10^x labels are mathtext, shown raw with math parsing off.
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
                ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(name)
    ax.set_ylabel(spec.metric)
    ax.grid(True, alpha=0.3)
    return png_bytes(fig)


@plain_text
def importance_png(importances: dict[str, float]) -> bytes:
    fig = _figure(6.0, 0.6 + 0.4 * max(len(importances), 1))
    ax = fig.add_subplot()
    names = list(importances)[::-1]
    ax.barh(names, [importances[n] for n in names], color="#2ca02c")
    ax.set_xlabel("importance")
    return png_bytes(fig)
