"""Where the data a run reads lies, and the DVC project around it: cheap file lookups, no dvc command."""

from __future__ import annotations

from pathlib import Path


def data_path(settings) -> tuple[str, Path]:
    """(setting, what the run reads): DATASET's file or folder, else the built-in set's DATA_DIR/<name>.npz or DATA_DIR."""
    kind, _, rest = settings.dataset.partition(":")
    if rest and kind in ("npz", "images"):
        return "DATASET", Path(rest).expanduser().resolve()
    folder = Path(settings.data_dir).resolve()
    npz = folder / f"{settings.dataset}.npz"
    return "DATA_DIR", npz if npz.exists() else folder


def dvc_root(path: Path) -> Path | None:
    """The DVC project `path` is in (the nearest folder above it with a .dvc/ folder), within its git repository."""
    for folder in [path, *path.parents]:
        if (folder / ".dvc").is_dir():
            return folder
        if (folder / ".git").exists():
            return None
    return None
