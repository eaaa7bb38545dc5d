"""errors: every documented exit code is used, and messages carry name, value and the fix."""

from __future__ import annotations

import inspect

from train import errors
from train.errors import EXIT_CODES, ConfigError, TemplateError


def _error_classes():
    import train.run.find  # noqa: F401  (defines RunNotFound)

    seen, todo = set(), [TemplateError]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            todo.extend(cls.__subclasses__())
    return seen


def test_every_documented_exit_code_is_used():
    used = {cls.exit_code for cls in _error_classes()}
    # 0 is success and 75 is Interrupted; the CLI maps the statuses interrupted/budget to 75 too.
    # 130 is the CLI's answer to KeyboardInterrupt (a second Ctrl-C), not an error class.
    assert set(EXIT_CODES) - {0, 130} <= used
    assert used <= set(EXIT_CODES), f"undocumented exit codes: {used - set(EXIT_CODES)}"


def test_every_error_class_has_a_docstring():
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, TemplateError):
            assert cls.__doc__, name


def test_config_error_names_setting_value_and_rule():
    exc = ConfigError("BATCH_SIZE", "abc", "expected a whole number")
    assert str(exc) == "BATCH_SIZE='abc' is not valid: expected a whole number"
    assert (exc.name, exc.value, exc.exit_code) == ("BATCH_SIZE", "abc", 2)
    assert isinstance(exc, ValueError)


def test_resume_mismatch_is_a_checkpoint_problem():
    assert issubclass(errors.ResumeMismatchError, errors.CheckpointError)
    assert errors.ResumeMismatchError.exit_code == 4


def test_model_error_names_model_and_keeps_exit_2():
    exc = errors.ModelError("zoo:make", "make((2, 2, 1), 3) raised ValueError: too small")
    assert str(exc) == "MODEL=zoo:make: make((2, 2, 1), 3) raised ValueError: too small"
    assert (exc.name, exc.value, exc.exit_code) == ("MODEL", "zoo:make", 2)
    assert "MODEL" in EXIT_CODES[2] and "after" in EXIT_CODES[2]  # documented: found after TensorFlow loads


def test_env_file_error_names_file_and_line():
    exc = errors.EnvFileError(".env", 3, "cannot read 'X'")
    assert str(exc) == ".env, line 3: cannot read 'X'"
    assert isinstance(exc, ConfigError) and exc.exit_code == 2 and exc.name == "ENV_FILE"
    assert str(errors.EnvFileError(".env", None, "is a directory")) == ".env: is a directory"
