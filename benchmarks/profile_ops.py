"""Where a training step's time goes, from a profile that PROFILE=steps wrote (docs/performance.md).

    python benchmarks/profile_ops.py RUN/tensorboard [--top K]

Reads the newest `plugins/profile/*/*.xplane.pb` under the folder with the protobuf classes that
ship with TensorFlow (no profiler plugin needed) and prints two markdown tables: the step's time by
kind of work, and the K longest ops. Method: on each TensorFlow executor thread (`tf_Compute/...`)
an event's own time is its duration minus that of the events nested in it, so the executor's
bookkeeping between ops (`ExecutorState::Process` outside any kernel) is counted apart from the
kernels. The executor threads run ops side by side, so their times add up to more than the wall
time of a step: a share is of that summed thread time, ms are per step. The wall time per step is
the traced `_train_loop` calls' time divided by the steps each ran (STEPS_PER_EXECUTION, or fewer
at an edge): every op of the step's graph runs once a step, so a call's step count is how many
times most of its ops ran.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

# (kind, test on "name:OpType"), first match wins: the order puts the specific before the general.
KINDS = (
    # Keras names the optimizer's scope adam, adam_1, ... (one more for each optimizer the process made).
    ("optimizer (Adam update, float32)", lambda n, t: re.search(r"/adam(_\d+)?/", n) or t.startswith("ResourceApply")),
    ("conv backward: weight gradients", lambda n, t: "Conv2DBackpropFilter" in t),
    ("conv backward: input gradients", lambda n, t: "Conv2DBackpropInput" in t),
    ("conv forward (bias fused)", lambda n, t: "Conv2D" in t),
    ("dense layers (matmul), forward + backward", lambda n, t: "MatMul" in t),
    ("max pooling, forward + backward", lambda n, t: "MaxPool" in t),
    ("ReLU, forward + backward", lambda n, t: t in ("Relu", "ReluGrad", "_MklRelu", "_MklReluGrad")),
    ("casts (bfloat16 <-> float32)", lambda n, t: t == "Cast"),
    ("softmax, loss, metrics", lambda n, t: "Softmax" in t or "crossentropy" in n or "ArgMax" in t),
    ("all-reduce / collectives", lambda n, t: "Collective" in t or "NcclAllReduce" in t),
)
INPUT = "input (waiting for the next batch from tf.data)"
EXECUTOR = "executor between ops (scheduling, bookkeeping)"
OTHER = "other ops (reshapes, variable reads, sums, loop control)"


def newest_profile(folder: Path) -> Path:
    found = sorted(Path(folder).glob("plugins/profile/*/*.xplane.pb"))
    if not found:
        raise SystemExit(f"no plugins/profile/*/*.xplane.pb under {folder}: train with PROFILE=steps first")
    return found[-1]


def kind_of(event_name: str) -> str:
    if event_name.startswith("ExecutorState::"):
        return EXECUTOR
    name, _, op_type = event_name.rpartition(":")
    for kind, test in KINDS:
        if test(name, op_type):
            return kind
    return OTHER


def own_times(line, names):
    """(name, start in ps, own time in ms) of each event on one thread: its duration minus that of
    the events nested in it."""
    events = sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps))
    base = line.timestamp_ns * 1000
    own: list[list] = []
    stack: list[tuple[int, int]] = []  # (end, index in own) of the open events
    for e in events:
        while stack and stack[-1][0] <= e.offset_ps:
            stack.pop()
        if stack:
            own[stack[-1][1]][2] -= e.duration_ps / 1e9
        own.append([names[e.metadata_id].name, base + e.offset_ps, e.duration_ps / 1e9])
        stack.append((e.offset_ps + e.duration_ps, len(own) - 1))
    return own


def summarise(path: Path) -> dict:
    """Per kind of work and per op: ms a step, the median over the traced calls (robust to the
    calls another process slowed down), and the fastest call's."""
    import bisect
    import statistics

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    host = next(p for p in space.planes if p.name == "/host:CPU")
    names = host.event_metadata
    spans = sorted(
        (line.timestamp_ns * 1000 + e.offset_ps, line.timestamp_ns * 1000 + e.offset_ps + e.duration_ps)
        for line in host.lines
        if line.name == "python"
        for e in line.events
        if names[e.metadata_id].name.startswith("EagerLocalExecute: __inference__train_loop")
    )
    if not spans:
        raise SystemExit(f"{path}: no traced train call (__inference__train_loop) found")
    starts = [a for a, _ in spans]
    calls = len(spans)
    per_call: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0] * calls)
    ran = [collections.Counter() for _ in spans]  # op name -> times it ran, per call
    threads = 0
    for line in host.lines:
        if line.name.startswith("tf_Compute"):
            threads += 1
        elif not line.name.startswith("tf_data_iterator_get_next"):
            continue
        for name, at, ms in own_times(line, names):
            i = bisect.bisect_right(starts, at) - 1
            if i < 0 or at >= spans[i][1]:
                continue  # outside the train calls (validation, the profiler's own start and stop)
            if line.name.startswith("tf_data"):  # the train call waiting for its batch
                per_call[("kind", INPUT)][i] += ms
            elif name.startswith("ExecutorState::") or ":" in name:
                per_call[("kind", kind_of(name))][i] += ms
                per_call[("op", name)][i] += ms
                ran[i][name] += 1
    # The steps of each call: the count most of its ops share (a few run once a call, outside the loop).
    steps = [statistics.mode(c.values()) if c else 1 for c in ran]
    wall = [(b - a) / 1e9 for a, b in spans]
    # Between calls: the Python loop (stop check, reading the step's sums back, checkpoint bookkeeping),
    # spread over the steps of the call it leads to.
    between = [(b[0] - a[1]) / 1e9 / n for a, b, n in zip(spans, spans[1:], steps[1:])] or [0.0]

    def per_step(values):
        return [v / n for v, n in zip(values, steps)]

    def med(values):
        return statistics.median(per_step(values)), min(per_step(values))

    return {
        "calls": calls,
        "steps": sum(steps),
        "threads": threads,
        "wall_ms": med(wall)[0],
        "fastest_wall_ms": med(wall)[1],
        "between_ms": statistics.median(between),
        "kinds": {k: med(v) for (what, k), v in per_call.items() if what == "kind"},
        "ops": {k: med(v) for (what, k), v in per_call.items() if what == "op"},
    }


