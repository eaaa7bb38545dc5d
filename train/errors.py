"""The package's exceptions: each carries what is wrong and how to fix it.

Only the command-line edge (`train.cli`) turns them into one line and an exit code; library
code raises and never exits. The exit codes are part of the public interface (README, "Exit codes").
"""

from __future__ import annotations

import functools


class TemplateError(Exception):
    """Base class: an expected failure with a one-line message and a documented exit code.

    A subclass declares its exit code on its class line, `class DataError(TemplateError, exit_code=3)`;
    left out, it is the parent's.
    """

    exit_code = 1

    def __init_subclass__(cls, exit_code: int | None = None, **kw):
        super().__init_subclass__(**kw)
        if exit_code is not None:
            cls.exit_code = exit_code


class ConfigError(TemplateError, ValueError, exit_code=2):
    """A setting has a value that is not allowed. Raised before TensorFlow is imported."""

    def __init__(self, name: str, value: object, allowed: str):
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r} is not valid: {allowed}")


class EnvFileError(ConfigError):
    """A settings file (.env) that cannot be read: not UTF-8, or a line that is not NAME=value."""

    def __init__(self, path: object, line: int | None, problem: str):
        self.name, self.value, self.allowed = "ENV_FILE", str(path), problem
        TemplateError.__init__(self, f"{path}{f', line {line}' if line else ''}: {problem}")


class UsageError(TemplateError, exit_code=2):
    """The command line itself is wrong: an unknown or misspelt flag, a missing argument, a refused choice."""

    def __init__(self, command: str, problem: str):
        self.name, self.value = command, problem
        super().__init__(f"{command}: {problem}; `{command} --help` lists what it takes")


class ModelError(TemplateError, exit_code=2):
    """The MODEL factory cannot build a model for the data: it fails to import, raises, has the wrong
    signature, returns something else, or the images are too small for it.

    Found when the model is built, after TensorFlow has loaded; what can be checked earlier (the
    module exists, parses and defines the function) is a ConfigError before TensorFlow.
    """

    def __init__(self, spec: str, problem: str):
        self.name, self.value = "MODEL", spec
        super().__init__(f"MODEL={spec}: {problem}")


class DataError(TemplateError, exit_code=3):
    """The data set is missing, empty, corrupt or of the wrong shape."""


class CheckpointError(TemplateError, exit_code=4):
    """No valid checkpoint to resume from, or a checkpoint that does not fit the model."""


class ResumeMismatchError(CheckpointError):
    """Resuming with settings (or data) that differ from the run's own. `change`: what differs, for a
    caller whose user continues the run some other way than `--force` (a sweep's retried trial)."""

    def __init__(self, message: str, change: str = ""):
        self.change = change
        super().__init__(message)


class RunRecordError(CheckpointError):
    """A run's config.json or manifest.json is missing, truncated or not what it should be."""


class RunBusyError(CheckpointError):
    """Another live process holds the run's lock: two processes never write one run directory."""


class NoWeightsError(CheckpointError):
    """export / predict on a run that never saved weights (it failed or stopped before an epoch ended)."""


class WeightsError(CheckpointError):
    """A weights file (best/final.weights.h5) whose bytes differ from the sha256 recorded when it was
    written, or that does not load (empty, truncated, text): never loaded, the fix names a fallback."""


class DivergedError(TemplateError, exit_code=5):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class OutOfMemoryError(TemplateError, exit_code=6):
    """The accelerator ran out of memory (TensorFlow's ResourceExhaustedError)."""


class StorageError(TemplateError, exit_code=7):
    """The runs directory cannot be written: read-only, missing permissions or disk full."""


class ExportError(TemplateError, exit_code=8):
    """The exported model could not be written, or its predictions differ from the model's."""


class NoGPUError(TemplateError, exit_code=1):
    """`check --require-gpu` found no usable GPU."""


class ReproduceError(TemplateError, exit_code=9):
    """A run cannot be reproduced from its record: missing commit, dirty tree, other lock or data."""


class ReproduceRecordError(ReproduceError):
    """A run's record (manifest.json, config.json, metrics.csv) holds a value reproduce cannot use.

    Found before anything is rerun; names the file, the field, the value and the fix.
    """

    def __init__(self, path: object, field: str, value: object, problem: str, fix: str):
        self.name, self.value = field, value
        super().__init__(f"{path}: {field}={value!r} {problem}; {fix}")


class ReproduceMismatch(TemplateError, exit_code=10):
    """The rerun finished but its result differs from the original's (the verdict says how)."""


class WorkerLostError(TemplateError, exit_code=11):
    """Training with several workers: another worker died, its host was lost or it stopped answering."""


