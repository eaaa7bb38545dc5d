"""report.html and curves.png in a run directory: the run at a glance, from the directory alone.

One self-contained page (images inline as base64 PNG, no script, nothing fetched): the curves of
every segment with each resume marked, the best weights on the validation set (confusion matrix,
per-class accuracy, the most wrong images) and a summary of the manifest and the settings.

Two depths: at each epoch end only the cheap part is drawn (curves and summary: under a second),
so a running job can be watched from its volume; the validation part needs the data and
a forward pass, so it is computed at the end of the run and by `python -m train report RUN`.
Writing a report never changes a run's outcome: the hooks log a warning and carry on.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..locations import runs_dir_flag
from ..run.files import atomic_write, write_text
from ..run.find import is_run_dir
from ..run.manifest import data_version, data_version_text, lock_in_checkout, now_iso, section
from ..run.metrics_files import is_metric, metric_text
from ..run.rundir import RunDir
from ..training.test_split import on_test, on_test_summary
from .html import CSS, escape, img, note, num, table
from .run_records import RunRecords, data_text, duration_text, load_records, on_test_text

log = logging.getLogger("train")
CHEAP_NOTE = (
    "not computed yet: it comes at the end of the run (REPORT=full), or now with `python -m train report {run}`"
)
ENDED_NOTE = "not computed: `python -m train report {run}` (without --quick) computes it from the best weights"
# The validation part between these marks, with the best weights it evaluated (their size and
# modification time): a quick report keeps it while those weights are the same.
_SECTION = re.compile(r"<!-- validation of (\S+) -->\n(.*?)\n<!-- end of validation -->", re.S)


@dataclass
class Written:
    path: Path
    missing: list[str] = field(default_factory=list)  # parts left out, each with the reason


def write_report(run_dir: Path | str, full: bool = True, runs_dir: object = None) -> Written:
    """Write curves.png and report.html (atomically); RunRecordError if the records are unreadable.
    `runs_dir`: where the command found the run, for the commands its lines give."""
    from . import plots

    records = load_records(run_dir)
    files = RunDir(records.run_dir)
    curves = plots.curves_png(records)
    atomic_write(files.curves, lambda p: p.write_bytes(curves))
    missing: list[str] = []
    weights = _weights_signature(files)
    if full:
        validation = _validation_section(records, missing, runs_dir)
        saved = _saved_section(files, weights) if missing else None
        if not missing:  # only an evaluation is worth keeping, never the reason there is none
            validation = _mark(validation, weights)
        elif saved is not None:  # computed before for these best weights: never lost to a failed rerun
            validation = saved
            missing[-1] = f"{missing[-1]} (the validation part computed before for the same best weights is kept)"
    else:
        validation = _saved_section(files, weights)
        if validation is None:
            running = records.status == "running"
            why = (CHEAP_NOTE if running else ENDED_NOTE).format(run=records.name + runs_dir_flag(runs_dir))
            validation = note(why)
            missing.append("validation: " + why)
    write_text(files.report, render(records, curves, validation))
    return Written(files.report, missing)


def _weights_signature(files: RunDir) -> str | None:
    try:
        st = files.best_weights.stat()
    except OSError:
        return None
    return f"best.weights.h5@{st.st_size}-{st.st_mtime_ns}"


def _mark(section: str, weights: str | None) -> str:
    """The validation part, marked with the weights it evaluated (none: not to be kept)."""
    if weights is None:
        return section
    return f"<!-- validation of {weights} -->\n{section}\n<!-- end of validation -->"


def _saved_section(files: RunDir, weights: str | None) -> str | None:
    """The validation part of the report already written, if it evaluated the current best weights.

    A quick report (each epoch end, `report --quick`) on a run whose full report is written keeps
    its confusion matrix and mistakes instead of dropping them; new best weights make it stale."""
    if weights is None or not files.report.is_file():
        return None
    try:
        found = _SECTION.search(files.report.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    return found.group(0) if found and found.group(1) == weights else None


def refresh_after_epoch(run_dir: Path | None, mode: str = "full") -> None:
    """The epoch-end hook (REPORT=full or quick): curves and summary only; a failure is only a warning."""
    _guarded(run_dir, full=False, mode=mode)


def write_final_report(run_dir: Path | None, status: str, mode: str = "full") -> None:
    """The end-of-run hook. After a signal only the quick part: the process has a grace period to exit in."""
    _guarded(run_dir, full=mode == "full" and status != "interrupted", mode=mode)


class ReportCallback:
    """report.html and curves.png kept current during a run (train.training.callbacks): the quick part
    after each epoch, for whoever watches the volume, and the whole report at the end (REPORT)."""

    def __init__(self, mode: str = "full"):
        self.mode, self.run_dir = mode, None

    def on_start(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def on_epoch_end(self, epoch: int, row: dict, state) -> None:
        refresh_after_epoch(self.run_dir, self.mode)

    def on_end(self, status: str, stop) -> None:
        write_final_report(self.run_dir, status, self.mode)


def _guarded(run_dir: Path | None, full: bool, mode: str) -> None:
    try:
        # None: a process that writes no run directory (a worker that is not the chief).
        if mode != "off" and run_dir is not None and is_run_dir(run_dir):
            write_report(run_dir, full=full)
    except Exception as exc:  # noqa: BLE001  a report is never worth a run
        log.warning("WARNING: report.html not updated: %s: %s", type(exc).__name__, exc)


# --- the page ---------------------------------------------------------------------------------


def render(records: RunRecords, curves: bytes, validation: str) -> str:
    m, c = records.manifest, records.config
    status = records.status
    best = records.best_row()
    lead = [
        f"model <b>{escape(c.get('model'))}</b> on <b>{escape(c.get('dataset'))}</b>",
        f"{len(records.rows)} of {escape(records.planned_epochs or '?')} epochs",
    ]
    if best is not None:
        lead.append(
            f"best {escape(records.monitor)} <b>{metric_text(best[records.monitor])}</b> at epoch {best['epoch']:.0f} "
            f"after {duration_text(records.seconds_to(best['epoch']))} of training"
        )
    tested = on_test_text(on_test(m))
    if tested:  # chosen by nothing: the number to quote for the model, apart from the validation one above
        lead.append(f"test {escape(tested)} (best weights, test split evaluated once)")
    if records.resumes:
        lead.append(f"resumed {len(records.resumes)}x")
    error = f'<p class="error">{escape(m["error"])}</p>' if m.get("error") else ""
    if ended_because(m) and not m.get("error"):
        lead.append(f"ended: {escape(ended_because(m))}")
    updated = now_iso()
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(records.name)}: {escape(status)}</title>
<style>{CSS}</style></head><body>
<h1>{escape(records.name)} <span class="status {escape(status)}">{escape(status)}</span></h1>
<p class="lead">{" &middot; ".join(lead)}</p>{error}
<p class="note">report written {updated} from the run directory; curves.png holds the same curves.</p>
<h2>Curves</h2>
{img(curves, "loss, accuracy, learning rate and throughput per epoch")}
<p class="note">{"dashed vertical line: the run was resumed there; " if records.resumes else ""}star: the best {escape(records.monitor)} (the weights in best.weights.h5).</p>
<h2>Validation set, best weights</h2>
{validation}
<h2>Run</h2>
{table(summary_rows(records))}
<h2>Settings</h2>
<details><summary>config.json ({len(c)} settings)</summary>{table([(k.upper(), escape(v)) for k, v in sorted(c.items())])}</details>
<h2>Epochs</h2>
<details open><summary>metrics.csv ({len(records.rows)} rows)</summary>{_metricstable(records)}</details>
</body></html>
"""


