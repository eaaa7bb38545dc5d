"""The MLflow extra's settings: the tracking server and the experiment, checked before anything runs."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import locations
from ..errors import ConfigError
from ..locations import redact_uri
from ..sections import setting


@dataclass(frozen=True)
class Section:
    """experiment tracking in MLflow (docs/tracking.md)"""

    mlflow_tracking_uri: str = setting(
        "",
        "MLflow tracking server, e.g. http://127.0.0.1:5000: log settings, metrics, tags and files there (empty: off)",
        kind="free",
        url=True,
    )
    mlflow_experiment: str = setting(
        "Default", "MLflow experiment the runs are logged in (created when missing)", kind="free"
    )


# What the mlflow-skinny client in the lock can talk to. Its local stores need more: SQLite and the
# other databases SQLAlchemy (the full `mlflow`), and the file store is refused by MLflow 3.
_TRACKING_SCHEMES = ("http", "https", "databricks")
# Query parameter names that carry a secret (searched in the percent-decoded name, case-insensitive),
# each with the word an error shows: never the name itself, which may be the secret (`?S3cr3t`).
_SECRET_NAMES = {
    "token": "token",
    "key": "key",
    "secret": "secret",
    "passw|pwd": "password",
    "sig": "signature",
    "auth": "auth",
    "cred": "credential",
    "session": "session",
    "jwt": "jwt",
    "bearer": "bearer",
}
_TOKEN_VARIABLE = "MLFLOW_TRACKING_TOKEN"
_USER_VARIABLES = "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"


_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]*\]|[A-Za-z0-9._~%-]*)(:\d*)?$")


def _credential_part(uri: str) -> str:
    """The user part of a tracking URI, or "" when its only @ is in a path (https://host/users/me@org).

    An @ after the first / is a path's when what is before that / is a plain host[:port], as an HTTP
    client reads it; otherwise (https://u:pa/ss@host) the / is in a password, cut by the client."""
    user = locations.userinfo(uri)
    rest = uri.partition("//")[2] if "//" in uri else uri.partition(":")[2]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if user and "@" not in authority and "%40" not in authority.lower() and _HOST_PORT.match(authority):
        return ""
    return user


def _tracking_credential(uri: str) -> str | None:
    """What in `uri` is (or may be) a credential, and where it goes instead; None when nothing is."""
    from urllib.parse import parse_qsl, unquote

    user = _credential_part(uri)
    if user:
        what = "a user and password" if ":" in unquote(user) else "a user name or a token"
        return (
            f"the part before the @ ({what}) is a credential: remove it and set {_USER_VARIABLES} "
            f"(or {_TOKEN_VARIABLE}) in the environment instead, where the MLflow client reads them"
        )
    query = uri.split("#", 1)[0].partition("?")[2]
    fragment = uri.partition("#")[2]
    for text in (query, fragment):
        for name, _value in parse_qsl(text, keep_blank_values=True):
            word = next((w for p, w in _SECRET_NAMES.items() if re.search(p, unquote(name), re.IGNORECASE)), None)
            if word:
                variable = _USER_VARIABLES if word == "password" else _TOKEN_VARIABLE
                return (
                    f"a query parameter named like '{word}' is a credential: remove it and set {variable} "
                    "in the environment instead, where the MLflow client reads it"
                )
    if "?" in uri or "#" in uri:
        return (
            "the MLflow client appends its API paths to the URI, so a query (?...) or fragment (#...) breaks "
            f"every request: remove it (a credential goes in {_TOKEN_VARIABLE} or {_USER_VARIABLES})"
        )
    return None


def check(s) -> None:
    """MLFLOW_TRACKING_URI: a tracking server the client can reach, without credentials in the URI.

    The URI is written to config.json, the manifest and the log, so a credential in it is refused
    (never stripped: a run would then go on without the access the user meant to give it), and no
    error repeats one: every message shows the URI through redact_uri.
    """
    uri = s.mlflow_tracking_uri
    if not uri:
        return
    from urllib.parse import urlsplit

    shown = redact_uri(uri)
    problem = _tracking_credential(uri)
    if problem:
        raise ConfigError("MLFLOW_TRACKING_URI", shown, problem)
    try:
        parts = urlsplit(uri)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed [IPv6 bracket
        parts, host = urlsplit(""), None
    scheme = "databricks" if uri == "databricks" else parts.scheme
    if any(c.isspace() for c in uri) or scheme not in _TRACKING_SCHEMES or (scheme in ("http", "https") and not host):
        raise ConfigError(
            "MLFLOW_TRACKING_URI",
            shown,
            "the URL of an MLflow tracking server (http://host:5000, https://...) or databricks; empty "
            "turns tracking off. For a local store (file:, sqlite:) run a server on it "
            "(`docker compose --profile mlflow`, or `mlflow server`) and give its URL",
        )
    if not s.mlflow_experiment.strip():
        raise ConfigError("MLFLOW_EXPERIMENT", s.mlflow_experiment, "an experiment name, e.g. Default")


# MLflow's own variables for the experiment, read by its fluent API (mlflow.start_run), never by the
# client the runs are logged through: set alone, they would be ignored without a word.
_MLFLOW_OWN = ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")


def check_environ(s, environ) -> None:
    """MLFLOW_EXPERIMENT_NAME / _ID in the environment, with tracking on: the runs would go to
    MLFLOW_EXPERIMENT, not there; refused unless the name is the same one."""
    if not s.mlflow_tracking_uri:
        return
    for name in _MLFLOW_OWN:
        value = environ.get(name, "").strip()
        if value and not (name == "MLFLOW_EXPERIMENT_NAME" and value == s.mlflow_experiment):
            instead = (
                f"MLFLOW_EXPERIMENT={value}" if name == "MLFLOW_EXPERIMENT_NAME" else "MLFLOW_EXPERIMENT to its name"
            )
            raise ConfigError(
                name,
                value,
                f"MLflow's own variable, which this template does not read (the runs would go to the experiment "
                f"{s.mlflow_experiment!r} of MLFLOW_EXPERIMENT): set {instead}, and unset {name}",
            )


def saved(values: dict) -> None:
    """A URI with a credential, saved by a version that accepted one: where tracking goes is free on
    resume (the current MLFLOW_TRACKING_URI is used), so it must not make the run unreadable."""
    if _tracking_credential(str(values.get("mlflow_tracking_uri") or "")):
        values["mlflow_tracking_uri"] = ""


def turned_on(s) -> str:
    """The setting that asks for this extra in a training run ("" when none does)."""
    return "MLFLOW_TRACKING_URI" if s.mlflow_tracking_uri else ""


def callback(s):
    """The loop callback that logs the run in MLflow (made only when tracking is on)."""
    from .mlflow_run import MlflowCallback

    return MlflowCallback(s)
