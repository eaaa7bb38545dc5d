"""`reproduce`: the run's data version fetched from its DVC remote into a folder of its own.

`dvc get REPOSITORY PATH --rev COMMIT -o DEST` reads the tracked path as that commit records it,
from the DVC remote (a local repository's remote settings as its .dvc/config and config.local have
them now, and a local repository's own DVC cache first: content-addressed, it holds that version or
nothing); never the user's workspace, which may hold other data by now. DEST is
DVC_DATA_CACHE/<hash>/<name>, written under a temporary name and renamed
when complete, so a second reproduce of the same version fetches nothing. The fetched data must
have the run's fingerprint; every refusal is one line naming what is missing and the command that fixes it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import DataError, ReproduceError
from . import tool, tracked


class DataVersionError(ReproduceError):
    """The DVC version of a run's data cannot be had (train.dvc): no dvc command, no access to its remote,
    a commit or a version that is not there, or a version that is not the data the run trained on.

    `name` is what is missing or wrong, `value` what the record holds, `fix` the command that mends it."""

    def __init__(self, name: str, value: object, problem: str, fix: str):
        self.name, self.value, self.fix = name, value, fix
        super().__init__(f"{name} {value}: {problem}; {fix}")


_NO_REVISION = ("unknown git revision", "unknown revision", "bad revision")
# The git repository itself cannot be read (moved, deleted, its URL down): checked before the DVC
# remote's words, since a clone that cannot connect says "connection" too.
_NO_REPOSITORY = ("failed to clone repo", "no git repository was found", "is not a git repository")
_NOT_PUSHED = (
    "failed to load directory",
    "no storage files",
    "missing cache",
    "not found",
    "no such file",
    "does not exist",
    "nosuchkey",
)
_NO_ACCESS = ("forbidden", "403", "credentials", "access denied", "could not connect", "invalidaccesskeyid")
_NO_ACCESS += ("signaturedoesnotmatch", "connection", "timed out", "nosuchbucket", "no remote")


def data_version(
    version: dict[str, Any], values: dict[str, Any], settings, fingerprint: Callable[[dict[str, Any]], str], say
) -> tuple[dict[str, Any], str]:
    """(the run's settings with DATASET or DATA_DIR pointing at the fetched copy, its fingerprint)."""
    earlier = bool(version.get("path")) and _dest(version, settings).exists()
    folder = fetch(version, settings, say)
    read = folder / version["read"] if version.get("read") else folder
    changed = dict(values)
    if version.get("setting") == "DATA_DIR":
        changed["data_dir"] = str(read if read.is_dir() else read.parent)
    else:
        kind = str(values.get("dataset", "")).partition(":")[0]
        changed["dataset"] = f"{kind}:{read}"
    try:
        return changed, fingerprint(changed)
    except (ReproduceError, DataError) as exc:
        raise _not_the_run_s(version, folder, exc, earlier) from None


def fetch(version: dict[str, Any], settings, say) -> Path:
    """The recorded version of the tracked path, fetched once into DVC_DATA_CACHE: its folder (or file)."""
    path, commit = version.get("path"), version.get("commit")
    if not path or not commit:
        if path and "commit" in version:  # recorded so: the data's git repository had no commit yet
            raise DataVersionError(
                "data.version",
                {"path": path, "commit": commit},
                "names no commit: the data's git repository had none when the run trained, so no version holds it",
                "put the data the run read back where it read it, then reproduce again",
            )
        raise DataVersionError(
            "data.version",
            {"path": path, "commit": commit},
            "names no path or commit",
            "restore manifest.json from a backup",
        )
    dest = _dest(version, settings)
    place = dest.parent
    if dest.exists():
        say(f"data: {path} at commit {commit[:12]} is already in {place}")
        return dest
    dvc = tool.find(settings.dvc_command)
    if dvc is None:
        raise DataVersionError(
            "dvc",
            settings.dvc_command or "command",
            f"is not installed here, and {path} is not here as recorded",
            tool.INSTALL,
        )
    if why := tool.not_dvc(dvc):
        raise DataVersionError("dvc", dvc, f"is not a working DVC command ({why})", tool.INSTALL)
    repository = _repository(version)
    say(f"data: fetching {path} at commit {commit[:12]} from the DVC remote of {repository} ...")
    try:
        place.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataVersionError(
            "DVC_DATA_CACHE",
            settings.dvc_data_cache,
            f"cannot be written ({exc.strerror or exc}: {exc.filename or place})",
            "set DVC_DATA_CACHE to a folder this user can write, then reproduce again",
        ) from None
    _get(dvc, repository, version, dest)
    return dest


def _get(dvc: str, repository: str, version: dict[str, Any], dest: Path) -> None:
    """`dvc get` into a temporary name beside `dest`, renamed to it when complete."""
    part = dest.parent / f".{dest.name}.part-{os.getpid()}"
    _remove(part)
    try:
        done = tool.run(dvc, "get", repository, version["path"], "--rev", version["commit"], "-o", str(part))
        if done.returncode != 0:
            raise refusal(tool.error_line(done.stderr), version, repository)
        os.replace(part, dest)
    except subprocess.TimeoutExpired:
        # Pasted into a shell as printed: this DVC (venv-dvc.sh's is not on PATH), paths with spaces quoted.
        command = shlex.join([dvc, "get", repository, version["path"], "--rev", version["commit"], "-o", str(dest)])
        raise DataVersionError(
            "dvc get",
            f"{repository} {version['path']} --rev {str(version['commit'])[:12]}",
            f"did not finish within {tool.TIMEOUT} s",
            f"fetch it by hand (no time limit): `{command}`, then reproduce again",
        ) from None
    except OSError:  # another reproduce fetched the same version meanwhile: its copy is as good
        if not dest.exists():
            raise
    finally:
        # A fetch stopped part-way (Ctrl-C, a timeout, a refusal) leaves no partial copy: its name is
        # this process's own, so no later reproduce would reuse or remove it, and a data set is large.
        _remove(part)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _dest(version: dict[str, Any], settings) -> Path:
    """Where the version is fetched to: DVC_DATA_CACHE/<hash>/<name of the tracked path>."""
    return Path(settings.dvc_data_cache).expanduser() / _key(version) / Path(version["path"]).name


def _key(version: dict[str, Any]) -> str:
    """The folder of a version: its hash (a folder's ends in .dir), else its commit."""
    text = str(version.get("hash") or version.get("commit"))
    return "".join(c if c.isalnum() else "-" for c in text.removesuffix(".dir"))[:64]


def _repository(version: dict[str, Any]) -> str:
    """The recorded repository when this machine has it at the recorded commit, else its git remote."""
    here = Path(version.get("repository") or "")
    if version.get("repository") and (here / ".git").exists():
        return str(here)
    # The recorded URL has its credentials masked (***@): git's own credential helper gives them instead.
    return (version.get("git_remote") or str(here)).replace("***@", "")


def refusal(error: str, version: dict[str, Any], repository: str) -> DataVersionError:
    """DVC's error as one line: what is missing or refused, and the command that mends it."""
    said, path, commit = error.lower(), version["path"], str(version["commit"])
    remote = version.get("remote_url") or "the project's default remote"
    if any(word in said for word in _NO_REVISION):
        return DataVersionError(
            "commit",
            commit[:12],
            f"is not in the data's repository {repository} ({error})",
            f"push that commit to it, or `git fetch` it into {repository}",
        )
    if any(word in said for word in _NO_REPOSITORY):
        return _no_repository(error, version, repository)
    if any(word in said for word in _NO_ACCESS):
        return DataVersionError(
            "DVC remote",
            remote,
            f"cannot be reached or refuses the credentials ({error})",
            "set its credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or `dvc remote modify --local "
            f"{version.get('remote') or '<remote>'} ...`) and check that it answers, then reproduce again",
        )
    if any(word in said for word in _NOT_PUSHED) and (folder := _missing_folder_remote(version, repository)):
        name, here = version.get("remote") or "<remote>", Path(repository).is_dir()
        return DataVersionError(
            "DVC remote",
            folder,
            "is a folder that does not exist on this machine (a share not mounted, or moved)",
            "mount it or put it back there"
            + (f", or `dvc remote modify --local {name} url <where it is>` in {repository}" if here else "")
            + ", then reproduce again",
        )
    if any(word in said for word in _NOT_PUSHED):
        return DataVersionError(
            path,
            f"(hash {version.get('hash')})",
            f"is not on the DVC remote {remote}: that version was never pushed ({error})",
            f"on the machine that has it: `git checkout {commit[:12]} && dvc push {shlex.quote(str(version.get('dvc_file') or path))}` in {repository}",
        )
    return DataVersionError(
        "dvc get",
        f"{repository} {path} --rev {commit[:12]}",
        f"failed: {error}",
        "run it by hand with -v to see why, mend that, then reproduce again",
    )


def _missing_folder_remote(version: dict[str, Any], repository: str) -> str | None:
    """The DVC remote's folder when it is a path on this machine that does not exist, else None. DVC
    reports such a remote's files as missing, which read as a version never pushed (and `dvc push`
    into an unmounted share's mount point is no fix)."""
    url = version.get("remote_url") or ""
    if Path(repository).is_dir():  # DVC reads this repository's config as it is now (a relative path: from .dvc/)
        url = tracked.remote(Path(repository), version.get("remote") or "")[1] or url
        url = os.path.normpath(Path(repository) / ".dvc" / url) if url and "://" not in url else url
    if not url or "://" in url or not Path(url).is_absolute() or Path(url).exists():
        return None
    return url


def _no_repository(error: str, version: dict[str, Any], repository: str) -> DataVersionError:
    """The data's git repository cannot be read: the recorded folder is gone (and no URL was recorded),
    or its URL does not answer."""
    recorded, commit = version.get("repository"), str(version["commit"])[:12]
    if repository == recorded:
        fix = f"put a clone of it that has commit {commit} back at {recorded} (the run recorded no origin URL)"
    else:
        fix = f"check that git can read it (`{shlex.join(['git', 'ls-remote', repository])}`), or put a clone of it at {recorded}"
    return DataVersionError(
        "the data's git repository", repository, f"cannot be read ({error})", f"{fix}, then reproduce again"
    )


def _not_the_run_s(version: dict[str, Any], folder: Path, exc: Exception, earlier: bool) -> DataVersionError:
    """The fetched version is not the data the run read: the record's entry names other content, or the
    copy an earlier reproduce fetched was changed since (a file deleted or edited in DVC_DATA_CACHE)."""
    path, source, commit = version["path"], version.get("dvc_file"), str(version["commit"])[:12]
    detail = str(exc).split(": ", 1)[-1][:200]
    if earlier and version.get("workspace") != "differs":
        # Blaming the .dvc file here sent the user through `git log` while every reproduce kept
        # reading the same damaged copy: fetching it anew settles which of the two it is.
        return DataVersionError(
            path,
            f"at commit {commit} (fetched earlier into {folder})",
            f"is not the run's data ({detail}): that copy may have been changed since it was fetched",
            f"delete {folder} and reproduce again to fetch it anew",
        )
    if version.get("workspace") == "differs":
        why = "the run's data differed from its DVC version when it trained (its manifest says so): no version holds it"
    else:
        why = f"{source} at commit {commit} names other content than the run read"
    return DataVersionError(
        path,
        f"at commit {commit} (fetched into {folder})",
        f"is not the run's data: {why} ({detail})",
        f"find the commit whose {source} holds it (`git log -- {shlex.quote(str(source))}`), or point DATASET/DATA_DIR at that data",
    )
