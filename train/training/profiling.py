"""PROFILE=steps: a TensorFlow profile of a few training steps, where TensorBoard's Profile tab finds it.

The first steps of a process trace and compile the step function (and, on a GPU, pick kernels),
so the profile covers later ones: PROFILE_STEPS=START:STOP, counted over the steps this process
runs (a resume counts from its own first step, which traces again). Calls of STEPS_PER_EXECUTION
steps end at START and at STOP (`StepProfiler.clip`), so the trace holds exactly those steps. tf.profiler writes
`<logdir>/plugins/profile/<timestamp>/<host>.xplane.pb`; with the run's tensorboard/ folder as
logdir, `tensorboard --logdir RUN/tensorboard` (with tensorboard-plugin-profile) or `xprof server
--logdir RUN/tensorboard` opens it, and benchmarks/profile_ops.py reads it as a table. Only the chief profiles: the other workers write nothing, as everywhere.

A profile must never cost a run: a profiler that cannot start or stop (another one is already
running in the process, the disk is full) is a warning, and training goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("train")


class StepProfiler:
    """Starts and stops tf.profiler around the compiled calls that hold steps [start, stop)."""

    def __init__(self, logdir: Path | None, start: int, stop: int, edges: bool = False):
        self.logdir, self.start, self.stop = logdir, start, stop  # logdir None: off
        # Calls end on the range's edges in every process of a run (PROFILE=steps), writing or not:
        # workers must run calls of the same sizes, their all-reduces pair up call by call.
        self.edges = edges
        self.done = 0  # steps this process has run
        self.running, self.first = False, 0
        self.written: Path | None = None

    def clip(self, n: int) -> int:
        """At most the steps up to the range's next edge: calls of several steps then start and end
        on its edges, so the profile holds the steps asked for, whatever STEPS_PER_EXECUTION."""
        if not self.edges:
            return n
        for edge in (self.start, self.stop):
            if self.done < edge < self.done + n:
                n = edge - self.done
        return n

    def before(self, n: int) -> None:
        """Called before a compiled call of `n` steps."""
        if self.logdir is None or self.running or self.written is not None:
            return
        if self.done + n > self.start and self.done < self.stop:
            import tensorflow as tf

            try:
                self.logdir.mkdir(parents=True, exist_ok=True)
                tf.profiler.experimental.start(str(self.logdir))
            except Exception as exc:  # a profile must never cost a run
                log.warning("WARNING: PROFILE=steps: the profiler did not start (%s: %s)", type(exc).__name__, exc)
                self.logdir = None
                return
            self.running, self.first = True, self.done

    def after(self, n: int) -> None:
        """Called once a compiled call of `n` steps has finished (its result read back)."""
        self.done += n
        if self.running and self.done >= self.stop:
            self.close()

    def close(self) -> None:
        """Stop a running trace and write it (the end of the range, or the run ending inside it)."""
        if not self.running:
            return
        import tensorflow as tf

        self.running = False
        before = set(_profiles(self.logdir))
        try:
            tf.profiler.experimental.stop()
        except Exception as exc:
            log.warning("WARNING: PROFILE=steps: the profile was not written (%s: %s)", type(exc).__name__, exc)
            self.logdir = None
            return
        new = sorted(set(_profiles(self.logdir)) - before)
        self.written = new[-1].parent if new else self.logdir
        log.info(
            "profile of steps %d-%d written to %s (open it: tensorboard --logdir %s, Profile tab)",
            self.first,
            self.done - 1,
            self.written,
            self.logdir,
        )

    def report_missing(self) -> None:
        """At the end of training: say so when the run ended before the range began."""
        if self.logdir is not None and self.written is None and not self.running:
            log.warning(
                "WARNING: PROFILE=steps: training ended after %d steps, before step %d: no profile written; "
                "lower PROFILE_STEPS (now %d:%d)",
                self.done,
                self.start,
                self.start,
                self.stop,
            )


def _profiles(logdir: Path) -> list[Path]:
    return list(logdir.glob("plugins/profile/*/*.xplane.pb"))


def for_run(settings, tensorboard_dir: Path | None) -> StepProfiler:
    """The profiler of a run under PROFILE/PROFILE_STEPS (`tensorboard_dir` None: a worker, which writes nothing)."""
    from ..config import profile_steps

    start, stop = profile_steps(settings.profile_steps)
    steps = settings.profile == "steps"
    return StepProfiler(tensorboard_dir if steps else None, start, stop, edges=steps)
