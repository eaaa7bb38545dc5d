"""One typed settings object: defaults < .env < environment < command-line flags.

Everything here is plain Python: no TensorFlow import, so a bad value is rejected in milliseconds
(exit code 2 at the CLI edge). Every field is documented by its `doc` metadata; `.env.example`
and the README table are generated from the same list (`python -m train settings`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import math
import numbers
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from . import datasets, extras, locations, models
from .errors import ConfigError, EnvFileError, RegisterError, StorageError
from .locations import redact_uri
from .sections import KINDS, RULES
from .sections import setting as _f
from .setup.envfile import read_env_file
from .setup.modelspec import check_model_spec

log = logging.getLogger("train")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class CoreSettings:
    """The core's settings: what every training run has, with or without the extras."""

    # --- data ---
    dataset: str = _f(
        "mnist", " | ".join(datasets.DATASETS) + " | npz:<file> | images:<dir> (one sub-directory per class)"
    )
    data_dir: str = _f(
        "./data", "where built-in data sets are read from (<name>.npz) and downloads are cached", kind="surroundings"
    )
    image_size: int = _f(64, "images:<dir> only: images are resized to IMAGE_SIZE x IMAGE_SIZE", min=8, max=4096)
    channels: int = _f(3, "images:<dir> only: 1 (grayscale) or 3 (RGB)", choices=(1, 3))
    val_split: float = _f(
        0.1,
        "fraction of the training data held out for validation (seeded, per class; 0.1 keeps 90% to train on and "
        "validates on as many examples as a typical test split, e.g. 5,999 of MNIST's 60,000: 10% of each digit, rounded); 0 = no validation",
        min=0.0,
        max=0.9,
    )
    val_from: str = _f(
        "train",
        "train: validation is VAL_SPLIT of the training data, and a data set's test split is evaluated once, at "
        "the end | test: validation is the test split (how runs recorded before the split trained; kept to resume them)",
        choices=("train", "test"),
        recorded_before="test",
    )
    max_image_pixels: int = _f(
        50_000_000,
        "images:<dir> only: refuse an image whose header declares more pixels (width x height) than this, before decoding it",
        min=1,
        kind="free",
    )
    cache: str = _f(
        "memory",
        "images:<dir> only: memory | file (RUNS_DIR/.cache, shared by runs) | none: cache decoded examples (the same batches either way)",
        choices=("memory", "file", "none"),
        kind="free",
    )
    shuffle_buffer: int = _f(0, "shuffle buffer size; 0 = the whole training set (a true shuffle)", min=0)
    smoke: bool = _f(
        False,
        "smoke test: 512 training / 256 validation (/ 256 test) examples, 1 epoch, to check the whole path in seconds",
    )
    # --- model and optimisation ---
    model: str = _f("cnn", models.describe())
    epochs: int = _f(3, "number of epochs", min=1, max=100000, kind="free")
    batch_size: int = _f(
        512,
        "global batch size (split across GPUs when more than one is visible); with LEARNING_RATE unset too, "
        "a new run on a CPU training in float32 takes 256 (manifest.json's batch says why)",
        min=1,
        max=1 << 20,
    )
    learning_rate: float = _f(
        7e-3,
        "Adam learning rate (the peak, under a schedule); with BATCH_SIZE unset too, 0.008 where the batch is 256",
        min=1e-8,
        max=10.0,
    )
    lr_schedule: str = _f("cosine", "constant | cosine (decays to 0 over all EPOCHS)", choices=("constant", "cosine"))
    lr_warmup_epochs: float = _f(
        0.3,
        "epochs over which the learning rate rises linearly from a tenth of LEARNING_RATE to it; 0 = none",
        min=0.0,
        max=100000.0,
        recorded_before=0.0,
    )
    seed: int = _f(42, "seed for weights, data split and shuffle order", min=0, max=2**31 - 1)
    deterministic: bool = _f(
        False, "enable TensorFlow op determinism: bit-identical results on one machine, a little slower"
    )
    # --- devices ---
    precision: str = _f(
        "auto",
        "auto | float32 | mixed_float16 | mixed_bfloat16 (auto picks from the hardware)",
        choices=("auto", "float32", "mixed_float16", "mixed_bfloat16"),
    )
    memory_growth: bool = _f(True, "let GPU memory grow as needed instead of taking it all at start", kind="free")
    jit_compile: bool = _f(False, "compile the train step with XLA")
    peak_flops: str = _f(
        "auto",
        "the MFU's peak FLOP/s per device: auto (a known GPU's datasheet, else measured once per machine, precision "
        "and TensorFlow version, cached in RUNS_DIR/.cache) | measure (again now, and cache it) | a number, e.g. 2.5e11",
        kind="surroundings",
    )
    steps_per_execution: int = _f(
        8,
        "train steps run per call into TensorFlow (fewer Python round trips; the weights are the same)",
        min=1,
        max=10000,
        kind="free",
    )
    # --- run directory, checkpoints, stopping ---
    runs_dir: str = _f(
        "./runs",
        "where run directories are created (the mounted volume in the container), or s3://BUCKET/PREFIX (docs/storage.md)",
        kind="surroundings",
        url=True,
    )
    run_name: str = _f("", "optional label appended to the run id (letters, digits, - and _)", kind="label")
    resume: str = _f(
        "",
        "continue a run: its id or path, latest, or auto (the newest run if it did not finish and its settings match, else a new run); empty: a new run",
        kind="invocation",
    )
    checkpoint_every: int = _f(
        200, "also save a resumable checkpoint every N steps (0: epoch ends only)", min=0, kind="free"
    )
    keep_checkpoints: int = _f(
        3, "how many resumable checkpoints to keep (older ones are deleted)", min=1, max=1000, kind="free"
    )
    monitor: str = _f(
        "val_accuracy",
        "metric that decides the best weights: val_accuracy, val_loss, accuracy or loss "
        "(or val_<name>/<name> of a metric the model adds)",
    )
    monitor_mode: str = _f(
        "auto", "auto | max | min: whether a larger MONITOR is better", choices=("auto", "max", "min")
    )
    patience: int = _f(
        0,
        "early stopping: end the run after this many epochs without an improvement of MONITOR by more than MIN_DELTA (0: off)",
        min=0,
        max=100000,
        kind="free",
    )
    min_delta: float = _f(
        0.0, "early stopping: the smallest change of MONITOR that counts as an improvement", min=0.0, kind="free"
    )
    max_minutes: float = _f(
        0.0, "time budget: save and stop cleanly after this many minutes (0: no limit)", min=0.0, kind="surroundings"
    )
    auto_batch: bool = _f(
        False,
        "on GPU out-of-memory, halve BATCH_SIZE and continue from the last checkpoint (at most 3 times)",
        kind="free",
    )
    export: bool = _f(True, "export SavedModel + .keras + labels at the end of training", kind="surroundings")
    report: str = _f(
        "full",
        "report.html: full (at the end also the validation set: confusion matrix, most wrong images) | quick (curves and summary only) | off",
        choices=("full", "quick", "off"),
        kind="free",
    )
    progress: str = _f(
        "auto",
        "auto | bar | line: Keras progress bar on a terminal, one line per epoch otherwise",
        choices=("auto", "bar", "line"),
        kind="invocation",
    )
    debug: bool = _f(False, "show Python tracebacks for expected errors", kind="invocation")
    # --- profiling (train.training.profiling; docs/performance.md) ---
    profile: str = _f(
        "off",
        "off | steps: write a TensorFlow profile of the training steps PROFILE_STEPS into RUN/tensorboard "
        "(TensorBoard's Profile tab; only the chief profiles); it does not change what is trained",
        choices=("off", "steps"),
        kind="invocation",
    )
    profile_steps: str = _f(
        "10:15",
        "PROFILE=steps: START:STOP, the steps profiled, counted from this process's first step (0); the first "
        "ones trace and compile the step, so START is past them",
        kind="invocation",
    )

    def __post_init__(self) -> None:
        # A leading ~ is the home folder wherever the value comes from, as a shell would make it: a .env
        # file's RUNS_DIR=~/runs is read by no shell, and was a folder named ~ in the working directory.
        for name in ("runs_dir", "data_dir"):
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("~") and not locations.home_problem(value):
                object.__setattr__(self, name, str(Path(value).expanduser()))

    def to_dict(self) -> dict[str, Any]:
        # A secret in a URL (a database password) never reaches config.json, the manifest, a tracker or
        # the console. A local RUNS_DIR is a path, not a URL: an @ in a folder's name stays.
        values = dataclasses.asdict(self)
        for name in URL_SETTINGS:
            if locations.looks_like_url(values[name]):
                values[name] = redact_uri(values[name])
        return values

    def replace(self, **changes: Any) -> Settings:
        own = {f.name: f for f in fields(self)}
        changes = {k: v if isinstance(v, str) or k not in own else _typed(own[k], v) for k, v in changes.items()}
        return _with_given(validate(dataclasses.replace(self, **changes)), given(self) | set(changes))


