"""Several workers, one run: what train.training.fit calls first (`join`), and what the workers share.

`join(settings, stop, epochs)` returns
- None for one process (no TF_CONFIG, WORKERS or SkyPilot cluster): fit trains alone;
- on the chief, the device set-up of the joined cluster; its `group` (a `Group`) is how fit and the
  loop give the other workers what only the chief has;
- on another worker, the Result of its part: it trained along with the chief (train.workers.worker).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
from pathlib import Path

from ..digest import sha256_file
from ..run.manifest import git_info, project_root
from ..run.train_log import setup_logging
from .join import wait_for_workers
from .settings import check_environ, shared

log = logging.getLogger("train")


def join(settings, stop, epochs: int):
    cluster = check_environ(settings, os.environ)
    if cluster is None or not cluster.multi:
        return None
    setup_logging(None, prefix=f"[worker {cluster.index}] ")
    log.warning(cluster.exposure_warning())
    # Before TensorFlow: its own join cannot be interrupted, reports nothing and never gives up.
    git = git_info()  # workers of other code are refused where both know theirs
    wait_for_workers(
        cluster, settings.join_timeout, stop, cluster.source, shared(settings), git.get("commit"), changes(git)
    )
    from ..setup import devices
    from . import worker

    # TensorFlow's join happens here: every worker is up by now.
    setup = devices.setup_devices(settings, cluster, bf16_speedup=chiefs_probe(settings, cluster.is_chief))
    setup.group = Group(setup)
    worker.route_signals_again()
    with setup.group.errors():
        take_the_chiefs_precision(setup)
    if not cluster.is_chief:
        with setup.group.errors():
            return worker.run_worker(settings, setup, stop, epochs)
    return setup


def changes(git: dict, root=None) -> str:
    """The checkout's uncommitted changes to tracked files, as the join compares them: "clean", a short
    hash of each changed file's path and content, or "?" where unknown (an image, whose build context
    may have held some; git failing). Contents, not `git diff`'s text, which each host's git config
    (diff algorithm, prefixes, abbreviated hashes) writes otherwise: the same edits, the same hash."""
    if git.get("dirty") is False:
        return "clean"
    if not git.get("dirty"):
        return "?"
    root = Path(root or project_root())
    try:
        names = subprocess.run(
            ["git", "-C", str(root), "diff", "HEAD", "--name-only", "--no-renames", "-z"],
            capture_output=True,
            timeout=30,
        )
        if names.returncode != 0:
            return "?"
        changed = sorted(filter(None, names.stdout.split(b"\0")))
        if not changed:  # an edit staged, then undone in the files: git status says dirty, the files are HEAD's
            return "clean"
        h = hashlib.sha256()
        for name in changed:
            path = root / os.fsdecode(name)
            h.update(name + b"\0" + (sha256_file(path).encode() if path.is_file() else b"deleted") + b"\0")
    except (OSError, subprocess.SubprocessError):
        return "?"
    return h.hexdigest()[:12]


def chiefs_probe(settings, is_chief: bool):
    """PRECISION=auto's bfloat16 probe, on the chief alone (the others take its choice at the join:
    take_the_chiefs_precision); None on another worker. Cached in RUNS_DIR/.cache as a single
    process's is, but for a bucket RUNS_DIR not opened yet: `python -m train fit` opens it before
    the join, `train.train` only after it."""
    if not is_chief:
        return None
    from ..training import flops

    return flops.bf16_probe(settings.runs_dir)


def take_the_chiefs_precision(setup) -> None:
    """Every worker trains in the chief's precision (a collective: each worker calls it at the join):
    one whose own choice differs, from its CPU's flags or its own PRECISION, takes the chief's before
    any model is built, and its `devices:` line says so."""
    import keras

    from ..setup import hardware
    from .sync import text_from_chief

    chosen = text_from_chief(setup.strategy, setup.precision)
    if chosen != setup.precision:
        # The chief's CPU may run bfloat16 where this worker's oneDNN cap crashes on it: refused here.
        hardware.check_precision_fits_isa(
            chosen, setup.compute_capabilities, hardware.cpu_flags(), hardware.onednn_max_isa()
        )
        keras.mixed_precision.set_global_policy(chosen)
        setup.precision_reason = (
            f"the chief's choice; this worker alone would run {setup.precision} ({setup.precision_reason})"
        )
        setup.precision = chosen


class Group:
    """The workers of one run at its fixed points: each method is a collective that every worker
    calls at the same point, the chief giving and the others receiving (train.workers.sync)."""

    def __init__(self, setup):
        self.setup = setup

    def errors(self) -> contextlib.AbstractContextManager:
        """A collective that fails because another worker is gone: one WorkerLostError line."""
        from .worker import cluster_errors

        return cluster_errors(self.setup)

    def share_name(self, name: str) -> str:
        """The chief's run id, so every worker logs the same one."""
        from .sync import text_from_chief

        with self.errors():
            return text_from_chief(self.setup.strategy, name)

    def send_state(self, spec, state, resumed: bool) -> None:
        """The chief's loop state and data fingerprint; a worker reading other data stops the run."""
        from .worker import send_state

        send_state(self.setup, spec, state, resumed)

    def share_variables(self, variables) -> None:
        """The chief's restored model and optimizer values, on every worker."""
        from .sync import variables_from_chief

        variables_from_chief(self.setup.strategy, variables)

    def wait_for_chief(self) -> None:
        """Every worker waits here until the chief has come this far (its final weights and export)."""
        from .sync import from_chief

        from_chief(self.setup.strategy, [0.0])
