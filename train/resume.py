"""Which run a `fit` writes to, and with which settings: a new run, or one being resumed.

RESUME (or `--resume`) names a run by id or path, `latest`, or `auto` (the newest run if it did
not finish and was started with the same settings). A resumed run keeps its own settings; only
those that do not change the result (config.RESUME_FREE: EPOCHS, RUNS_DIR, ...) come from this
invocation, unless `--force`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .config import RESUME_FREE, Settings, diff_settings, settings_from_dict
from .errors import ResumeMismatchError
from .rundir import create_run_dir, read_json, resolve_run, write_json

log = logging.getLogger("train")


def auto_resume(settings: Settings) -> str:
    """RESUME=auto: the newest run, if it did not finish and was started with these settings."""
    root = Path(settings.runs_dir)
    runs = sorted(p for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []
    if not runs:
        return ""
    newest = runs[-1]
    try:
        status = read_json(newest / "manifest.json").get("status")
        saved = settings_from_dict(read_json(newest / "config.json"))
    except (OSError, ValueError) as exc:
        log.info("RESUME=auto: cannot read run %s (%s); starting a new run", newest.name, exc)
        return ""
    # "running" is what a SIGKILLed or power-cut run leaves behind.
    if status not in ("interrupted", "budget", "running"):
        return ""
    if diff_settings(saved, settings):
        log.info("RESUME=auto: run %s did not finish but its settings differ (%s); starting a new run",
                 newest.name, "; ".join(diff_settings(saved, settings)))
        return ""
    return str(newest)


def prepare_run_dir(settings: Settings, resume: str | None, force: bool) -> tuple[Path, Settings, bool]:
    if resume == "auto":
        resume = auto_resume(settings)
    if not resume:
        run_dir = create_run_dir(settings.runs_dir, settings.run_name)
        write_json(run_dir / "config.json", settings.to_dict())
        return run_dir, settings, False
    run_dir = resolve_run(settings.runs_dir, resume)
    saved = settings_from_dict(read_json(run_dir / "config.json"))
    diffs = diff_settings(saved, settings)
    if diffs and not force:
        raise ResumeMismatchError(
            f"run {run_dir.name} was started with other settings ({'; '.join(diffs)}): "
            "resume with the same settings, or pass --force to continue with the new ones"
        )
    # Settings that do not change the result (EPOCHS, RUNS_DIR, ...) come from this invocation.
    effective = settings if force else settings_from_dict({**saved.to_dict(), **_free(settings)})
    write_json(run_dir / "config.json", effective.to_dict())
    return run_dir, effective, True


def _free(settings: Settings) -> dict[str, Any]:
    return {k: v for k, v in settings.to_dict().items() if k in RESUME_FREE}
