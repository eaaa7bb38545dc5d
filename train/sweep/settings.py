"""The sweep extra's settings: where a study is kept."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..locations import redact_uri, userinfo
from ..sections import setting

# The databases Optuna's RDB storage can hold a study in (SQLAlchemy URLs, optionally +driver).
SWEEP_SCHEMES = ("sqlite", "postgresql", "mysql")


@dataclass(frozen=True)
class Section:
    """hyperparameter sweeps (`python -m train sweep`; docs/sweeps.md)"""

    sweep_storage: str = setting(
        "",
        "where a sweep keeps its study: a database URL (postgresql://user:password@host/db, mysql://...) shared by "
        "several sweep processes; empty: SQLite at RUNS_DIR/sweeps/<study>.db. The password is masked wherever it is shown",
        url=True,
        kind="invocation",
    )


def check(s) -> None:
    """SWEEP_STORAGE: empty, or a database URL Optuna's storage can open."""
    url = s.sweep_storage
    if not url:
        return
    scheme = url.partition(":")[0].partition("+")[0].lower()
    # A space in an SQLite file's path is the path's (RUNS_DIR/sweeps/<study>.db may hold one), not a typo.
    spaced = scheme != "sqlite" and any(c.isspace() for c in url)
    if scheme not in SWEEP_SCHEMES or "://" not in url or spaced:
        raise ConfigError(
            "SWEEP_STORAGE",
            redact_uri(url),
            ("a URL without spaces (one in a password is written %20), " if spaced else "")
            + "a database URL: postgresql://user:password@host:5432/db (or mysql://..., sqlite:///path.db); "
            "empty keeps the study in RUNS_DIR/sweeps/<study>.db",
        )
    if scheme == "sqlite" and url.partition("://")[2].partition("?")[0] in ("", "/", "/:memory:"):
        raise ConfigError(
            "SWEEP_STORAGE",
            url,
            "an in-memory database: the study would be gone when the sweep ends, and no rerun or other process "
            "would see it; give a file (sqlite:///path.db), or leave it empty for RUNS_DIR/sweeps/<study>.db",
        )
    if scheme != "sqlite" and "@" in userinfo(url):  # the driver reads the host from after the first @
        raise ConfigError(
            "SWEEP_STORAGE",
            redact_uri(url),
            "its user or password holds an @, which the database driver reads as their end: write each @ there as %40",
        )