def _join_sections() -> type:
    """Settings: the core's fields, then each installed extra's section (train.extras), in one frozen class.

    One class and flat attributes, so `settings.serve_max_batch` and SERVE_MAX_BATCH read the same
    wherever the field is declared, and a fork that deletes an extra loses its settings with it."""
    bases = tuple(section.Section for section in reversed(extras.sections()))
    joined = type("Settings", (*bases, CoreSettings), {"__doc__": _SETTINGS_DOC, "__module__": __name__})
    return dataclass(frozen=True)(joined)


def _check_declarations(settings: type) -> None:
    """RegisterError naming the first field declared so that its checks would not run: a plain field
    (no help, no kind), a misspelt rule (`minimum=`: a bound never checked) or an unknown kind."""
    for f in fields(settings):
        meta = f.metadata
        if "doc" not in meta or "kind" not in meta:
            problem = "a plain field has no help and no kind: declare it with _f(default, doc, ...)"
        elif unknown := [key for key in meta if key not in ("doc", "kind", *RULES)]:
            near = difflib.get_close_matches(unknown[0], RULES, 1)
            hint = f" (did you mean {near[0]}=?)" if near else ""
            problem = f"_f() has no {unknown[0]}={hint}; its rules are " + ", ".join(f"{r}=" for r in RULES)
        elif meta["kind"] not in KINDS:
            problem = f"kind={meta['kind']!r} is not a kind: one of {', '.join(KINDS)}"
        else:
            continue
        raise RegisterError("setting", f.name, f"{problem} (docs/extending.md)")


