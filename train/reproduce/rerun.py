"""`python -m train reproduce RUN --local`: rerun a run from its own record and say whether it matches.

Order of work: read the record (manifest.json, config.json) and check everything that can be
checked before any training (the commit exists here and the tree was clean, the lock at that commit
has the recorded hash, the data has the recorded fingerprint, the installed versions); then rerun
the recorded settings with that commit's code, from a temporary git worktree (the user's checkout
is never touched), into a new run directory beside the original; then compare the two records
side by side and give a verdict, also written as `reproduce.json` into the new run directory.

The verdict: with DETERMINISTIC=true on the same kind of device and precision, the final weights'
sha256 must be equal (bit-identical); otherwise the final metrics must agree within TOLERANCE.
With `--epochs N` the rerun stops after N epochs and is compared with the original's metrics.csv
row for epoch N (the original's weights at that epoch are not kept once later states replace them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import extras
from ..config import as_flags as settings_flags
from ..config import of_kind
from ..datasets import dataset_missing
from ..errors import ConfigError, DataError, ReproduceError, first_line
from ..locations import found_in
from ..run.files import write_json
from ..run.find import list_run_dirs
from ..run.manifest import lock_in_checkout, section
from ..run.metrics_files import MEASURED_COLUMNS
from ..run.rundir import RunDir
from ..setup.hardware import kernels
from .record import check_comparable, check_record, data_not_here, read_metrics
from .worktree import Stop, _git, clean_stale_worktrees, run_child, stop_on_signals, worktree

# Without determinism a rerun differs in the last bits; these are the agreed bounds for "the same
# result": accuracies within one percentage point, losses within 10 % of the original.
TOLERANCE = {"accuracy": ("absolute", 0.01), "loss": ("relative", 0.10)}
# Settings whose value is where the run lives or how it was started, not what it computes.
NOT_COMPARED = of_kind("surroundings", "label", "invocation")
TIMING_COLUMNS = {"epoch", *MEASURED_COLUMNS}


@dataclass
class Verdict:
    original: str
    rerun: str | None
    match: bool = False
    method: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- reading the record --------------------------------------------------------------------------
def read_record(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, config) of a run; one clear line (exit 9) when either is missing or unreadable."""
    from ..errors import RunRecordError

    try:
        return RunDir(run_dir).read_manifest(), RunDir(run_dir).read_config()
    except RunRecordError as exc:
        raise ReproduceError(f"{exc}: the run cannot be reproduced from it") from None


def check_commit(root: Path, manifest: dict[str, Any], allow_dirty: bool) -> str:
    git = manifest.get("git") or {}
    commit = git.get("commit")
    if not commit:
        raise ReproduceError(
            f"the run records no commit (git source: {git.get('source')!r}): it was made outside a "
            "git checkout or from an image built without GIT_COMMIT; rerun it by hand"
        )
    if git.get("dirty") and not allow_dirty:
        raise ReproduceError(
            f"the run was made from a tree with uncommitted changes on top of {commit[:12]}: its code "
            "is not in any commit; pass --allow-dirty to rerun with the committed code anyway"
        )
    if shutil.which("git") is None or _git(root, "rev-parse", "--git-dir").returncode != 0:
        raise ReproduceError(
            f"{root} is not a git checkout: run reproduce from a clone of the project that "
            f"contains commit {commit[:12]}"
        )
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise ReproduceError(
            f"commit {commit[:12]} is not in this clone ({root}): `git fetch` the branch it is on, "
            "then run reproduce again"
        )
    return commit


def check_lock(root: Path, commit: str, manifest: dict[str, Any]) -> None:
    lock = manifest.get("requirements_lock") or {}
    recorded, name = lock.get("sha256"), lock_in_checkout(lock.get("file") or "")
    shown = _git(root, "show", f"{commit}:{name}")
    if shown.returncode != 0:
        raise ReproduceError(f"commit {commit[:12]} has no {name}: its environment cannot be rebuilt")
    actual = hashlib.sha256(shown.stdout).hexdigest()
    if recorded and actual != recorded:
        raise ReproduceError(
            f"{name} at commit {commit[:12]} has sha256 {actual[:16]}..., the run recorded "
            f"{recorded[:16]}...: the run was not installed from that commit's lock"
        )


