"""The package's exceptions: each carries what is wrong and how to fix it.

Only the command-line edge (`train.cli`) turns them into one line and an exit code; library
code raises and never exits. The exit codes are part of the public interface (README, "Exit codes").
"""

from __future__ import annotations


class TemplateError(Exception):
    """Base class: an expected failure with a one-line message and a documented exit code."""

    exit_code = 1
    kind = "error"


class ConfigError(TemplateError, ValueError):
    """A setting has a value that is not allowed. Raised before TensorFlow is imported."""

    exit_code = 2
    kind = "config"

    def __init__(self, name: str, value: object, allowed: str):
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r} is not valid: {allowed}")


class DataError(TemplateError):
    """The data set is missing, empty, corrupt or of the wrong shape."""

    exit_code = 3
    kind = "data"


class CheckpointError(TemplateError):
    """No valid checkpoint to resume from, or a checkpoint that does not fit the model."""

    exit_code = 4
    kind = "checkpoint"


class ResumeMismatchError(CheckpointError):
    """Resuming with settings that differ from the run's own."""

    kind = "resume"


class DivergedError(TemplateError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""

    exit_code = 5
    kind = "diverged"


class OutOfMemoryError(TemplateError):
    """The accelerator ran out of memory (TensorFlow's ResourceExhaustedError)."""

    exit_code = 6
    kind = "oom"


class StorageError(TemplateError):
    """The runs directory cannot be written: read-only, missing permissions or disk full."""

    exit_code = 7
    kind = "storage"


class ExportError(TemplateError):
    """The exported model could not be written, or its predictions differ from the model's."""

    exit_code = 8
    kind = "export"


class NoGPUError(TemplateError):
    """`check --require-gpu` found no usable GPU."""

    exit_code = 1
    kind = "gpu"


class Interrupted(TemplateError):
    """SIGTERM/SIGINT or MAX_MINUTES: the run saved a resumable state and stopped early.

    Exit code 75 (EX_TEMPFAIL, "try again later"): `--resume` continues it.
    """

    exit_code = 75
    kind = "interrupted"


EXIT_CODES = {
    0: "success",
    1: "unexpected error (a bug: rerun with DEBUG=1 for the traceback) / check --require-gpu: no usable GPU",
    2: "invalid setting or command line (before TensorFlow is imported)",
    3: "data set missing, empty, corrupt or of the wrong shape",
    4: "checkpoint or resume problem (no valid checkpoint, model or settings differ)",
    5: "training diverged (NaN/inf loss); the last good checkpoint is kept",
    6: "accelerator out of memory",
    7: "runs directory not writable or disk full",
    8: "export failed or the exported model disagrees with the trained one",
    75: "interrupted (SIGTERM/SIGINT) or MAX_MINUTES reached: state saved, resume with --resume",
}
