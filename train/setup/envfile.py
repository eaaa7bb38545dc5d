"""Reading the settings file (`.env`): its values, and a line number for everything wrong in it.

python-dotenv alone skips a line it cannot parse with a warning that names neither the file nor
the key, reads nothing at all from a file that is not UTF-8 (a traceback), and cannot know which
keys are settings. Here a line that is not `NAME=value` or bytes that are not UTF-8 are an
EnvFileError naming the file and the line; a key that is not a setting, or a key given twice, is a
warning (the file is shared with docker compose, whose own variables are known and left alone).
"""

from __future__ import annotations

import difflib
import errno
import io
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ..errors import EnvFileError
from ..locations import looks_like_url, redact_uri

# Read from .env by docker-compose.yml and tasks.py, not by `python -m train` (a test keeps this
# list in step with docker-compose.yml), and prefixes of other tools' variables.
OTHER_TOOLS = {
    "HOST_UID",
    "HOST_GID",
    "IMAGE",
    "CA_BUNDLE",
    "BASE_IMAGE",
    "GIT_COMMIT",
    "RUNS_HOST_DIR",
    "DATA_HOST_DIR",
    "TRAIN_ARGS",
    "TENSORBOARD_PORT",
    "MLFLOW_IMAGE",
    "MLFLOW_PORT",
    "SERVE_PORT",  # compose's `serve` profile: the published port and the command's arguments
    "SERVE_ARGS",
    "SWEEP_SPACE",  # compose's `sweep` profile: the space file, the study database's password and image
    "SWEEP_DB_PASSWORD",
    "POSTGRES_IMAGE",
}
OTHER_PREFIXES = ("COMPOSE_", "DOCKER_", "BUILDKIT_", "TF_", "CUDA_", "NVIDIA_", "XLA_", "NCCL_", "PYTHON")


def read_env_file(
    path: str | os.PathLike, settings: Iterable[str], warn: Callable[[str], None] | None = None
) -> dict[str, str]:
    """The file's NAME -> value (interpolated as python-dotenv does); EnvFileError on a bad line.

    `settings`: the UPPER_CASE setting names, for the warnings about unknown keys (`warn(line)`).
    """
    from dotenv import dotenv_values
    from dotenv.parser import parse_stream

    path = Path(path)
    text = _read_text(path)
    names = set(settings)
    seen: dict[str, int] = {}
    for binding in parse_stream(io.StringIO(text)):
        raw = binding.original.string
        original = raw.strip()
        # python-dotenv counts from the blank lines before a statement; the statement is below them.
        line = binding.original.line + raw[: len(raw) - len(raw.lstrip())].count("\n")
        if binding.error:
            raise EnvFileError(
                path, line, f"cannot read {_short(original)}: write NAME=value, one per line, with any quotes closed"
            )
        key = binding.key
        if key is None:  # a comment or an empty line
            continue
        if binding.value is None:
            raise EnvFileError(path, line, f"{key!r} has no '=': write {key}=value")
        if warn is not None:
            if key in seen:
                warn(f"WARNING: {path}, line {line}: {key} is set again (first on line {seen[key]}); line {line} wins")
            elif key not in names and key not in OTHER_TOOLS and not key.startswith(OTHER_PREFIXES):
                warn(f"WARNING: {path}, line {line}: {_key(key)} is not a setting and is ignored{_suggest(key, names)}")
            if key in names and "$" in binding.value:
                for problem in _variables(binding.value, seen):
                    warn(f"WARNING: {path}, line {line}: {key} {problem}")
        seen.setdefault(key, line)
    # The checks above leave only lines python-dotenv reads without a warning: it does the values.
    return {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}


