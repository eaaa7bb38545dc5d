"""Which DVC entry tracks the data a run reads, and the record of it (the manifest's `data.version`).

A .dvc file and a dvc.lock are YAML, but only a few of their lines are needed here (each `outs:`
entry's path and hash, the stage it belongs to), so they are read as text: the training environment
has no YAML parser, and DVC itself lives in an environment of its own. The dvc command is run only
for the workspace's state, and only when the data is inside a DVC project.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from ..locations import redact_uri
from . import tool
from .place import data_path, dvc_root

_KEY = re.compile(r"^(\s*)(- +)?([^\s:#'\"][^:#]*?|'[^']*'|\"[^\"]*\"):(?:\s+(.*?))?\s*$")
_SECTION = re.compile(r"""^\s*\[\s*['"]?\s*(core|remote\s+"([^"]+)")\s*['"]?\s*\]\s*$""")
_SETTING = re.compile(r"^\s*([\w.-]+)\s*=\s*(.*?)\s*$")


def _scalar(text: str | None) -> str:
    text = (text or "").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def outs(text: str) -> list[tuple[str, dict[str, str]]]:
    """(stage, entry) for each entry of every `outs:` list: a .dvc file's (stage "") or a dvc.lock's.

    An entry is its own scalar keys (path, md5, hash, size, remote ...); nested lists and maps in it
    (a cloud-versioned folder's `files:`) are skipped."""
    found: list[tuple[str, dict[str, str]]] = []
    stage, stages_col, stage_col = "", None, None
    section, entry, entry_col = "", None, -1
    for line in text.splitlines():
        m = _KEY.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        col = len(m.group(1)) + len(m.group(2) or "")
        key, value = _scalar(m.group(3)), _scalar(m.group(4))
        if entry is not None and col > entry_col:
            continue  # inside the entry, nested (a folder's `files:` list)
        if m.group(2):  # `- key: value` starts an item of the list under `section`
            entry = {key: value} if section == "outs" else None
            entry_col = col
            if entry is not None:
                found.append((stage, entry))
        elif entry is not None and col == entry_col:
            entry[key] = value
        else:
            entry = None
            section = key if not value else ""
            if key == "stages" and col == 0 and not value:
                stages_col, stage_col = 0, None
            elif stages_col is not None and col > stages_col and stage_col in (None, col) and not value:
                stage, stage_col = key, col
    return found


def entry_for(path: Path, root: Path) -> tuple[Path, str, dict[str, str]] | None:
    """(the .dvc file or dvc.lock, stage, entry) of the output that is `path` or holds it, or None."""
    chain = [path, *path.parents]
    for above in chain[: chain.index(root) + 1] if root in chain else []:
        candidates = [(above.parent / f"{above.name}.dvc", above.parent), (above / "dvc.lock", above)]
        for source, base in candidates:
            if not source.is_file():
                continue
            for stage, entry in outs(source.read_text(encoding="utf-8", errors="replace")):
                out = (base / entry.get("path", "")).resolve()
                if entry.get("path") and (out == path or out in path.parents):
                    return source, stage, entry
    return None


def remote(root: Path, name: str = "") -> tuple[str, str]:
    """(name, URL) of the DVC remote: `name` or the project's default (.dvc/config, then .dvc/config.local)."""
    default, urls = "", {}
    for file in (root / ".dvc" / "config", root / ".dvc" / "config.local"):
        if not file.is_file():
            continue
        section = None
        for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
            if m := _SECTION.match(line):
                section = m.group(2) or "core"
            elif (m := _SETTING.match(line)) and section:
                if section == "core" and m.group(1) == "remote":
                    default = m.group(2)
                elif section != "core" and m.group(1) == "url":
                    urls[section] = m.group(2)
    chosen = name or default
    return chosen, urls.get(chosen, "")


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def record(settings) -> dict[str, Any] | None:
    """The manifest's `data.version` for the data these settings read, or None when DVC does not track it."""
    setting, read = data_path(settings)
    root = dvc_root(read)
    found = entry_for(read, root) if root is not None else None
    if found is None:
        return None
    source, stage, entry = found
    top = Path(_git(root, "rev-parse", "--show-toplevel") or root).resolve()
    out = (source.parent / entry["path"]).resolve()
    name, url = remote(root, entry.get("remote", ""))
    origin = _git(top, "remote", "get-url", "origin")
    version = {
        "tool": "dvc",
        "repository": str(top),
        "git_remote": safe_origin(origin) if origin else None,
        "commit": _git(top, "rev-parse", "HEAD"),
        "path": out.relative_to(top).as_posix(),
        "read": read.relative_to(out).as_posix() if read != out else "",
        "setting": setting,
        "dvc_file": source.relative_to(top).as_posix(),
        "stage": stage or None,
        "hash": entry.get("md5") or entry.get("etag") or entry.get("checksum") or None,
        "remote": name or None,
        "remote_url": redact_uri(url) if url else None,
        "dvc_file_committed": _git(top, "status", "--porcelain", "--", str(source)) == "",
        **workspace(settings.dvc_command, root, source, stage),
    }
    version["warning"] = warning(version, settings.dvc_command)
    return version


def safe_origin(url: str) -> str:
    """A git remote's URL as recorded: a URL's user and password masked (***@); an scp-like address
    (git@host:org/repo.git) kept whole, since it names a user of the host and never holds a password."""
    return redact_uri(url) if "://" in url else url


def workspace(command: str, root: Path, source: Path, stage: str) -> dict[str, str]:
    """{"workspace": matches | differs | unknown} as `dvc status` sees the entry (and why when unknown)."""
    dvc = tool.find(command)
    if dvc is None:
        why = (
            f"DVC_COMMAND={command} is no file and no command on PATH" if command else f"no dvc command: {tool.INSTALL}"
        )
        return {"workspace": "unknown", "workspace_unknown": why}
    target = f"{(source.parent / 'dvc.yaml').relative_to(root).as_posix()}:{stage}" if stage else str(source)
    try:
        done = tool.run(dvc, "status", "--json", target, cwd=root)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"workspace": "unknown", "workspace_unknown": f"dvc status: {exc}"}
    try:
        state = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None
    except ValueError:  # DVC_COMMAND=/bin/echo: its arguments back, not DVC's JSON
        return {"workspace": "unknown", "workspace_unknown": f"dvc status: {dvc} printed no JSON: is it DVC?"}
    if state is None and done.returncode == 0:
        # DVC prints `{}` when nothing changed: silence is another program (DVC_COMMAND=/bin/true), not "matches".
        return {"workspace": "unknown", "workspace_unknown": f"dvc status: {dvc} printed nothing: is it DVC?"}
    if state is None:
        return {"workspace": "unknown", "workspace_unknown": f"dvc status: {tool.error_line(done.stderr)}"}
    if _changed(state):
        return {"workspace": "differs"}
    if "not in cache" in json.dumps(state):  # DVC compares nothing then: data that differs says only this too
        named = target if stage else source.relative_to(root).as_posix()
        why = f"dvc status: {named}'s version is not in the DVC cache of {root}; `dvc fetch {shlex.quote(str(named))}` there"
        return {"workspace": "unknown", "workspace_unknown": why}
    return {"workspace": "matches"}


