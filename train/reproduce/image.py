"""The container side of `reproduce`: the run's image (reused, or built from its commit) and the rerun in it.

The image is tagged as `invoke build` tags it, `IMAGE:<target>-<lock sha256[:12]>-<commit[:8]>`, so
an image built for the same commit and lock is reused. Paths: the image trains with RUNS_DIR=/runs and
DATA_DIR=/data; a run made in the image recorded those container paths, a run made on the host its
host paths. Both are mapped onto the host folders given (`data_dir`), and mounted read-only where the
rerun only reads.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ReproduceError
from ..run.manifest import CPU_LOCKS, lock_in_checkout
from .worktree import Stop, run_child


@dataclass
class ImageOptions:
    data_dir: Path  # the host folder holding the data (the /data volume of a container-made run)
    target: str = ""  # cpu | gpu; empty: from the run's lock (the CPU lock or the GPU one)
    image: str = "tf-train-template"
    base_image: str = ""
    ca_bundle: str = ""
    network: str = ""
    docker: str = "docker"  # the client; DOCKER in the environment overrides it


def image_tag(manifest: dict[str, Any], options: ImageOptions) -> tuple[str, str]:
    lock = manifest.get("requirements_lock") or {}
    cpu = lock_in_checkout(lock.get("file") or "") in CPU_LOCKS
    target = options.target or ("cpu" if cpu else "gpu")
    commit = (manifest.get("git") or {}).get("commit") or ""
    sha = lock.get("sha256") or ""
    if not commit or not sha:
        raise ReproduceError("the run records no commit or no lock hash: no image can be named for it")
    return f"{options.image}:{target}-{sha[:12]}-{commit[:8]}", target


def have_image(tag: str, options: ImageOptions) -> bool:
    try:
        return subprocess.run([options.docker, "image", "inspect", tag], capture_output=True).returncode == 0
    except FileNotFoundError:
        raise ReproduceError(
            f"{options.docker!r} is not installed: install Docker, or reproduce with --local"
        ) from None


def _target_args(variant: str, context: Path) -> list[str]:
    """The Dockerfile's runtime stage with VARIANT=cpu|gpu; a commit from before that picks the stage by name."""
    dockerfile = context / "Dockerfile"
    if dockerfile.is_file() and not re.search(r"^FROM \S+ AS runtime\s*$", dockerfile.read_text(), re.M | re.I):
        return ["--target", variant]
    return ["--target", "runtime", "--build-arg", f"VARIANT={variant}"]


def build_command(tag: str, target: str, commit: str, context: Path, options: ImageOptions) -> list[str]:
    # The image's own default UID/GID: the rerun runs as the owner of the runs folder anyway.
    cmd = [options.docker, "build", *_target_args(target, context), "--build-arg", f"GIT_COMMIT={commit}"]
    if options.base_image:
        cmd += ["--build-arg", f"BASE_IMAGE={options.base_image}"]
    if options.ca_bundle:
        cmd += ["--secret", f"id=ca_bundle,src={options.ca_bundle}"]
    if options.network:
        cmd += ["--network", options.network]
    return [*cmd, "-t", tag, str(context)]


def build(tag: str, target: str, commit: str, context: Path, options: ImageOptions, stop: Stop | None = None) -> None:
    stop = stop or Stop()
    try:
        returncode = run_child(
            build_command(tag, target, commit, context, options),
            stop,
            context,
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
        )
    except FileNotFoundError:
        raise ReproduceError(
            f"{options.docker!r} is not installed: install Docker, or reproduce with --local"
        ) from None
    stop.check()  # stopped by a signal: Interrupted, not a failed build
    if returncode != 0:
        raise ReproduceError(
            f"building {tag} from commit {commit[:12]} failed (exit {returncode}); see the build output above"
        )


def _host(path: str, runs_parent: Path, data_dir: Path) -> Path:
    """A recorded path on the host: the image's /data and /runs are the folders given."""
    p = Path(path)
    for inside, outside in (("/data", data_dir), ("/runs", runs_parent)):
        if p == Path(inside) or Path(inside) in p.parents:
            return outside / p.relative_to(inside)
    return p


def host_values(config: dict[str, Any], runs_parent: Path, data_dir: Path) -> dict[str, Any]:
    """The recorded settings with their data paths as the host sees them (for the data check)."""
    values = dict(config, data_dir=str(data_dir))
    kind, _, rest = str(values.get("dataset", "")).partition(":")
    if rest and kind in ("npz", "images"):
        values["dataset"] = f"{kind}:{_host(rest, runs_parent, data_dir)}"
    return values


def container_values(host: dict[str, Any], runs_parent: Path, data_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """(settings as the container sees them, `docker run` volume flags)."""
    values = dict(host, runs_dir="/runs", data_dir="/data")
    mounts = ["-v", f"{runs_parent}:/runs", "-v", f"{data_dir}:/data:ro"]
    kind, _, rest = str(values.get("dataset", "")).partition(":")
    if rest and kind in ("npz", "images"):
        path = Path(rest)
        if data_dir == path or data_dir in path.parents:
            values["dataset"] = f"{kind}:/data/{path.relative_to(data_dir)}"
        elif kind == "npz":
            mounts += ["-v", f"{path.parent}:/dataset:ro"]
            values["dataset"] = f"npz:/dataset/{path.name}"
        else:
            mounts += ["-v", f"{path}:/dataset:ro"]
            values["dataset"] = "images:/dataset"
    return values, mounts


def run_command(tag: str, flags: list[str], mounts: list[str], runs_parent: Path, options: ImageOptions) -> list[str]:
    owner = runs_parent.stat()
    # As the owner of the runs folder: the new run directory is theirs, like the original's.
    return [
        options.docker,
        "run",
        "--rm",
        "--network",
        "none",
        "--user",
        f"{owner.st_uid}:{owner.st_gid}",
        *mounts,
        tag,
        "fit",
        *flags,
    ]