_BRACED = re.compile(r"\$\{([^}:]*)(:-[^}]*)?\}")  # what python-dotenv expands, as its own pattern reads it
_BARE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def _variables(value: str, above: Mapping[str, int]) -> list[str]:
    """What a value's variables do that its writer likely did not mean, as the ends of warning lines:
    a ${NAME} set neither in the environment nor above in the file reads as empty (RUNS_DIR=${NOPE}/runs
    is /runs), and a $NAME without braces, when NAME is set, stays as written (RUNS_DIR=$HOME/runs is a
    folder named $HOME; not looked for in a URL). Only the names are shown, never the value."""
    out = []
    for m in _BRACED.finditer(value):
        if m.group(2) is None and m.group(1) not in os.environ and m.group(1) not in above:
            out.append(
                f"uses ${{{m.group(1)}}}, which is not set (in the environment or above in the file), so it "
                f"reads as empty there: set {m.group(1)}, or write the value out"
            )
    # Not in a URL: a $ there is likely a password's, and a warning would tell what follows it. A
    # braced variable becomes a space, which ends a name: `$A${B}C` holds $A, not $AC.
    for m in () if looks_like_url(value) else _BARE.finditer(_BRACED.sub(" ", value)):
        if m.group(1) in os.environ or m.group(1) in above:
            out.append(
                f"holds ${m.group(1)} as written (a settings file expands ${{{m.group(1)}}} only): "
                f"write ${{{m.group(1)}}} to use its value"
            )
    return out


# A settings file is a few lines of NAME=value: a larger one is another file, named by mistake.
MAX_BYTES = 1 << 20
_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _read_text(path: Path) -> str:
    if _is_devnull(path):  # the usual way to say "no settings file": reads as empty, never blocks
        return ""
    try:
        _check_kind(path, os.stat(path).st_mode)  # a socket cannot even be opened: say what it is
    except OSError:
        pass  # opening it says what is wrong
    try:
        # Non-blocking, and checked again on the open file: a named pipe would block the open and the read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP) and path.is_symlink():  # a link to nothing, or to itself
            raise EnvFileError(
                path,
                None,
                f"is a broken link (to {os.readlink(path)}: {exc.strerror}): point it at the file, or remove it",
            ) from None
        raise EnvFileError(path, None, f"cannot be read ({exc.strerror}); check its permissions") from None
    try:
        _check_kind(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(MAX_BYTES + 1)  # a buffered read of n bytes stops only at n or at the end
    except OSError as exc:
        raise EnvFileError(path, None, f"cannot be read ({exc.strerror}); check its permissions") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise EnvFileError(
            path,
            None,
            f"is larger than {MAX_BYTES >> 20} MiB, too large for a settings file of NAME=value lines: "
            "is it the right file?",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise EnvFileError(
            path, line, f"byte 0x{raw[exc.start]:02x} is not UTF-8 text; save the file as UTF-8"
        ) from None


def _is_devnull(path: Path) -> bool:
    try:
        return os.path.samefile(path, os.devnull)
    except OSError:
        return False


def _check_kind(path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise EnvFileError(path, None, _DIRECTORY)
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "a special file")
        raise EnvFileError(
            path,
            None,
            f"is {kind}, not a regular file (reading it could block or never end): make it a file of "
            "NAME=value lines, or pass --env-file '' (or /dev/null) to read no settings file",
        )


_DIRECTORY = (
    "is a directory, not a file (docker creates one when it mounts a file "
    "that does not exist): remove it, or create the file from .env.example"
)


def _key(key: str) -> str:
    """A key as a warning shows it: escaped, and the character named, when it holds one that is not
    printable ASCII (a byte-order mark where two files were joined, a zero-width space pasted from a
    page), else `\ufeffEPOCHS is not a setting (did you mean EPOCHS?)` reads as EPOCHS twice."""
    odd = [ch for ch in key if not (ch.isascii() and ch.isprintable())]
    if not odd:
        return key
    return f"{ascii(key)} (with U+{ord(odd[0]):04X}, an invisible or non-ASCII character: type the name again)"


def _suggest(key: str, names: set[str]) -> str:
    close = difflib.get_close_matches(key.upper(), sorted(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else " (the settings: python -m train settings)"


def _short(text: str) -> str:
    """A line of the file as an error shows it: its value masked as a URL is (a database password in a
    line that does not parse must not be printed), and cut to 40 characters."""
    name, sep, value = text.partition("=")
    text = f"{name}={redact_uri(value)}" if sep else redact_uri(text)
    return repr(text if len(text) <= 40 else text[:37] + "...")