class Interrupted(TemplateError, exit_code=75):
    """SIGTERM/SIGINT or MAX_MINUTES: the run saved a resumable state and stopped early.

    Exit code 75 (EX_TEMPFAIL, "try again later"): `--resume` continues it.
    """


class ModelInterrupted(Interrupted):
    """SIGTERM/SIGINT while the MODEL factory ran: it is stopped at once, before anything was trained."""

    def __init__(self, spec: str, signal_name: str):
        self.name, self.value = "MODEL", spec
        super().__init__(f"MODEL={spec}: stopped while the model was being built ({signal_name}); nothing was trained")


class SecondInterrupt(KeyboardInterrupt):
    """A second Ctrl-C while a run saves after the first: it stops at once, without that save (exit 130).

    A KeyboardInterrupt of its own so the CLI can tell it from a first Ctrl-C of a command with no
    run to save (report, predict, runs, compare), which Python's default also ends."""


class RunNotFound(TemplateError, exit_code=2):
    """The run named on the command line does not exist (a usage error: exit 2)."""


class DeviceSetupError(TemplateError, exit_code=1):
    """A device setting could not be applied (usually: set after the GPU was initialised)."""


class StackError(TemplateError):
    """A TensorFlow version without a row in the GPU check's TESTED table, or a lock file that does
    not match its row (train.gpucheck.stack)."""


class RegisterError(ConfigError):
    """A register() line of the models or data sets that cannot be used (a name another function has,
    an argument the loop cannot use), or a setting's declaration whose checks would not run: found when
    its module is imported, whatever MODEL or DATASET is."""

    def __init__(self, what: str, name: str, problem: str):
        self.name, self.value, self.allowed = what, name, problem
        TemplateError.__init__(self, f"{what} {name!r}: {problem}")


def refuse_second(what: str, name: str, before, new) -> None:
    """RegisterError if `name` is already registered to another function than `new` (a fork's own
    `mnist` or `cnn` would replace the built-in one without a word); the same function again (its
    module imported again) is no second registration."""
    if before is not None and origin(before) != origin(new):
        raise RegisterError(
            what,
            name,
            f"registered twice ({origin(before)[1]} and {origin(new)[1]}): give the new {what} a name of its own, "
            "or remove the other register line",
        )


def origin(fn) -> tuple[str, str]:
    """(module, name) of a registered function, as a "registered twice" line names it: a module reloaded
    (autoreload in a notebook) makes a new function of the same origin. A functools.partial (no
    __qualname__; its repr holds an address) is its function and arguments."""
    if isinstance(fn, functools.partial):
        module, name = origin(fn.func)
        given = [*map(repr, fn.args), *(f"{k}={v!r}" for k, v in fn.keywords.items())]
        return module, f"partial({', '.join([name, *given])})"
    return getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(fn))


def first_line(exc: BaseException | str, limit: int | None = 200) -> str:
    """The first line of an exception's message (or of a text), at most `limit` characters; "" if none.

    Messages of other libraries run to pages (tracebacks of a server, TensorFlow's op context);
    one of our one-line errors quotes only their first line."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else ""


EXIT_CODES = {
    0: "success",
    1: "unexpected error (a bug: rerun with DEBUG=1 for the traceback) / check --require-gpu: no usable GPU / a Python without the packages (run scripts/venv.sh)",
    2: "invalid setting or command line (found before TensorFlow is imported), or a MODEL that cannot be built for the data (found after)",
    3: "data set missing, empty, unreadable, corrupt, too large or of the wrong shape",
    4: "checkpoint or run problem (no valid checkpoint or weights, weights whose sha256 differs from the record, model, settings or data differ, "
    "unreadable config.json/manifest.json, run in use by another process)",
    5: "training diverged (NaN/inf loss); the last good checkpoint is kept",
    6: "accelerator out of memory",
    7: "runs directory not writable, disk full, or the run directory removed while training; RUNS_DIR in object storage "
    "not answering, refusing the credentials, without its bucket, or the newest state not uploaded at the end",
    8: "export failed or the exported model disagrees with the trained one",
    9: "reproduce: the run cannot be reproduced (commit, dirty tree, lock, data or its rerun failed)",
    10: "reproduce: the rerun does not match the original",
    11: "several workers: another worker died, stopped answering or never started (JOIN_TIMEOUT); restart all of them with RESUME=auto",
    75: "interrupted (SIGTERM/SIGINT) or MAX_MINUTES reached: state saved, resume with --resume",
    130: "a second Ctrl-C: stopped at once, without the save; the last saved state is kept / "
    "a Ctrl-C of a command that saves no run (report, predict, runs, compare)",
}
