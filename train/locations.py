"""Where runs live, as a setting names them: the syntax of a RUNS_DIR that is a store URL, and the
run ids and names a run directory is called by. Plain Python, below the settings: train.config
checks RUNS_DIR and RUN_NAME with it, and train.run builds on it.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
from pathlib import Path

SCHEMES = ("s3", "gs", "az")
# What a value of RUNS_DIR looks like when it means a store: a scheme and "//", or a scheme and
# ":" alone (`s3:bucket/runs`, `s3:/bucket`), which would otherwise become a local folder "s3:".
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(//)?(.*)$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def looks_like_url(text: str) -> bool:
    """Whether RUNS_DIR names a store, or tries to: `scheme://...`, or `s3:`/`gs:`/`az:` without the slashes."""
    m = _URL.match(str(text))
    return bool(m) and (bool(m.group(2)) or m.group(1).lower() in SCHEMES)


def url_problem(text: str) -> str | None:
    """Why `text` is no usable store URL for RUNS_DIR (and how to write it), or None."""
    m = _URL.match(text)
    if not m:
        return "not a URL"
    scheme, slashes, rest = m.group(1).lower(), m.group(2), m.group(3)
    if scheme not in SCHEMES:
        return f"{scheme}:// is no object store this template knows: use s3://, gs:// or az://BUCKET/PREFIX, or a local folder"
    if not slashes:
        return (
            f"write it {scheme}://BUCKET/PREFIX (two slashes): as it is, it would be a local folder named '{scheme}:'"
        )
    authority = rest.split("/", 1)[0]
    if redact_uri(text) != text:
        variables = {
            "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            "gs": "GOOGLE_APPLICATION_CREDENTIALS",
            "az": "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY",
        }[scheme]
        return (
            "a user, key or query in the URL would be a credential in the run's config.json and logs: remove it "
            f"and set {variables} in the environment instead, where the store's client reads them"
        )
    if not authority:
        return f"no bucket: write {scheme}://BUCKET/PREFIX"
    if scheme in ("s3", "gs") and not _BUCKET.match(authority):
        return f"bucket name {authority!r} is not valid: 3 to 63 lower-case letters, digits, '.' or '-'"
    if dots := [p for p in rest.split("/")[1:] if p in (".", "..")]:
        # The prefix is also a path under STORE_CACHE (the staging copy): '..' would leave it.
        return (
            f"{dots[0]!r} in the prefix: the prefix names objects and the staging folder under STORE_CACHE, where "
            f"{dots[0]!r} would point elsewhere; write {scheme}://BUCKET/PREFIX without '.' or '..' parts"
        )
    return None


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# Where a user part ends: the last @, also percent-encoded. A password may hold / ? # (a database
# driver reads up to the last @), so the last one is taken wherever it is: an @ that is in fact in a
# path or query only masks more than needed, never less.
_AT = re.compile(r"@|%40", re.IGNORECASE)


def _split_userinfo(uri: str) -> tuple[str, str, str]:
    """(scheme with its : and //, the user part with its @ or "", the rest) of a URI, by plain string work."""
    m = _SCHEME.match(uri)
    head = m.group(0) if m else ""
    after = uri[len(head) :]
    if after.startswith("//"):
        head, after = head + "//", after[2:]
        if after.startswith("/"):  # scheme:///path (sqlite, file): no host, so no user; an @ is the path's
            return head, "", after
    ats = list(_AT.finditer(after))
    if not ats:
        return head, "", after
    end = ats[-1].end()
    return head, after[:end], after[end:]


def userinfo(uri: str) -> str:
    """What `uri` holds before its last @ (user, password, token): "" when nothing."""
    _head, user, _rest = _split_userinfo(uri)
    return user[:-3] if user.lower().endswith("%40") else user[:-1]


def redact_uri(uri: str) -> str:
    """`uri` with every part that may hold a secret replaced by ***: everything up to the last @
    (also percent-encoded as %40), and the whole query and fragment after it. The one masking of
    every URL-valued setting and of every message that shows one. Plain string work, so a URI that
    does not parse is redacted too."""
    uri = str(uri)
    head, user, rest = _split_userinfo(uri)
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    tail = rest[cut] + "***" if cut < len(rest) else ""
    return f"{head}{'***@' if user else ''}{rest[:cut]}{tail}"


def redact_argv(argv: list[str]) -> list[str]:
    """A command line as a record or a message shows it: each URL in it (`--storage URL`,
    `--sweep-storage=URL`) through `redact_uri`, so a database password given as a flag is in
    neither the manifest's `command` nor an instruction to run the command again."""
    out = []
    for token in map(str, argv):
        flag, eq, value = token.partition("=") if token.startswith("--") else ("", "", token)
        out.append(flag + eq + redact_uri(value) if "://" in value else token)
    return out


# 20261130-061959-483920[-name]: date, time, microseconds. Ids made before the microseconds
# (20261130-061959-a1b2) carry 4 random hex digits instead.
_ID = re.compile(r"^(\d{8}-\d{6})-([0-9a-f]{4}|\d{6})(?:-|$)")


ID_LENGTH = len("20261130-061959-483920-")  # what new_run_id puts before RUN_NAME


def home_problem(path: str) -> str | None:
    """What is wrong with a leading `~` that cannot be expanded here (Path.expanduser's RuntimeError, a
    traceback wherever the path is used), with the fix; None when there is none or it expands.
    `~runs` (the slash left out) names the home folder of a user called runs."""
    if not path.startswith("~"):
        return None
    try:
        Path(path).expanduser()
        return None
    except RuntimeError:
        user, _, rest = path[1:].partition("/")
        if not user:
            return "~ is the home folder, which cannot be found here (HOME is not set): give a full path"
        return (
            f"~{user} is the home folder of a user named {user!r}, unknown here: write ~/{user}"
            f"{'/' + rest if rest else ''} for a folder in your own home, or a full path"
        )


def name_max(directory: Path | str) -> int:
    """The longest file name, in bytes, the file system of `directory` (or of its nearest existing
    parent: RUNS_DIR may not exist yet) allows; 255 where it does not say."""
    path = Path(directory).absolute()
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            try:
                return os.pathconf(candidate, "PC_NAME_MAX")
            except (OSError, ValueError):
                break
    return 255


def run_name_problem(run_name: str, runs_dir: Path | str) -> str | None:
    """Why a run directory named after `run_name` cannot be created in `runs_dir`, or None.

    The limit is on bytes, not characters: a letter outside ASCII takes 2 to 4 bytes in UTF-8, so
    64 characters may already be too long ("File name too long" at mkdir, after the start-up)."""
    size, limit = len(run_name.encode("utf-8", "surrogatepass")), name_max(runs_dir) - ID_LENGTH
    if size <= limit:
        return None
    return (
        f"{size} bytes in UTF-8, more than the {limit} a run directory's name leaves for it (the file system "
        f"of {runs_dir} allows {limit + ID_LENGTH} bytes a name, the run id takes {ID_LENGTH}): shorten it "
        "(each letter outside ASCII takes 2 to 4 bytes)"
    )


def new_run_id(run_name: str = "", now: _dt.datetime | None = None) -> str:
    """Readable, and ordered by creation down to the microsecond: 20261130-061959-483920[-name].

    Two runs started within one second get different ids in the order they were created (a
    random suffix would order them by chance); two in the same microsecond collide on mkdir and
    the later one takes the next id (create_run_dir).
    """
    now = now or _dt.datetime.now()
    rid = now.strftime("%Y%m%d-%H%M%S-%f")
    return f"{rid}-{run_name}" if run_name else rid


def creation_key(path: Path) -> tuple:
    """Sort key: creation order from the id (old 4-hex ids: by second, then name); other names first."""
    m = _ID.match(path.name)
    if not m:
        return ("", -1, path.name)
    micro = int(m.group(2)) if len(m.group(2)) == 6 else -1
    return (m.group(1), micro, path.name)


def found_in(runs_dir: object, run_dir: Path) -> object:
    """Where a command found `run_dir`, for the commands its messages give: RUNS_DIR (`runs_dir`; a store
    by its URL), or the run's own folder when the run was named by a path outside RUNS_DIR."""
    if runs_dir is None or looks_like_url(str(runs_dir)):
        return runs_dir
    try:
        inside = Path(run_dir).parent.resolve() == Path(str(runs_dir)).expanduser().resolve()
    except (OSError, RuntimeError):
        inside = False
    return runs_dir if inside else str(Path(run_dir).parent)


def runs_dir_flag(runs_dir: object) -> str:
    """` --runs-dir DIR` for a command a message gives to paste, quoted for the shell (a folder with a
    space or a `$` in it), or "" for the default ./runs (None: not known); without it the command would look in RUNS_DIR."""
    return "" if runs_dir is None or str(runs_dir) == "./runs" else f" --runs-dir {shlex.quote(str(runs_dir))}"
