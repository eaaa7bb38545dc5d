"""Turn pytest-benchmark's JSON (and the figures in extra_info) into the markdown table of docs/performance.md.

python benchmarks/summarise.py .benchmarks/latest.json   # the table in docs/performance.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _detail(info: dict) -> str:
    keep = [
        k for k in info if k not in ("comparison", "goal", "ratio", "passed") and not isinstance(info[k], (list, dict))
    ]
    nested = [
        k
        for k in ("samples_per_second", "images_per_second", "steps_per_second", "reached")
        if isinstance(info.get(k), dict)
    ]
    parts = [f"{k}={_fmt(info[k])}" for k in keep]
    if isinstance(info.get("gpu_rows"), dict):
        parts.append("model FLOP/s and MFU: " + gpu_rows(info["gpu_rows"]))
    for k in nested:
        inner = ", ".join(
            f"{n}: {_fmt(v if not isinstance(v, dict) else v.get('seconds'))}" for n, v in info[k].items()
        )
        parts.append(f"{k}: {inner}")
    return "; ".join(parts)


def gpu_rows(rows: dict) -> str:
    """The GPU benchmark's rows (common.throughput_row) as one line each."""

    def mfu(row: dict) -> str:
        if row.get("mfu") is None:
            return "MFU n/a (no peak)"
        return f"MFU {row['mfu']:.1%} of {row['peak_flops'] / 1e12:.3g} TFLOP/s {row['dtype']} ({row['peak_source']})"

    return ", ".join(
        f"{name}: {_fmt(row['steps_per_second'])} steps/s = {_fmt(row['model_flops_per_second'] / 1e9)} GFLOP/s, {mfu(row)}"
        for name, row in rows.items()
    )


def _cores(machine: dict) -> str:
    """The machine's cores, and how many the benchmarks could use when fewer (`taskset`, a container's cpuset)."""
    count, usable = machine.get("cpu", {}).get("count", "?"), machine.get("usable_cores")
    return f"{count} cores" if usable in (None, count) else f"{count} cores, {usable} of them usable here"


def table(report: dict) -> str:
    machine = report.get("machine_info", {})
    cpu = machine.get("cpu", {}).get("brand_raw") or machine.get("processor") or "?"
    lines = [
        f"Measured {report.get('datetime', '?')[:19]} on {cpu} ({_cores(machine)}), "
        f"Python {machine.get('python_version', '?')}.",
        f"CPU family: {machine.get('cpu_family', '?')} (the goals below are this family's).",
        "",
        "| Comparison | Ratio | Goal | Met | Figures |",
        "|---|---|---|---|---|",
    ]
    for b in sorted(report.get("benchmarks", []), key=lambda b: b.get("extra_info", {}).get("comparison", "")):
        info = b.get("extra_info", {})
        if "comparison" not in info:
            continue
        met = {True: "yes", False: "**no**", None: "n/a"}[info.get("passed")]
        lines.append(f"| {info['comparison']} | {_fmt(info.get('ratio'))} | {info['goal']} | {met} | {_detail(info)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python benchmarks/summarise.py <pytest-benchmark.json>", file=sys.stderr)
        return 2
    sys.stdout.write(table(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
