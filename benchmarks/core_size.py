"""The size of the core, as docs/development.md reports it: lines of `train/` without the extras'
folders, and the `train/` files whose functions run in one command (a default run by default).

    python benchmarks/core_size.py                       # python -m train fit --epochs 1
    python benchmarks/core_size.py fit --epochs 1 --smoke  # any command and flags

The run uses the settings of .env and the environment (point DATA_DIR and RUNS_DIR where it may
write). A file counts when a function or method of it runs, on any thread; module and class bodies,
which every import runs, do not.
"""

from __future__ import annotations

import inspect
import runpy
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "train"


def _lines(paths) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def core_files() -> list[Path]:
    from train import extras

    folders = [PACKAGE.joinpath(*e.package.split(".")[1:]) for e in extras.EXTRAS.values() if e.package]
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not any(f in p.parents for f in folders)]


def main(argv: list[str]) -> None:
    ran: set[str] = set()

    def hook(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(str(PACKAGE)):
            return
        # A function's code is "optimized", a module's or class's body is not; a comprehension or
        # lambda counts when a function runs it, not when a module body does.
        caller = frame.f_back
        if code.co_flags & inspect.CO_OPTIMIZED and (
            not code.co_name.startswith("<") or (caller is not None and caller.f_code.co_flags & inspect.CO_OPTIMIZED)
        ):
            ran.add(code.co_filename)

    sys.path.insert(0, str(ROOT))  # this checkout's train/
    sys.setprofile(hook)
    threading.setprofile(hook)
    sys.argv = ["train", *(argv or ["fit", "--epochs", "1"])]
    try:
        runpy.run_module("train", run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    core = core_files()  # after the run: importing train before it would hide what its imports run
    print(f"core: {len(core)} files, {_lines(core)} lines (train/ without the extras' folders)")
    files = [Path(f) for f in sorted(ran)]
    print(
        f"python -m train {' '.join(sys.argv[1:])} (exit {code}): functions ran in {len(files)} files of train/, {_lines(files)} lines"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