def tables(summary: dict, top: int = 15) -> str:
    kinds, busy = summary["kinds"], sum(m for m, _ in summary["kinds"].values())
    out = [
        f"{summary['steps']} steps in {summary['calls']} calls: {summary['wall_ms']:.1f} ms a step inside the "
        f"compiled call (median; fastest {summary['fastest_wall_ms']:.1f}), {summary['between_ms']:.2f} ms between "
        f"calls (the Python loop); {busy:.1f} ms a step of work on {summary['threads']} executor thread(s)",
        "",
        "| kind of work | share of the work | ms a step (median) | fastest step |",
        "|---|---|---|---|",
    ]
    for kind, (ms, low) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        out.append(f"| {kind} | {ms / busy:.1%} | {ms:.2f} | {low:.2f} |")
    out += ["", "| op (name: kernel) | share of the work | ms a step (median) | fastest step |", "|---|---|---|---|"]
    kernels = {k: v for k, v in summary["ops"].items() if not k.startswith("ExecutorState::")}
    for name, (ms, low) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        short = name.replace("while/body/_1/", "").replace("gradient_tape/while/", "grad ").replace("while/", "")
        out.append(f"| `{short}` | {ms / busy:.1%} | {ms:.2f} | {low:.2f} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the run's tensorboard/ folder (or any profile logdir)")
    parser.add_argument("--top", type=int, default=15, help="how many ops to list")
    args = parser.parse_args()
    path = newest_profile(args.folder)
    print(path)
    print(tables(summarise(path), args.top))


if __name__ == "__main__":
    main()