def check_model_module(root: Path, commit: str, config: dict[str, Any]) -> None:
    """MODEL=package.module:function must be importable by the rerun, which runs the commit's code with
    PYTHONPATH set to it alone: in the commit, or installed in this environment; else ReproduceError."""
    model = str(config.get("model") or "")
    if ":" not in model:
        return
    top = model.partition(":")[0].split(".")[0]
    listed = _git(root, "ls-tree", "--name-only", commit, top, f"{top}.py")
    if listed.returncode == 0 and listed.stdout.strip():
        return
    from importlib.machinery import PathFinder

    own = {os.path.abspath(p) for p in [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)] if p}
    if PathFinder.find_spec(top, [p for p in sys.path if p and os.path.abspath(p) not in own]) is not None:
        return  # installed in the environment the rerun runs in
    raise ReproduceError(
        f"MODEL={model}: module {top!r} is neither in commit {commit[:12]} nor installed, and the rerun imports "
        "that commit's code alone (PYTHONPATH is not passed on): commit the module to the repository, train "
        "again, and reproduce that run"
    )


_PUT_BACK = "; put the run's data back where it read it (a rerun reads the recorded place)"


def check_data(settings, manifest: dict[str, Any]) -> str:
    """Load the data the way training will and compare its fingerprint with the recorded one."""
    from ..inputs.pipeline import load_data

    recorded = (manifest.get("data") or {}).get("fingerprint")
    spec = load_data(settings)
    if recorded and spec.fingerprint != recorded:
        raise ReproduceError(
            f"the data differs from the run's: {spec.source} has fingerprint {spec.fingerprint}, "
            f"the run recorded {recorded}{_PUT_BACK}"
        )
    return spec.fingerprint


def data_for_rerun(
    values: dict[str, Any], manifest: dict[str, Any], settings, say, in_image: bool = False
) -> tuple[dict[str, Any], str]:
    """(the settings the rerun reads its data with, the data's fingerprint): the recorded data where it
    is, else the run's data version fetched by the DVC extra when the run recorded one (the data
    missing or other data there); without that extra or record, the data's own refusal."""
    from ..config import Settings, settings_from_dict

    def fingerprint(changed: dict[str, Any]) -> str:
        return check_data(settings_from_dict(changed), manifest)

    version = (manifest.get("data") or {}).get("version")
    fetch = extras.part("dvc", "fetch")
    if (missing := _download_instead(values, version)) and fetch is not None and not in_image:
        say(f"data: {missing} is not here: fetching the run's DVC version instead")
        return fetch.data_version(version, values, settings or Settings(), fingerprint, say)
    try:
        return values, fingerprint(values)
    except (ReproduceError, DataError, ConfigError) as exc:
        if isinstance(exc, ConfigError) and not data_not_here(exc):
            raise
        if not isinstance(version, dict) or fetch is None or in_image:
            if isinstance(exc, ConfigError):
                what = dataset_missing(str(exc.value))
                raise ReproduceError(f"the run's data is not here: {what}; put it back where the run read it") from None
            raise
        # What is wrong here, without the fix for a run that has no data version: the fetch is the fix.
        here = dataset_missing(str(exc.value)) if isinstance(exc, ConfigError) else None
        said = f"DATASET={exc.value!r}: {here}" if here else first_line(exc, None).removesuffix(_PUT_BACK)
        say(f"data: {said}: fetching the run's DVC version instead")
    return fetch.data_version(version, values, settings or Settings(), fingerprint, say)


def _download_instead(values: dict[str, Any], version: Any) -> Path | None:
    """DATA_DIR/<name>.npz of a built-in data set whose DATA_DIR the run read as a DVC-tracked folder,
    when that file is not here: loading it would download the data set into the DVC workspace (making
    it differ from its version), where the recorded version is to be fetched instead."""
    from ..datasets import DATASETS

    if not isinstance(version, dict) or version.get("setting") != "DATA_DIR" or values.get("dataset") not in DATASETS:
        return None
    npz = Path(str(values.get("data_dir") or "")).expanduser() / f"{values['dataset']}.npz"
    return None if npz.exists() else npz