_SETTINGS_DOC = "The resolved configuration of one run. Field names map to UPPER_CASE variables."
Settings = _join_sections()
_check_declarations(Settings)

# The settings whose value is a URL, which may carry a credential (`url=True` on the field): every
# message and every dump shows them through redact_uri.
URL_SETTINGS = frozenset(f.name for f in fields(Settings) if f.metadata.get("url"))


def _masked(error: ConfigError) -> ConfigError:
    """`error` again, with a URL-valued setting's value masked in it, wherever its text repeats the value."""
    if error.name.lower() not in URL_SETTINGS or not isinstance(error.value, str) or not error.value:
        return error
    raw, masked = error.value, redact_uri(error.value)
    hidden = [s for s in (raw, locations.userinfo(raw)) if s]
    allowed = error.allowed
    for text in hidden:
        allowed = allowed.replace(text, masked if text == raw else "***")
    return ConfigError(error.name, masked, allowed)


def of_kind(*kinds: str) -> frozenset[str]:
    """The settings declared with one of `kinds` (see KINDS), by field name."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kind(s) {sorted(unknown)}: one of {', '.join(KINDS)}")
    return frozenset(f.name for f in fields(Settings) if f.metadata["kind"] in kinds)


def given(s: Settings) -> frozenset[str]:
    """The settings the user gave (a flag, the environment or .env), by field name.

    A resume takes only these from the invocation: a setting left out keeps the run's recorded
    value instead of becoming its default. Settings built in code rather than by load_settings
    count their values that differ from the defaults as given.
    """
    known = s.__dict__.get("_given")
    if known is not None:
        return known
    return frozenset(f.name for f in fields(s) if getattr(s, f.name) != f.default)


def unused_settings(values: dict[str, Any]) -> frozenset[str]:
    """The settings (by field name) that do nothing in a run of `values` (a config.json's): the image
    folder's size, channels and decode cache for the other data sets (arrays, held in memory), DATA_DIR
    for a DATASET that names its own path, EPOCHS for a smoke run (it trains one epoch)."""
    dataset = str(values.get("dataset", ""))
    folder = frozenset() if dataset.startswith("images:") else frozenset({"image_size", "channels", "cache"})
    own_path = {"data_dir"} if dataset.startswith(("images:", "npz:")) else set()
    return folder | own_path | ({"epochs"} if values.get("smoke") else set())


def knows_given(s: Settings) -> bool:
    """Whether `s` records which settings the user gave (load_settings, `.replace`); a Settings made in
    code (`Settings(...)`, `dataclasses.replace`) holds its values only."""
    return s.__dict__.get("_given") is not None


def as_given(s: Settings) -> Settings:
    """The same settings, every one counted as given (a resume then takes them all from `s`)."""
    return _with_given(dataclasses.replace(s), [f.name for f in fields(s)])


def _with_given(s: Settings, names) -> Settings:
    # Kept beside the fields, not as one: config.json, the flags and the tables list fields only.
    object.__setattr__(s, "_given", frozenset(names))
    return s


# What a command that reads runs (runs, report, compare, predict, export, reproduce, serve) reads from
# its flags, .env and the environment: RUNS_DIR and the extras' settings of kind `surroundings`, where
# runs live and what is made around them (a store's staging copy, the export formats, DVC's data cache);
# a command of its own adds its flags' (serve's limits). A run's training settings are its own
# config.json's, and an extra's other kinds set up a training (WORKERS, MLFLOW_*) or another command
# (SWEEP_STORAGE), so a bad value meant for the next `fit` is no reason to refuse listing the runs.
READ_BY_RUNS_COMMANDS = frozenset({"runs_dir"}) | (
    of_kind("surroundings") - frozenset(f.name for f in fields(CoreSettings))
)
# Settings that may differ on resume without changing the result of training.
RESUME_FREE = of_kind("free", "surroundings", "invocation")
# Chosen together for a new run that sets neither (train.setup.hardware.choose_batch; its manifest's `batch`).
BATCH_PAIR = frozenset({"batch_size", "learning_rate"})


def _coerce(f: dataclasses.Field, raw: Any) -> Any:
    """Turn a string from .env / environment / a flag into the field's type, or raise ConfigError."""
    name = f.name.upper()
    if not isinstance(raw, str):
        return _typed(f, raw)
    text = raw.strip()
    if f.type in ("bool", bool):
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(name, raw, "expected true/false (1/0, yes/no, on/off)")
    if f.type in ("int", int):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(name, raw, "expected a whole number, e.g. " + str(f.default)) from None
    if f.type in ("float", float):
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(name, raw, "expected a number, e.g. " + str(f.default)) from None
        if not math.isfinite(value):
            raise ConfigError(name, raw, "expected a finite number")
        return value
    return text


def _typed(f: dataclasses.Field, raw: Any) -> Any:
    """A value given in Python (`load_settings({"epochs": 3})`) as the field's own type, or ConfigError:
    never kept as it came (3.5 epochs, a NaN rate, `True` as a batch size, a NumPy integer that
    config.json cannot hold, a number where a path goes that fails later with a traceback)."""
    name = f.name.upper()
    if f.type in ("bool", bool):
        numpy_bool = type(raw).__module__ == "numpy" and type(raw).__name__ in ("bool", "bool_")
        if (isinstance(raw, numbers.Integral) or numpy_bool) and raw in (0, 1):
            return bool(raw)
        raise ConfigError(name, raw, "expected True or False")
    if f.type in ("int", int):
        if isinstance(raw, numbers.Integral) and not isinstance(raw, bool):
            return int(raw)
        raise ConfigError(name, raw, "expected a whole number, e.g. " + str(f.default))
    if f.type in ("float", float):
        if isinstance(raw, numbers.Real) and not isinstance(raw, bool):
            if not math.isfinite(raw):
                raise ConfigError(name, raw, "expected a finite number")
            if getattr(getattr(raw, "dtype", None), "kind", "") == "f" and raw.dtype.itemsize < 8:
                return float(str(raw))  # np.float32(0.001): 0.001 as written, not 0.0010000000474974513
            return float(raw)
        raise ConfigError(name, raw, "expected a number, e.g. " + str(f.default))
    if isinstance(raw, os.PathLike):
        return os.fspath(raw)  # RUNS_DIR=Path(...): a path is the text it spells
    if isinstance(raw, numbers.Real) and not isinstance(raw, bool):
        return str(raw)  # PEAK_FLOPS=2.5e11: the text a flag would give, checked as such
    raise ConfigError(name, raw, f"expected text (a str), e.g. {f.default!r}")


def _check_ranges(s: Settings) -> None:
    for f in fields(s):
        value, meta, name = getattr(s, f.name), f.metadata, f.name.upper()
        if "choices" in meta and value not in meta["choices"]:
            raise ConfigError(name, value, "one of " + ", ".join(map(str, meta["choices"])))
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and value < lo or hi is not None and value > hi:
            if lo is not None and hi is not None:
                rule = f"must be between {lo} and {hi}"
            else:
                rule = f"must be >= {lo}" if lo is not None else f"must be <= {hi}"
            if f.type in ("int", int) and lo == 1:
                rule = "must be a positive whole number" + (f" (at most {hi})" if hi else "")
            raise ConfigError(name, value, rule)


def _check_dirs(s: Settings, data: bool) -> None:
    """RUNS_DIR and DATA_DIR must not be empty: that would be the working directory. DATA_DIR, where a
    built-in data set is read, must be a folder if it exists (when the data is read: `data`).

    Refused rather than read as unset: a blank line (DATA_DIR=) may as well mean "here" as "the
    default", and a setting that names a folder is never guessed."""
    for name in ("runs_dir", "data_dir"):
        value = getattr(s, name)
        if not value.strip():
            raise ConfigError(name.upper(), value, f"must not be empty (the default is {getattr(Settings, name)})")
        if problem := locations.home_problem(value):
            raise ConfigError(name.upper(), value, problem)
    if not data:
        return
    # mnist.npz itself, say: a built-in data set would be looked for inside it (npz: and images: name their own)
    data_dir = Path(s.data_dir)  # a leading ~ already expanded (__post_init__)
    # The nearest part that exists must be a folder (DATA_DIR=mnist.npz/sub is below a file).
    nearest = next((p for p in (data_dir, *data_dir.parents) if p.exists() or p.is_symlink()), data_dir)
    if ":" not in s.dataset and (nearest.exists() or nearest.is_symlink()) and not nearest.is_dir():
        raise ConfigError(
            "DATA_DIR",
            s.data_dir,
            ("is" if nearest == data_dir else f"is below {nearest}, which is")
            + " not a folder (a file, a device or a broken link): give the folder that holds the data, "
            "or DATASET=npz:<a file>",
        )


def _check_runs_dir_path(runs_dir: str) -> None:
    """The nearest part of RUNS_DIR that exists must be a directory (checked for what the user gives,
    not for a run's saved settings, whose RUNS_DIR may be somewhere else by now)."""
    if locations.looks_like_url(runs_dir):
        return  # a store: train.run.remote opens it (it must answer) before any training
    p = Path(runs_dir)
    for part in (p, *p.parents):
        if part.is_dir():
            return
        if part.exists() or part.is_symlink():
            # A storage problem (exit 7, as a read-only RUNS_DIR), said plainly instead of "File exists".
            what = "a broken link" if not part.exists() else "a file"
            raise StorageError(f"RUNS_DIR={runs_dir}: {part} is {what}, not a directory; point RUNS_DIR at a directory")


_MODULE_FN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _check_peak_flops(value: str) -> None:
    if value in ("auto", "measure"):
        return
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf:
        raise ConfigError(
            "PEAK_FLOPS", value, "auto, measure or a positive number of FLOP/s per device, e.g. 2.5e11 (250 GFLOP/s)"
        )


def validate(s: Settings, data: bool = True) -> Settings:
    """Check every rule that does not need TensorFlow; return the settings unchanged or raise.
    `data`: whether the data will be read: DATASET's file or folder must be there and DATA_DIR no file
    (see settings_from_dict)."""
    try:
        return _validate(s, data)
    except ConfigError as exc:
        # Whichever check refused a URL-valued setting, its message never shows the secret in it.
        raise _masked(exc) from None


WARMUP_ENDS = "the warm-up must end before the training does"  # the rule a resume words for EPOCHS (train.run.resume)


def _validate(s: Settings, data: bool = True) -> Settings:
    _check_ranges(s)
    _check_peak_flops(s.peak_flops)
    _check_dirs(s, data)
    if locations.looks_like_url(s.runs_dir):  # validate() masks what is refused, as for every URL setting
        if problem := locations.url_problem(s.runs_dir):
            raise ConfigError("RUNS_DIR", s.runs_dir, problem)
        if "store" not in extras.sections_by_name():
            raise ConfigError("RUNS_DIR", s.runs_dir, extras.NO_STORE)
    datasets.check_dataset(s.dataset, exists=data)
    if s.model not in models.MODELS and not _MODULE_FN.match(s.model):
        raise ConfigError("MODEL", s.model, "one of " + ", ".join(models.MODELS) + " or package.module:function")
    if s.monitor not in models.monitors(s.model):
        raise ConfigError("MONITOR", s.monitor, "one of " + ", ".join(models.monitors(s.model)))
    least = models.entry(s.model).min_image_size
    if s.dataset.startswith("images:") and s.image_size < least:
        raise ConfigError(
            "IMAGE_SIZE",
            s.image_size,
            f"MODEL={s.model} needs images of at least {least}x{least}: raise IMAGE_SIZE or use MODEL=resnet_small",
        )
    if s.val_split == 0 and s.monitor.startswith("val_") and (s.dataset.startswith("images:") or s.val_from == "train"):
        raise ConfigError(
            "VAL_SPLIT",
            s.val_split,
            f"0 leaves no validation images, so MONITOR={s.monitor} is never "
            "measured: set VAL_SPLIT above 0 (e.g. 0.1) or MONITOR=accuracy or loss",
        )
    if s.run_name and not re.fullmatch(r"[\w-]{1,64}", s.run_name):
        raise ConfigError("RUN_NAME", s.run_name, "letters, digits, '-' and '_' only, at most 64 characters")
    if (
        s.run_name
        and not locations.looks_like_url(s.runs_dir)
        and (problem := locations.run_name_problem(s.run_name, s.runs_dir))
    ):
        raise ConfigError("RUN_NAME", s.run_name, problem)
    if s.lr_warmup_epochs >= s.epochs:
        raise ConfigError(
            "LR_WARMUP_EPOCHS",
            s.lr_warmup_epochs,
            f"{WARMUP_ENDS} (EPOCHS={s.epochs}): give less than {s.epochs}",
        )
    profile_steps(s.profile_steps)
    for section in extras.sections():
        if hasattr(section, "check"):
            section.check(s)
    return s


def profile_steps(value: str) -> tuple[int, int]:
    """PROFILE_STEPS as (start, stop): the steps start, ..., stop - 1 of this process."""
    parts = value.split(":")
    try:
        start, stop = (int(p.strip()) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        start = stop = None
    if start is None or stop is None or not 0 <= start < stop:
        raise ConfigError(
            "PROFILE_STEPS",
            value,
            "START:STOP, two whole numbers with 0 <= START < STOP, e.g. 10:15 (steps 10 to 14; "
            "the first steps trace and compile, so START is best 10 or more)",
        )
    return start, stop


def load_settings(
    overrides: Mapping[str, Any] | None = None,
    env_file: str | os.PathLike | None = ".env",
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] | None = None,
    only: Collection[str] | None = None,
) -> Settings:
    """Resolve the settings: defaults < .env file < environment < `overrides` (command-line flags).

    `overrides` uses field names (`batch_size`); files and the environment use UPPER_CASE names.
    A missing default `.env` is fine; an explicitly named one that does not exist is an error.
    `warn(line)` gets the warnings about the .env file (unknown or repeated keys); default: logged.
    `only`: the settings (field names) read at all; the others keep their defaults (READ_BY_RUNS_COMMANDS),
    and a training's own checks are not made: MODEL=module:function is not looked for (a command that reads
    runs builds a run's model from its config.json), nor the environment's (a cluster's TF_CONFIG, MLflow's).
    """
    environ = os.environ if environ is None else environ
    if overrides is not None and not isinstance(overrides, Mapping):
        file = isinstance(overrides, (str, os.PathLike))  # load_settings("my.env"): a settings file, meant as env_file
        raise TypeError(
            f"load_settings() takes the settings to set as a dict by their lower-case names, e.g. {{'epochs': 3}}, "
            f"not {type(overrides).__name__}"
            + (f": a settings file is env_file=, load_settings(env_file={os.fspath(overrides)!r})" if file else "")
        )
    _check_override_names(overrides or {})
    file_values: Mapping[str, Any] = {}
    if env_file:
        path = Path(env_file)
        if path.exists() or path.is_symlink():
            file_values = read_env_file(path, _names(), warn or log.warning)
        elif str(env_file) != ".env":
            raise ConfigError("ENV_FILE", str(env_file), "file does not exist; create it from .env.example")
    values: dict[str, Any] = {}
    from_file: set[str] = set()  # names whose value is the .env file's: an error then says where to fix it
    with _naming_the_file(env_file, from_file):
        for f in fields(Settings):
            name = f.name.upper()
            if only is not None and f.name not in only:
                continue
            # Only the value that wins is read: a bad one in .env that the environment or a flag replaces is no error.
            if overrides and overrides.get(f.name) is not None:
                raw = overrides[f.name]
            elif name in environ:
                raw = environ[name]
            elif name in file_values:
                raw = file_values[name]
                from_file.add(name)
            else:
                continue
            values[f.name] = _coerce(f, raw)
        settings = _with_given(validate(Settings(**values), data=only is None), values)
        _check_runs_dir_path(settings.runs_dir)
        if settings.model not in models.MODELS:  # with `only`, MODEL keeps its default, a registered name
            # Found, parsed and defining the function: checked here, before TensorFlow, where it can be.
            check_model_spec(settings.model)
    if only is None:
        _check_environ(settings, environ)
    return settings


@contextlib.contextmanager
def _naming_the_file(env_file: str | os.PathLike | None, names: set[str]):
    """A ConfigError about a setting whose value came from the .env file says so (the fix is there)."""
    try:
        yield
    except EnvFileError:
        raise
    except ConfigError as exc:
        if exc.name not in names:
            raise
        raise ConfigError(exc.name, exc.value, f"{exc.allowed} (set in {env_file})") from None


def _check_environ(settings: Settings, environ: Mapping[str, str]) -> None:
    """What only the environment says, checked by each extra (the workers extra: TF_CONFIG). A template
    without that extra refuses a launcher's cluster: each worker would train a run of its own."""
    sections = extras.sections_by_name()
    for section in sections.values():
        if hasattr(section, "check_environ"):
            section.check_environ(settings, environ)
    if "workers" in sections:
        return
    nodes = environ.get("SKYPILOT_NODE_IPS", "").split()  # one node: SkyPilot sets it in every job
    for name, asked in (("TF_CONFIG", environ.get("TF_CONFIG", "").strip()), ("SKYPILOT_NODE_IPS", len(nodes) > 1)):
        if asked:
            raise ConfigError(
                name,
                environ[name][:80],
                "several workers need the workers extra, whose folder (train/workers) this template does not "
                f"have: {'unset TF_CONFIG' if name == 'TF_CONFIG' else 'launch one node'} to train in one process",
            )


def debug_requested(env_file: str | os.PathLike | None = ".env", environ: Mapping[str, str] | None = None) -> bool:
    """DEBUG from .env / the environment, read on its own: an invalid other setting must not hide it."""
    environ = os.environ if environ is None else environ
    value = environ.get("DEBUG")
    if value is None and env_file and Path(env_file).is_file():
        try:
            value = read_env_file(env_file, _names()).get("DEBUG")
        except ConfigError:
            value = None  # an unreadable file is the error being reported; it cannot ask for DEBUG
    return str(value or "").strip().lower() in _TRUE


def _names() -> set[str]:
    return {f.name.upper() for f in fields(Settings)}


def _check_override_names(overrides: Mapping[str, Any]) -> None:
    """A key of `overrides` that is no setting is refused, never left out: `load_settings({"epoch": 1})`
    in a notebook would otherwise train the default number of epochs without a word."""
    names = [f.name for f in fields(Settings)]
    unknown = sorted(set(overrides) - set(names), key=str)
    if not unknown:
        return
    key = unknown[0]
    close = difflib.get_close_matches(str(key).lower(), names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        str(key),
        overrides[key],
        f"not a setting: {hint}overrides are named as the settings in lower case, e.g. 'batch_size' "
        "(python -m train settings lists them)",
    )


_JSON_KINDS = {
    "bool": ((bool,), "true or false"),
    "int": ((int,), "a whole number"),
    "float": ((int, float), "a number"),
}


def wrongly_typed(data: Mapping[str, Any]) -> tuple[str, Any, str] | None:
    """The first saved setting whose JSON value is not of its setting's type, as (key, value, what it
    must be), e.g. a hand-edited `"batch_size": "64"`, or `"smoke": "false"`, which Python would
    take as true; None when every one is."""
    for f in fields(Settings):
        kinds, what = _JSON_KINDS.get(f.type, ((str,), "text"))
        value = data.get(f.name, f.default)
        wrong_bool = isinstance(value, bool) and bool not in kinds
        if not isinstance(value, kinds) or wrong_bool or (isinstance(value, float) and not math.isfinite(value)):
            return f.name, value, what
    return None


def settings_from_dict(data: Mapping[str, Any], need_data: bool = True) -> Settings:
    """Rebuild settings saved in a run directory (unknown keys from newer versions are ignored).

    `need_data=False`: DATASET's file or folder may be gone (moved since): a command that builds the
    model from the run's record and weights alone (export, predict) has no use for it."""
    if wrong := wrongly_typed(data):
        key, value, what = wrong
        raise ConfigError(
            key.upper(), value, f"must be {what}" + (", written without quotes" if isinstance(value, str) else "")
        )
    known = {f.name for f in fields(Settings)}
    values = {k: v for k, v in data.items() if k in known}
    for f in fields(Settings):
        # A setting added after the run was saved: the value that gives what that version did, not
        # today's default, so a resume or reproduce trains as the run did.
        if f.name not in values and "recorded_before" in f.metadata:
            values[f.name] = f.metadata["recorded_before"]
    for section in extras.sections():
        if hasattr(section, "saved"):
            section.saved(values)
    return validate(Settings(**values), data=need_data)


def diff_settings(old: Settings, new: Settings, ignore: frozenset[str] = RESUME_FREE) -> list[str]:
    """Human-readable differences, e.g. ['BATCH_SIZE: 128 -> 64'], skipping `ignore`."""
    out = []
    for f in fields(Settings):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if f.name not in ignore and a != b:
            if f.name in URL_SETTINGS:
                a, b = redact_uri(a), redact_uri(b)
            out.append(f"{f.name.upper()}: {a!r} -> {b!r}")
    if old.lr_schedule != "constant" and old.epochs != new.epochs and "epochs" in ignore:
        # A decaying schedule spans all EPOCHS: changing it changes every later learning rate.
        out.append(f"EPOCHS: {old.epochs!r} -> {new.epochs!r} (LR_SCHEDULE={old.lr_schedule} spans all epochs)")
    return out


def env_text(value: Any) -> str:
    """A value as it is written in .env (booleans as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def env_example() -> str:
    """The text of `.env.example`: every setting with its default and a one-line comment."""
    # Every line commented out: a copied file changes nothing, on the host or in the container (where
    # an active `RESUME=` would turn off the compose service's RESUME=auto), until a line is uncommented.
    lines = [
        "# Settings for `python -m train`: cp .env.example .env, then uncomment and change what you need.",
        "# Precedence: defaults < .env < environment < flags. In the container RUNS_DIR and DATA_DIR are",
        "# always the /runs and /data volumes (docker-compose.yml); move them with RUNS_HOST_DIR/DATA_HOST_DIR.",
        "",
    ]
    for section, title, own in _by_section():
        if section:
            lines += [f"# ---- the {section} extra: {title} ----", ""]
        for f in own:
            lines += [f"# {f.metadata['doc']}", f"# {f.name.upper()}={env_text(f.default)}", ""]
    return "\n".join(lines)


def _by_section() -> list[tuple[str, str, list[dataclasses.Field]]]:
    """(extra, its title, its fields), the core's first with extra "": how .env.example and the table list them."""
    out = [("", "", list(fields(CoreSettings)))]
    for name, section in extras.sections_by_name().items():
        title = (section.Section.__doc__ or name).strip().splitlines()[0]
        out.append((name, title, list(fields(section.Section))))
    return out


def as_flags(values: Mapping[str, Any]) -> list[str]:
    """Settings by field name as the `fit` flags that give them (a None value: left out)."""
    flags: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def settings_table() -> str:
    """The README's configuration table (markdown)."""
    rows = ["| Variable | Flag | Default | Meaning |", "|---|---|---|---|"]
    for section, title, own in _by_section():
        if section:
            rows.append(f"| **the {section} extra** | | | {title.replace('|', chr(92) + '|')} |")
        for f in own:
            flag = "--" + f.name.replace("_", "-")
            if isinstance(f.default, bool):  # a switch: `--export false` is not a flag
                flag = f"{flag}` / `--no-{flag[2:]}"
            doc = f.metadata["doc"].replace("|", "\\|")
            rows.append(f"| `{f.name.upper()}` | `{flag}` | `{env_text(f.default)}` | {doc} |")
    return "\n".join(rows)
