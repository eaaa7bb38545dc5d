"""`python -m train compare RUN RUN [RUN...]`: what differs between runs and what it did to them.

The settings that differ, the final and best metrics side by side, the training time each run
needed to reach its best, and (with `--out`) the curves overlaid in a PNG or an HTML page like the
report. Everything comes from the run directories (train.records); nothing is imported from
TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..config import env_text, of_kind, unused_settings
from ..errors import ConfigError
from ..run.manifest import data_version, section
from ..run.metrics_files import METRIC_COLUMNS, metric_text
from ..training.test_split import on_test
from .run_records import RunRecords, duration_text, on_test_text

# Settings that say how a run was driven, not what it learned, and the run's own name (each column's
# header already): listing them is noise.
NOT_COMPARED = of_kind("invocation", "label")
OUT_SUFFIXES = (".png", ".html")
UNUSED = "(not used)"
METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")


def check_out(out: str | None) -> Path | None:
    """Validate --out before anything is read: a .png or .html in an existing directory."""
    if out is None:
        return None
    path = Path(out)
    if path.suffix.lower() not in OUT_SUFFIXES:
        raise ConfigError("--out", out, "must end in .png (the curves) or .html (a page with the tables and curves)")
    if not path.parent.resolve().is_dir():
        raise ConfigError("--out", out, f"the directory {path.parent} does not exist; create it first")
    if path.is_dir():
        raise ConfigError("--out", out, "is a directory; name a file in it, e.g. compare.html")
    _check_not_a_runs_own(path, out)
    return path


def _check_not_a_runs_own(path: Path, out: str) -> None:
    """A run's files are its record: --out never overwrites one, nor takes a name the run writes.

    Inside a run directory only a new file whose name is none of the run's own is written
    (`compare.html` beside a run's report.html, not report.html itself); a link is followed."""
    from ..run.find import is_run_dir
    from ..run.rundir import RunDir

    target = path.resolve()
    for parent in target.parents:
        try:
            if not is_run_dir(parent):
                continue
        except OSError:  # a folder this user cannot look into holds no run it could overwrite
            continue
        own = RunDir(parent)
        top = target.relative_to(parent).parts[0]
        if top in own.own_names():
            problem = f"{top} is a name run {own.name} writes itself"
        elif target.exists():
            problem = f"{target} already exists inside run {own.name}"
        else:
            return
        raise ConfigError("--out", out, f"{problem}; compare never overwrites a run's files: name a new file")


def check_distinct(run_dirs: Sequence[Path], names: Sequence[str]) -> None:
    seen: dict[Path, str] = {}
    for path, name in zip(run_dirs, names):
        key = path.resolve()
        if key in seen:
            raise ConfigError("RUN", name, f"names the same run as {seen[key]!r}; compare different runs")
        seen[key] = name


def distinct_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Each run's column header: its folder's name, or for runs of one name (in two folders) the shortest
    end of their paths that tells them apart (`a/runs/base`, `b/runs/base`)."""
    parts = [Path(d).absolute().parts for d in run_dirs]
    ends = [1] * len(parts)
    while True:
        labels = [Path(*p[-n:]).as_posix() for p, n in zip(parts, ends)]
        alike = [i for i, label in enumerate(labels) if labels.count(label) > 1 and ends[i] < len(parts[i])]
        if not alike:
            return labels
        for i in alike:
            ends[i] += 1


def differing_settings(runs: Sequence[RunRecords]) -> list[tuple[str, list[str]]]:
    """The settings whose values differ, a value that did nothing in its run (IMAGE_SIZE for MNIST)
    shown as such: runs that differ only there trained the same way."""
    keys = sorted(set().union(*(r.config for r in runs)) - NOT_COMPARED)
    unused = [unused_settings(r.config) for r in runs]
    rows = []
    for key in keys:
        values = [UNUSED if key in u else _text(r.config.get(key, "-")) for r, u in zip(runs, unused)]
        if key == "precision":  # what each run trained in: auto's choice is a policy like any other
            trained = [_trained_in(r, v) for r, v in zip(runs, values)]
            if len(set(trained)) > 1:
                rows.append(("PRECISION", [t if t == v else f"{t} ({v})" for t, v in zip(trained, values)]))
        elif key == "data_dir" and _one_data_set(runs, values):
            continue  # the same files read from two places (a `reproduce` rerun reads the clone's absolute path)
        elif len(set(values)) > 1:
            rows.append((key.upper(), values))
    return rows


def _one_data_set(runs: Sequence[RunRecords], values: list[str]) -> bool:
    """Every run read its DATA_DIR and the data each read has one fingerprint: the runs trained on the same data."""
    fingerprints = {section(r.manifest, "data").get("fingerprint") for r in runs}
    return UNUSED not in values and len(fingerprints) == 1 and None not in fingerprints


def _trained_in(run: RunRecords, precision: str) -> str:
    """PRECISION=auto as the policy the run's manifest says it chose (a `reproduce` rerun pins it)."""
    policy = section(run.manifest, "precision").get("policy")
    return policy if precision == "auto" and isinstance(policy, str) else precision


def metric_rows(runs: Sequence[RunRecords]) -> list[tuple[str, list[str]]]:
    """Status, epochs, final metrics, best MONITOR and the training time to reach it."""
    rows = [
        ("status", [r.status for r in runs]),
        ("epochs", [f"{len(r.rows)}/{r.planned_epochs or '?'}" for r in runs]),
    ]
    # METRICS, then every metric a run's model adds (`top2`, `val_top2`: its own metrics.csv columns).
    added = [k for r in runs for k in (r.rows[-1] if r.rows else {}) if k not in METRIC_COLUMNS]
    for key in [*METRICS, *dict.fromkeys(added)]:
        rows.append((f"final {key}", [num(r.rows[-1].get(key)) if r.rows else "-" for r in runs]))
    bests = [r.best_row() for r in runs]
    rows.append(("best", [f"{r.monitor}={metric_text(b[r.monitor])}" if b else "-" for r, b in zip(runs, bests)]))
    rows.append(("best at epoch", [f"{b['epoch']:.0f}" if b else "-" for b in bests]))
    # The test split, evaluated once at the end of each run: apart from the validation value that chose the weights.
    for which in ("best", "final"):
        rows.append((f"test, {which} weights", [on_test_text(on_test(r.manifest, which)) or "-" for r in runs]))
    rows.append(
        (
            "time to best",
            [duration_text(r.seconds_to(b["epoch"]), compact=True) if b else "-" for r, b in zip(runs, bests)],
        )
    )
    rows.append(("training time", [duration_text(r.seconds_to(float("inf")), compact=True) for r in runs]))
    rows.append(("resumed", [f"{len(r.resumes)}x" for r in runs]))
    versions = [data_version(r.manifest) for r in runs]
    if any(versions):  # only runs whose data DVC tracks record one
        rows.append(("data version", [_version_cell(v) for v in versions]))
    return rows


def _version_cell(version: dict | None) -> str:
    """A table cell: the tracked path at its commit, marked when the data read was not that version."""
    if not version:
        return "-"
    mark = " (differed)" if version.get("workspace") == "differs" else ""
    commit = version.get("commit")
    return f"{version['path']}{f'@{str(commit)[:12]}' if commit else ' (no commit)'}{mark}"


def format_comparison(runs: Sequence[RunRecords]) -> str:
    names = [r.name for r in runs]
    settings = [[k, *v] for k, v in differing_settings(runs)] or [["(none)", *["" for _ in runs]]]
    blocks = [
        _columns([["settings that differ", *names], *settings]),
        _columns([["metrics", *names], *[[k, *v] for k, v in metric_rows(runs)]]),
        "time to best: training seconds of every segment (validation excluded) until the best epoch ended",
    ]
    return "\n\n".join(blocks)


def write_output(runs: Sequence[RunRecords], out: Path) -> Path:
    from ..run.files import atomic_write, write_text
    from .plots import compare_png

    png = compare_png(runs)
    if out.suffix.lower() == ".png":
        return atomic_write(out, lambda p: p.write_bytes(png))
    return write_text(out, compare_html(runs, png))


def compare_html(runs: Sequence[RunRecords], png: bytes) -> str:
    from .html import CSS, escape, img, table

    names = tuple(r.name for r in runs)
    settings = differing_settings(runs)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>compare {len(runs)} runs</title><style>{CSS}</style></head><body>
<h1>{len(runs)} runs compared</h1>
<h2>Curves</h2>
{img(png, "loss and accuracy of each run by epoch; the monitored metric by training time")}
<h2>Settings that differ</h2>
{table([(escape(k), *map(escape, v)) for k, v in settings], ("setting", *names)) if settings else '<p class="note">none</p>'}
<h2>Metrics</h2>
{table([(escape(k), *map(escape, v)) for k, v in metric_rows(runs)], ("", *names))}
<p class="note">time to best: training seconds of every segment (validation excluded) until the best epoch ended.</p>
</body></html>
"""


def _columns(table: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def _text(value) -> str:
    return env_text(value) if value != "" else "''"  # as .env writes it: true/false


def num(value) -> str:
    return "-" if value is None else metric_text(value)


def compare_runs(runs_dir: str | Path, names: Sequence[str], out: str | None = None) -> str:
    """The `compare` command: check the arguments, read the runs, return the text (and write --out)."""
    from ..run.find import resolve_run
    from .run_records import load_records

    if len(names) < 2:
        raise ConfigError(
            "RUN", " ".join(names), "compare needs two or more runs: python -m train compare RUN RUN [RUN...]"
        )
    out_path = check_out(out)
    dirs = [resolve_run(runs_dir, name) for name in names]
    check_distinct(dirs, names)
    runs = [load_records(d) for d in dirs]
    for run, label in zip(runs, distinct_labels(dirs)):
        run.label = label
    text = format_comparison(runs)
    if out_path is not None:
        text += f"\n\nwrote {write_output(runs, out_path)}"
    return text