def installed_versions() -> dict[str, str | None]:
    def version(*names: str) -> str | None:
        for name in names:
            with contextlib.suppress(metadata.PackageNotFoundError):
                return metadata.version(name)
        return None

    return {
        "tensorflow": version("tensorflow", "tensorflow-cpu"),
        "keras": version("keras"),
        "python": sys.version.split()[0],
    }


def version_warnings(manifest: dict[str, Any], installed: dict[str, str | None]) -> list[str]:
    return [
        f"WARNING: {name} {installed[name]} is installed, the run used {manifest.get(name)}: the rerun may differ"
        for name in ("tensorflow", "keras", "python")
        if manifest.get(name) and installed.get(name) and manifest.get(name) != installed[name]
    ]


# -- rerunning -----------------------------------------------------------------------------------
def _absolute(value: str, base: Path) -> str:
    if value.startswith(("npz:", "images:")):
        kind, _, rest = value.partition(":")
        return f"{kind}:{_absolute(rest, base)}"
    return str((base / value).resolve()) if value and not Path(value).is_absolute() else value


def _with_absolute_paths(config: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative data paths in the record were relative to where the run started: read them from `base`."""
    values = dict(config)
    if values.get("data_dir"):
        values["data_dir"] = _absolute(str(values["data_dir"]), base)
    if ":" in str(values.get("dataset", "")):  # npz:<path> / images:<dir>; a built-in name stays as it is
        values["dataset"] = _absolute(str(values["dataset"]), base)
    return values


def trained_precisions(manifest: dict[str, Any]) -> list:
    """The precisions the run's weights were trained in, in order: its segments' that trained (a resume
    on other devices may have changed it) since the last --restart, else the run's one."""
    segments = [s for s in manifest.get("segments") or [] if isinstance(s, dict)]
    restarts = [i for i, s in enumerate(segments) if s.get("restart")]
    segments = segments[restarts[-1] :] if restarts else segments  # a restart trained from epoch 1 again
    found = [s["precision"] for s in segments if s.get("precision") and s.get("trains", True)]
    return list(dict.fromkeys(found)) or [section(manifest, "precision").get("policy")]


def _precision_text(manifest: dict[str, Any]) -> str | None:
    trained = [p for p in trained_precisions(manifest) if p is not None]
    return ", ".join(map(str, trained)) or None


def pinned_precision(config: dict[str, Any], manifest: dict[str, Any]) -> dict[str, str]:
    """PRECISION=auto's recorded choice on a CPU, for the rerun, where this CPU runs it natively: a new
    figure of the bfloat16 probe (its cache deleted, another one of the same machines) must not make
    the rerun train in another precision. Elsewhere auto decides, and the precision row says so."""
    trained = trained_precisions(manifest)
    policy = trained[0] if len(trained) == 1 else None  # a run trained in several: no rerun trains like it
    if config.get("precision") != "auto" or not isinstance(policy, str) or manifest.get("gpus"):
        return {}
    from ..setup import hardware

    flags, isa = hardware.cpu_flags(), hardware.onednn_max_isa()
    onednn = hardware.onednn_enabled(flags=flags)
    return {"precision": policy} if hardware.runs_natively(policy, [], flags, onednn, isa) else {}


def rerun_flags(config: dict[str, Any], runs_dir: Path, run_name: str, epochs: int | None, base: Path) -> list[str]:
    """The recorded settings as `fit` flags (paths made absolute), a fresh run under `runs_dir`."""
    return as_flags(dict(_with_absolute_paths(config, base), runs_dir=str(runs_dir)), run_name, epochs)


def as_flags(values: dict[str, Any], run_name: str, epochs: int | None) -> list[str]:
    """Settings as `fit` flags for a fresh run (never a resume) named `run_name`.

    A URL recorded masked (***) is left out, at its default: it cannot be given again, and such a
    setting (tracking, a sweep's database) is around training, not part of its result."""
    from ..config import URL_SETTINGS

    values = {k: v for k, v in values.items() if k not in URL_SETTINGS or "***" not in str(v)}
    values = dict(values, run_name=run_name, resume="")
    if epochs:
        values["epochs"] = epochs
    return settings_flags(values)


def _clean_env(code: Path, config: dict[str, Any]) -> dict[str, str]:
    """No setting may leak in from this shell: the record alone decides."""
    names = {k.upper() for k in config}
    env = {k: v for k, v in os.environ.items() if k.upper() not in names}
    env.update(PYTHONPATH=str(code), TF_CPP_MIN_LOG_LEVEL=env.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    return env


def rerun(code: Path, flags: list[str], config: dict[str, Any], runs_dir: Path, stop: Stop) -> Path:
    # `--env-file ''` reads no settings file: the rerun's "to continue it" line gives it again as it is (a
    # file of its own would be gone with the worktree, and that line refused).
    return run_and_find(
        [sys.executable, "-m", "train", "fit", "--env-file", "", *flags],
        runs_dir,
        stop,
        code=code,
        cwd=code,
        env=_clean_env(code, config),
    )


def run_and_find(cmd: list[str], runs_dir: Path, stop: Stop, code: Path | None = None, **kw) -> Path:
    """Run a training command (signals forwarded to it); the run directory it created under `runs_dir`."""
    before = set(list_run_dirs(runs_dir))
    returncode = run_child(cmd, stop, code, **kw)
    new = [p for p in list_run_dirs(runs_dir) if p not in before]  # oldest first
    if stop.signum is not None and returncode == 0:
        # The signal came after the rerun's last step: it completed, as any run does then, so its
        # verdict is due; "keeps its saved state, --resume it" would name a finished run unfinished.
        stop.signum = None
    if stop.signum is not None:
        raise stop.interrupted(new[-1] if new else None)
    if returncode != 0:
        where = f"; see {RunDir(new[-1]).log}" if new else ""
        raise ReproduceError(f"the rerun failed with exit code {returncode}{where}")
    if not new:
        raise ReproduceError(f"the rerun finished but left no run directory under {runs_dir}")
    return new[-1]


# -- comparing -----------------------------------------------------------------------------------
def _device_kinds(orig_m: dict[str, Any], new_m: dict[str, Any]) -> tuple[str, str]:
    """The GPUs by name, or the CPU with the family of kernels oneDNN ran (AMX, AVX2, ...: the last bits
    of a result differ between them, as TensorFlow's determinism holds on the same hardware). A record
    without a family (from before it was recorded) compares as "CPU" on both sides."""
    families = [_cpu_family(orig_m), _cpu_family(new_m)]
    if None in families:
        families = [None, None]
    return _device_kind(orig_m, families[0]), _device_kind(new_m, families[1])


def _cpu_family(manifest: dict[str, Any]) -> str | None:
    cpu = (manifest.get("precision") or {}).get("cpu") or {}
    family = cpu.get("family") if isinstance(cpu, dict) else None
    return kernels(family) if isinstance(family, str) and family else None


def _device_kind(manifest: dict[str, Any], family: str | None) -> str:
    gpus = [g.get("name") for g in manifest.get("gpus") or [] if isinstance(g, dict) and g.get("name")]
    return "GPU: " + ", ".join(sorted(set(gpus))) if gpus else f"CPU ({family})" if family else "CPU"


def _cuda(manifest: dict[str, Any]) -> str | None:
    build = manifest.get("build_info") or {}
    return build.get("cuda_version") if isinstance(build, dict) else None


def _code(manifest: dict[str, Any]) -> str | None:
    """The commit, marked when the run's tree had uncommitted changes (its code is in no commit)."""
    git = manifest.get("git") or {}
    commit = git.get("commit")
    return f"{commit} + uncommitted changes" if commit and git.get("dirty") else commit


def _image(manifest: dict[str, Any]) -> str | None:
    source = (manifest.get("git") or {}).get("source")
    return None if source is None else "none (a git checkout)" if source == "git" else f"an image ({source})"


def side_by_side(orig_m: dict, orig_c: dict, new_m: dict, new_c: dict, base: Path) -> list[dict[str, Any]]:
    def row(what, a, b):
        return {"what": what, "original": a, "rerun": b, "same": a == b}

    orig_c = _with_absolute_paths(orig_c, base)  # the rerun recorded absolute paths

    settings_a = {k: v for k, v in orig_c.items() if k not in NOT_COMPARED and k != "epochs"}
    settings_b = {k: v for k, v in new_c.items() if k not in NOT_COMPARED and k != "epochs"}
    if settings_a.get("precision") == "auto" and [settings_b.get("precision")] == trained_precisions(orig_m):
        settings_b["precision"] = "auto"  # auto's recorded choice, given to the rerun (pinned_precision)
    differ = sorted(k for k in set(settings_a) | set(settings_b) if settings_a.get(k) != settings_b.get(k))
    if (
        (orig_m.get("data") or {}).get("fingerprint") == (new_m.get("data") or {}).get("fingerprint")
        and "dataset" in differ
        and str(settings_a.get("dataset")).split(":")[0] == str(settings_b.get("dataset")).split(":")[0]
    ):
        differ.remove("dataset")  # the same data under another path (host vs container): the fingerprint decides
    return [
        row("code", _code(orig_m), _code(new_m)),
        row(
            "lock",
            (orig_m.get("requirements_lock") or {}).get("sha256"),
            (new_m.get("requirements_lock") or {}).get("sha256"),
        ),
        row("image", _image(orig_m), _image(new_m)),
        row("data", (orig_m.get("data") or {}).get("fingerprint"), (new_m.get("data") or {}).get("fingerprint")),
        {
            "what": "settings",
            "original": "recorded",
            "rerun": "differ: " + ", ".join(differ) if differ else "same",
            "same": not differ,
        },
        row("tensorflow", orig_m.get("tensorflow"), new_m.get("tensorflow")),
        row("keras", orig_m.get("keras"), new_m.get("keras")),
        row("cuda", _cuda(orig_m), _cuda(new_m)),
        row("device", *_device_kinds(orig_m, new_m)),
        row("precision", _precision_text(orig_m), _precision_text(new_m)),
    ]


def _last_common_epoch(orig_m: dict, new_m: dict, orig_c: dict) -> int:
    """The last epoch both the original and the rerun trained: a rerun that is not bit-identical may
    stop early (PATIENCE) at another epoch than the original did."""
    done = [m["epochs_completed"] for m in (orig_m, new_m) if isinstance(m.get("epochs_completed"), int)]
    return min(done) if done else int(orig_c.get("epochs") or 0)


def _metrics_row(run_dir: Path, epoch: int) -> dict[str, float] | None:
    row = read_metrics(RunDir(run_dir).metrics).get(epoch)
    return None if row is None else {k: v for k, v in row.items() if k not in TIMING_COLUMNS}


def within_tolerance(a: dict[str, float], b: dict[str, float]) -> tuple[bool, dict[str, Any]]:
    details, ok = {}, True
    for name in sorted(set(a) & set(b)):
        kind = "loss" if "loss" in name else "accuracy" if "acc" in name else None
        if kind is None:
            continue
        mode, bound = TOLERANCE[kind]
        diff = abs(a[name] - b[name])
        limit = bound if mode == "absolute" else bound * max(abs(a[name]), 1e-12)
        details[name] = {"original": a[name], "rerun": b[name], "difference": diff, "allowed": limit}
        ok &= diff <= limit
    return ok and bool(details), details


def judge(
    verdict: Verdict, orig_dir: Path, orig_m: dict, orig_c: dict, new_dir: Path, new_m: dict, epochs: int | None
) -> Verdict:
    same_kind = all(r["same"] for r in verdict.rows if r["what"] in ("device", "precision"))
    deterministic = bool(orig_c.get("deterministic"))
    full = not epochs or epochs >= int(orig_c.get("epochs") or 0)
    if full and deterministic and same_kind:
        a, b = orig_m.get("final_weights_sha256"), new_m.get("final_weights_sha256")
        verdict.method = "final weights sha256 (DETERMINISTIC=true, same device kind and precision)"
        verdict.match = bool(a) and a == b
        verdict.details = {"original": a, "rerun": b}
        return verdict
    epoch = epochs if not full else _last_common_epoch(orig_m, new_m, orig_c)
    a, b = _metrics_row(orig_dir, epoch), _metrics_row(new_dir, epoch)
    if a is None or b is None:
        where = RunDir(orig_dir if a is None else new_dir).metrics
        raise ReproduceError(f"no metrics row for epoch {epoch} in {where}: nothing to compare the rerun with")
    if deterministic and same_kind:
        verdict.method = (
            f"metrics.csv row of epoch {epoch}, exactly (the original's weights at that epoch are not kept)"
        )
        differ = {k: {"original": a[k], "rerun": b.get(k)} for k in a if b.get(k) != a[k]}
        verdict.match, verdict.details = not differ and bool(a), {"epoch": epoch, "differ": differ}
        return verdict
    why = "DETERMINISTIC=false" if not deterministic else "another device kind or precision"
    verdict.method = f"metrics of epoch {epoch} within tolerance ({why}): accuracies ±0.01, losses ±10%"
    done = (orig_m.get("epochs_completed"), new_m.get("epochs_completed"))
    if full and all(isinstance(d, int) for d in done) and done[0] != done[1]:  # PATIENCE ended them apart
        verdict.method += f"; the original stopped after epoch {done[0]}, the rerun after {done[1]}"
    verdict.match, details = within_tolerance(a, b)
    verdict.details = {"epoch": epoch, "metrics": details}
    return verdict


# -- the command ---------------------------------------------------------------------------------
def reproduce(
    run_dir: Path,
    root: Path,
    allow_dirty: bool = False,
    epochs: int | None = None,
    base: Path | None = None,
    say=print,
    image=None,
    settings=None,
) -> Verdict:
    """Check, rerun and judge (see the module docstring); `root` is the project's git checkout.

    `image` (train.reproduce.image.ImageOptions): rerun in the run's image instead of this environment.
    `settings`: this invocation's (an extra that fetches the data reads its own from them).
    SIGTERM/SIGINT end it with Interrupted, after the rerun has saved its state and the worktree is gone."""
    with stop_on_signals() as stop:
        return _reproduce(run_dir, root, allow_dirty, epochs, base, say, image, stop, settings)


def _reproduce(run_dir: Path, root: Path, allow_dirty, epochs, base, say, image, stop: Stop, settings=None) -> Verdict:
    base = base or Path.cwd()
    run_dir = run_dir.resolve()  # the rerun starts in another folder: every path it gets is absolute
    orig_m, orig_c = read_record(run_dir)
    rows = check_record(run_dir, orig_m, orig_c)  # every file of the record, before anything slow
    from ..run.weights import verify_all

    # The original's weights must be what it wrote.
    verify_all(run_dir, found_in(settings and settings.runs_dir, run_dir))
    _check_epochs(epochs, orig_c)
    check_comparable(run_dir, orig_m, orig_c, epochs, rows)
    verdict = Verdict(run_dir.name, None)
    commit = _check_code(root, orig_m, allow_dirty, verdict, say, stop)
    check_model_module(root, commit, orig_c)
    if image is not None:
        from . import image as ri

        host = ri.host_values(orig_c, run_dir.parent, image.data_dir.resolve())
    else:
        host = _with_absolute_paths(orig_c, base)
    host, fingerprint = data_for_rerun(host, orig_m, settings, say, in_image=image is not None)
    recorded = section(orig_m, "data").get("fingerprint")
    say(f"data: fingerprint {fingerprint} " + ("as recorded" if recorded else "(the run recorded none: not compared)"))
    pinned = pinned_precision(orig_c, orig_m)
    if pinned:
        host = {**host, **pinned}
        say(f"precision: {pinned['precision']}, PRECISION=auto's recorded choice")
    fetched = {k: v for k, v in host.items() if k in ("dataset", "data_dir") and v != orig_c.get(k)}
    name = ("repro-" + re.sub(r"[^\w-]", "_", run_dir.name))[:64]  # RUN_NAME's letters: a renamed `base copy.bak`
    if image is None:
        versions = version_warnings(orig_m, installed_versions())
        verdict.warnings += versions
        for w in versions:
            say(w)
        with worktree(root, commit, stop) as code:
            say(f"rerunning {run_dir.name} with commit {commit[:12]} ...")
            flags = rerun_flags(dict(orig_c, **fetched, **pinned), run_dir.parent, name, epochs, base)
            new_dir = rerun(code, flags, orig_c, run_dir.parent, stop)
    else:
        new_dir = _rerun_in_image(run_dir, orig_m, host, commit, root, name, epochs, image, say, stop)
    stop.check()  # a signal while the worktree was being removed: still no verdict
    new_m, new_c = read_record(new_dir)
    verdict.rerun = new_dir.name
    verdict.rows = side_by_side(orig_m, orig_c, new_m, new_c, base)
    judge(verdict, run_dir, orig_m, orig_c, new_dir, new_m, epochs)
    write_json(RunDir(new_dir).reproduce, verdict.to_dict())
    from ..run.manifest import update_manifest

    update_manifest(
        RunDir(new_dir).manifest,
        reproduces={"run_id": run_dir.name, "path": str(run_dir), "match": verdict.match, "method": verdict.method},
    )
    return verdict


def _check_epochs(epochs: int | None, config: dict[str, Any]) -> None:
    if epochs is not None and epochs < 1:
        raise ReproduceError(f"--epochs {epochs}: give a number of epochs of at least 1")
    if epochs and epochs > int(config.get("epochs") or 0):
        raise ReproduceError(f"--epochs {epochs}: the run has EPOCHS={config.get('epochs')}; give at most that many")
    if epochs and config.get("lr_schedule") == "cosine" and epochs < int(config.get("epochs") or 0):
        raise ReproduceError(
            "--epochs with LR_SCHEDULE=cosine: the schedule spans all EPOCHS, so a shorter rerun "
            "follows another learning rate; reproduce the whole run instead"
        )


def _check_code(root: Path, orig_m: dict, allow_dirty: bool, verdict: Verdict, say, stop: Stop) -> str:
    """The run's commit is here and its lock has the recorded hash; the commit."""
    commit = check_commit(root, orig_m, allow_dirty)
    with stop.cleaning():
        for path in clean_stale_worktrees(root):  # left by a reproduce killed outright
            say(f"removed the worktree of an earlier reproduce that was killed: {path}")
    say(f"code: commit {commit[:12]} is in this clone")
    if (orig_m.get("git") or {}).get("dirty"):
        verdict.warnings.append(
            f"WARNING: the run was made from uncommitted changes on top of {commit[:12]} (--allow-dirty): "
            "the rerun uses the committed code, so a difference may come from those changes"
        )
        say(verdict.warnings[-1])
    check_lock(root, commit, orig_m)
    say("lock: the commit's lock has the recorded sha256")
    return commit


def _rerun_in_image(run_dir, orig_m, host, commit, root, name, epochs, image, say, stop: Stop) -> Path:
    from . import image as ri

    tag, target = ri.image_tag(orig_m, image)
    if ri.have_image(tag, image):
        say(f"image: {tag} (reused)")
    else:
        say(f"image: building {tag} from commit {commit[:12]} ...")
        with worktree(root, commit, stop) as code:
            ri.build(tag, target, commit, code, image, stop)
    values, mounts = ri.container_values(host, run_dir.parent, image.data_dir.resolve())
    say(f"rerunning {run_dir.name} in {tag} ...")
    return run_and_find(
        ri.run_command(tag, as_flags(values, name, epochs), mounts, run_dir.parent, image), run_dir.parent, stop
    )


def format_verdict(v: Verdict) -> str:
    width = max(len(str(r["original"])) for r in v.rows) if v.rows else 10
    lines = [f"{'':<11} {'original (' + v.original + ')':<{max(width, 12)}}  rerun ({v.rerun})"]
    for r in v.rows:
        mark = "" if r["same"] else "   <- differs"
        lines.append(f"{r['what']:<11} {str(r['original']):<{max(width, 12)}}  {r['rerun']}{mark}")
    lines.append(f"result:     {'MATCH' if v.match else 'DIFFERENT'} by {v.method}")
    if not v.match:
        lines.append(f"            {json.dumps(v.details)}")
    # Said before the rerun too, hundreds of its log lines above: a MATCH alone would read as unqualified.
    return "\n".join(lines + v.warnings)
