"""Running a MODEL factory, and what it must return: the edge between the template and a user's code.

The factory is the user's code, run inside a training process: `sys.exit`, `os._exit` or a stray
KeyboardInterrupt there would end the run without a word (or with a manifest still saying
"running"), and a slow factory would keep a `docker stop` waiting. While it runs, such exits
become a ModelError naming it, and SIGTERM/SIGINT stop it at once (ModelInterrupted, exit 75).

What it returns must be what the loop, the checkpoints and the export work with: a keras.Model
with one image input and one output of shape (batch, num_classes) that, for the template's
classification loss, holds probabilities (checked on a probe batch: logits would train silently
to nonsense), whose loss and metrics give one value per example of that batch (a loss that does not
fit the labels would otherwise fail in the first training step), and not compiled (the loop compiles it with the loss, metrics and optimizer of its
MODEL entry: the factory's own compile() would be replaced without a word).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping

from ..errors import ModelError, ModelInterrupted, first_line

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SUPPORTED = (
    "the template trains a functional model: inputs = keras.Input(shape=input_shape), ..., "
    "return keras.Model(inputs, probabilities) (or keras.Sequential([keras.Input(shape=input_shape), ...]))"
)


class _Exited(BaseException):
    """os._exit called by the user's code (a BaseException: `except Exception` there cannot swallow it)."""

    def __init__(self, status: object):
        super().__init__(status)
        self.status = status


@contextlib.contextmanager
def user_code(spec: str, what: str):
    """Run a user's module import or factory call (`what` names it in the messages)."""
    signalled: list[int] = []
    active = [True]
    restore = _route_signals(spec, signalled, active)
    real_exit, pid, thread = os._exit, os.getpid(), threading.get_ident()

    def no_exit(status):
        # Only the factory's own thread in this process: a forked child or another thread exits as usual.
        if os.getpid() == pid and threading.get_ident() == thread:
            raise _Exited(status)
        real_exit(status)

    os._exit = no_exit
    try:
        yield
    except _Exited as exc:
        raise ModelError(spec, f"{what} called os._exit({exc.status!r}); {_RAISE}") from None
    except SystemExit as exc:
        raise ModelError(spec, f"{what} called sys.exit({exc.code!r}); {_RAISE}") from None
    except KeyboardInterrupt:
        if signalled:
            raise  # a real Ctrl-C (the second one): stop at once
        raise ModelError(spec, f"{what} raised KeyboardInterrupt without a Ctrl-C; {_RAISE}") from None
    finally:
        try:
            active[0] = False  # from here a signal only reaches the run's handler: nothing left to stop
        finally:
            os._exit = real_exit
            restore()


_RAISE = "a model factory returns a keras.Model, and reports a problem by raising an exception"