def _changed(state: Any) -> bool:
    """Whether `dvc status --json` names a change of the data (modified, deleted, new), not only a missing cache."""
    text = json.dumps(state)
    return any(word in text for word in ('"modified"', '"deleted"', '"new"', '"changed checksum"'))


def warning(version: dict[str, Any], command: str = "") -> str | None:
    """One line when the data the run reads is not the version its commit records (nothing could fetch
    it again), or when the DVC_COMMAND given (`command`) could not say whether it is."""
    path, source, commit = version["path"], version["dvc_file"], str(version.get("commit"))[:12]
    if version.get("workspace") == "differs":
        return (
            f"WARNING: {path} differs from its DVC version ({source}, {str(version.get('hash'))[:12]}...): this run's "
            f"data is in no DVC version and reproduce cannot fetch it; `dvc add {shlex.quote(str(path))}` (or `dvc repro`), commit "
            f"{source}, `dvc push`, then train"
        )
    if not version.get("dvc_file_committed"):
        held = (
            f"commit {commit} does not record"
            if version.get("commit")
            else "the repository has no commit yet to record"
        )
        return (
            f"WARNING: {source} has changes not committed to git: {held} this run's data "
            f"version; commit {source} (and `dvc push`), then train"
        )
    dvc = tool.find(command) if version.get("workspace") == "unknown" else None
    # Silent only where no DVC is found and none was named: an image without DVC still trains. A DVC_COMMAND
    # given is meant, and a DVC found that fails is broken: without this line either shows only in the
    # manifest, until reproduce refuses it.
    if version.get("workspace") == "unknown" and (command or dvc is not None):
        if dvc is not None and tool.not_dvc(dvc) is None:  # DVC itself failed (its config, its lock): not the setting
            fix = f"run `dvc status` in {version['repository']} and fix what it says"
        else:
            fix = "set DVC_COMMAND to a DVC (`dvc --version` answers a version), or leave it empty for .venv-dvc or dvc on PATH"
        return f"WARNING: whether {path} matches its DVC version is unknown ({version.get('workspace_unknown')}): {fix}"
    return None