def _validation_section(records: RunRecords, missing: list[str], runs_dir: object = None) -> str:
    from .evaluation import evaluate_best

    try:
        ev = evaluate_best(records.run_dir, runs_dir)
    except Exception as exc:  # noqa: BLE001  data moved, weights missing...: the rest of the page still helps
        missing.append(f"validation: {type(exc).__name__}: {exc}")
        return note(f"not available: {type(exc).__name__}: {exc}")
    return validation_html(ev, records)


def measured_differently(ev, records: RunRecords | None) -> str | None:
    """Why this accuracy is not the val_accuracy training logged for the same weights, when it is not.

    Training measures under its precision policy (bfloat16 or float16 on an accelerator); the
    report predicts again in float32, which gives the same on any device. Both are named, so the
    page never shows two numbers for one thing without saying why."""
    best = records.best_row() if records is not None else None
    logged = best.get("val_accuracy") if best else None
    if logged is None or abs(logged - ev.accuracy) < 5e-5:
        return None
    policy = section(records.manifest, "precision").get("policy") or "its precision policy"
    return (
        f"training logged val_accuracy {metric_text(logged)} for these weights (epoch {best['epoch']:.0f}, under {policy}); "
        f"here the same {ev.n} examples are predicted again in float32, hence {ev.accuracy:.4f}"
    )


def validation_html(ev, records: RunRecords | None = None) -> str:
    """Accuracy, the confusion matrix picture, the per-class table and the most-wrong grid."""
    from . import plots

    rows = [
        (
            escape(r["class"]),
            f'<td class="num">{r["examples"]}',
            f'<td class="num">{r["correct"]}',
            f'<td class="num">{"-" if r["accuracy"] is None else format(r["accuracy"], ".2%")}',
            escape(f"{r['confused_with'][0]} ({r['confused_with'][1]}x)") if r["confused_with"] else "-",
        )
        for r in ev.per_class()
    ]
    why = measured_differently(ev, records)
    parts = [
        f'<p class="lead">accuracy <b>{ev.accuracy:.2%}</b> on {ev.n} validation examples</p>',
        *([note(why)] if why else []),
        img(plots.confusion_png(ev.matrix, ev.class_names), "confusion matrix and per-class accuracy"),
        table(rows, ("class", "examples", "correct", "accuracy", "most often taken for")),
    ]
    if len(ev.wrong_images):
        parts += [
            f"<h3>The {len(ev.wrong_images)} most wrong (least probability on the true class)</h3>",
            img(
                plots.grid_png(ev.wrong_images, ev.wrong_true, ev.wrong_pred, ev.wrong_prob, ev.class_names),
                "validation images the model gets most wrong, with true and predicted class",
            ),
        ]
    else:
        parts.append(note("no validation image is misclassified"))
    return "\n".join(parts)