def _route_signals(spec: str, signalled: list[int], active: list[bool]):
    """SIGTERM/SIGINT: the run's own handler first (it records why the run stops), then stop the factory."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # handlers can only be set in the main thread
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}

    def handler(signum, frame):
        signalled.append(signum)
        before = previous[signum]
        if callable(before):
            before(signum, frame)  # may raise KeyboardInterrupt itself (a second Ctrl-C)
        elif before == signal.SIG_IGN:
            return
        if active[0]:
            raise ModelInterrupted(spec, signal.Signals(signum).name)

    for sig in _SIGNALS:
        signal.signal(sig, handler)

    def restore():
        for sig, before in previous.items():
            signal.signal(sig, before if before is not None else signal.SIG_DFL)

    return restore


def check_model(
    spec: str,
    call: str,
    model,
    shape: tuple,
    classes: int,
    probabilities: bool,
    metrics: Mapping | None = None,
    loss: Callable | None = None,
) -> None:
    """ModelError unless `model` is what the template trains (see the module docstring)."""
    try:
        inputs, outputs = list(model.inputs), list(model.outputs)
    except (AttributeError, ValueError):  # a subclassed model, or a Sequential that was never built
        inputs, outputs = [], []
    if not inputs or not outputs:
        raise ModelError(
            spec, f"{call} returned a {type(model).__name__} whose inputs and outputs Keras does not know; {SUPPORTED}"
        )
    if getattr(model, "compiled", False):  # a Keras example's make_model: its compile() would be replaced silently
        optimizer = type(getattr(model, "optimizer", None)).__name__
        raise ModelError(
            spec,
            f"{call} returned a compiled model (its optimizer {optimizer}); the template compiles it with the loss, "
            "metrics and optimizer of its MODEL entry, which would replace yours: remove the compile() call, or "
            "load a saved model with keras.models.load_model(path, compile=False) (another optimizer or loss: "
            "register(..., optimizer=..., loss=...) in train/models.py, docs/extending.md)",
        )
    if len(inputs) != 1 or len(outputs) != 1:
        raise ModelError(
            spec,
            f"the model has {len(inputs)} input(s) and {len(outputs)} output(s); the template trains one image "
            f"input and one output, the probabilities of the {classes} classes",
        )
    out = tuple(outputs[0].shape)
    if len(out) == 2 and out[-1] != classes:
        raise ModelError(spec, f"the model outputs {out[-1]} values but the data has {classes} classes")
    if len(out) != 2:
        raise ModelError(
            spec, f"the model's output has shape {out}; the template needs (batch, {classes}): one value per class"
        )
    takes = tuple(inputs[0].shape[1:])
    if len(takes) != len(shape) or any(t is not None and t != s for t, s in zip(takes, shape)):
        raise ModelError(
            spec,
            f"the model takes inputs of shape {takes} but the images are {shape}: "
            "build it on keras.Input(shape=input_shape)",
        )
    outputs = _probe(spec, model, shape)
    if probabilities:
        _check_probabilities(spec, outputs)
    _check_metrics(spec, metrics or {}, outputs, loss)


def _check_metrics(spec: str, metrics: Mapping, probs, loss: Callable | None = None) -> None:
    """The loss (asked per example, as the steps ask it) and each metric give one value per example (the
    loop sums them and divides by the examples): checked on the probe batch's outputs, with class ids as
    labels (int32, as the data pipeline gives them). A loss that does not fit the labels or the model's
    output fails here in one line, not in the first training step with TensorFlow's traceback."""
    import numpy as np
    import tensorflow as tf

    labels = tf.constant(np.arange(len(probs)) % probs.shape[-1], tf.int32)
    outputs = tf.constant(probs, tf.float32)
    checks = [("its loss", lambda y, p: loss(reduction=None)(y, p))] if loss is not None else []
    for what, fn in [*checks, *((f"metric {name!r}", fn) for name, fn in metrics.items())]:
        try:
            value = np.asarray(fn(labels, outputs))
        except Exception as exc:
            raise ModelError(
                spec,
                f"{what} raised {type(exc).__name__} on a probe batch of class-id labels and the model's outputs: "
                + first_line(exc),
            ) from exc
        if value.ndim < 1 or value.shape[0] != len(probs) or value.size != len(probs):  # (batch,) or (batch, 1)
            rule = (
                "loss(reduction=None) gives one value per example, which the loop averages"
                if what == "its loss"
                else "a metric is a function of (labels, probabilities) giving one value per example, which the loop "
                "averages (not a keras.metrics object, not one value per class)"
            )
            raise ModelError(spec, f"{what} gives shape {value.shape} for a batch of {len(probs)}; {rule}")


def _probe(spec: str, model, shape: tuple):
    """The model's outputs on a probe batch of 4 images."""
    import numpy as np

    # Raw pixel values, as the data pipeline feeds them; a generator of its own leaves the seeds alone.
    probe = np.random.default_rng(0).uniform(0, 255, (4, *shape)).astype("float32")
    try:
        return np.asarray(model(probe, training=False), dtype="float64")
    except Exception as exc:
        if type(exc).__name__ == "ResourceExhaustedError":
            raise  # out of memory: the loop's own message and exit code
        raise ModelError(
            spec, f"calling the model on a batch of {shape} images raised {type(exc).__name__}: {first_line(exc)}"
        ) from exc


def _check_probabilities(spec: str, probs) -> None:
    import numpy as np

    sums = probs.sum(axis=-1)
    if np.isfinite(probs).all() and probs.min() >= -1e-6 and np.abs(sums - 1).max() <= 1e-2:
        return
    worst = float(sums[np.argmax(np.abs(sums - 1))]) if np.isfinite(sums).all() else float("nan")
    raise ModelError(
        spec,
        f"the model's outputs are not probabilities (on a probe batch a row sums to {worst:.3g}, the smallest "
        f"value is {probs.min():.3g}): the template trains with cross-entropy on probabilities, so end the "
        f'model with a softmax, e.g. keras.layers.Dense(num_classes, activation="softmax", dtype="float32")',
    )