def summary_rows(records: RunRecords) -> list[tuple[str, str]]:
    m = records.manifest
    git, lock, data = section(m, "git"), section(m, "requirements_lock"), section(m, "data")
    build, export, precision = section(m, "build_info"), section(m, "export"), section(m, "precision")
    gpus = [g for g in m.get("gpus") or [] if isinstance(g, dict) and g.get("name")]
    cuda = ", ".join(
        f"{k.replace('_version', '')} {v}" for k, v in build.items() if k in ("cuda_version", "cudnn_version")
    )
    code = f"{git.get('commit') or 'unknown'}{' (uncommitted changes)' if git.get('dirty') else ''}"
    if git.get("source") and git.get("source") != "git":
        code += f" from {git['source']}"
    rows = [
        ("status", records.status + (f": {m['error']}" if m.get("error") else "")),
        ("ended because", m.get("error") or ended_because(m) or "-"),
        ("started / ended", f"{m.get('started_at', '-')} / {m.get('ended_at') or '-'}"),
        ("resumed", ", ".join(m.get("resumed_at") or []) or "never"),
        ("duration", f"{duration_text(m.get('duration_seconds'))} over {len(m.get('segments') or []) or 1} segment(s)"),
        ("training time (every segment, no validation)", duration_text(records.seconds_to(float("inf")))),
        (
            "versions",
            f"Python {m.get('python', '?')}, TensorFlow {m.get('tensorflow', '?')}, Keras {m.get('keras', '?')}"
            + (f"; built for {cuda}" if cuda else ""),
        ),
        (
            "image",
            str(m["image"])
            if m.get("image")
            else "the project's image (no .git inside; commit from BUILD_COMMIT)"
            if "BUILD_COMMIT" in str(git.get("source"))
            else "none: run from a checkout",
        ),
        ("commit", code),
        (
            "lock",
            f"{lock_in_checkout(lock['file']) if lock.get('file') else '?'} sha256 {lock.get('sha256') or 'unknown'}",
        ),
        ("data", data_text(data)),
        ("test split (evaluated once, at the end)", on_test_summary(m) or "-"),
        ("data fingerprint", f"sha256 {data.get('fingerprint', 'unknown')}"),
        *([("data version", data_version_text(version))] if (version := data_version(m)) else []),
        ("precision", f"{precision.get('policy', '?')}: {precision.get('reason', '?')}"),
        ("devices", "; ".join(f"{g['name']} ({g.get('memory_total_mb', '?')} MB)" for g in gpus) or "CPU only"),
        ("cluster", _compact(m["cluster"]) if m.get("cluster") else "one process"),
        ("host", f"{m.get('host', '?')} ({m.get('platform', '?')})"),
        ("seed", f"{m.get('seed', '?')}, deterministic ops: {records.config.get('deterministic')}"),
        (
            "export parity",
            f"max |diff| {export['max_abs_diff']:.2e} (tolerance {export.get('tolerance')})"
            if "max_abs_diff" in export
            else "not exported",
        ),
        *format_rows(export),
    ]
    return [(k, escape(v)) for k, v in rows]


def format_rows(export: dict) -> list[tuple[str, str]]:
    """One row per LiteRT/ONNX file of the export (size, parity, quantised accuracy change), one per failure."""
    rows = []
    for fmt, r in sorted((export.get("formats") or {}).items()):
        text = f"{r['file']}, {r['bytes'] / 1e6:.2f} MB, max |diff| {r['max_abs_diff']:.2e}"
        text += f" (tolerance {r['tolerance']})" if r.get("tolerance") is not None else " (quantised: no tolerance)"
        if "accuracy_change" in r:
            text += (
                f"; validation accuracy {r['accuracy']:.4f} -> {r['accuracy_quantized']:.4f} "
                f"({r['accuracy_change']:+.4f}, {r['validation_images']} images)"
            )
        rows.append((f"export {fmt}", text))
    rows += [("export failed", message) for message in export.get("failed") or []]
    return rows


def ended_because(manifest: dict) -> str | None:
    """Why the latest segment ended (early stopping, all epochs, a stop); a resumed run's older reason is not it."""
    segments = manifest.get("segments")
    if isinstance(segments, list) and segments and isinstance(segments[-1], dict):
        return segments[-1].get("ended_because")
    return manifest.get("ended_because")


def _metricstable(records: RunRecords) -> str:
    if not records.rows:
        return note("no epoch finished yet")
    keys = [k for k in records.rows[0] if any(r.get(k) is not None for r in records.rows)]
    # A metric with the digits of the log and compare; the other columns (seconds, rates) as numbers.
    body = [tuple(f'<td class="num">{_cell(k, r.get(k))}' for k in keys) for r in records.rows]
    return table(body, tuple(keys))


def _cell(key: str, value) -> str:
    return metric_text(value) if is_metric(key) and isinstance(value, (int, float)) else num(value)


def _compact(value) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)
