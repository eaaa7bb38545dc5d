"""`python -m train check`: is the GPU used, and if not, why not and what is the one fix.

Three steps, kept apart so the diagnosis is tested on any machine with faked inputs:
  collect()  -> Facts      facts.py: the driver (gpuinfo.py), the CUDA/cuDNN libraries on disk, and a
                           TensorFlow probe run in a subprocess so its C++ log is captured (tflog.py sorts it);
  diagnose(facts)          diagnose.py, pure functions: a list of Diagnosis (code, severity, summary, fix);
  build_report(facts)      here: the report as a dict, with the verdict and the precisions: printed as
                           text, or as JSON with `--json`.
The parent process never imports TensorFlow; the probe is the only TensorFlow start (~3 s on a CPU).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

from ..errors import NoGPUError
from ..setup import hardware
from .diagnose import CPU_IS_FINE, GPU_BLOCKING, Diagnosis, cuda_build, diagnose
from .facts import Facts, collect
from .tflog import classify_log


def precisions(facts: Facts) -> dict[str, Any]:
    """Which precisions make sense on the devices TensorFlow will use, and what `auto` picks (train.setup.hardware)."""
    ccs = [tuple(g["compute_capability"]) for g in facts.tf.gpus if g.get("compute_capability")]
    measured, failed = facts.tf.bf16_speedup, facts.tf.bf16_probe_error

    def probe() -> tuple[float, str]:
        if failed:  # "AbortedError: could not ...": raised again under its own name, as in training
            name, _, message = failed.partition(": ")
            raise type(name, (Exception,), {})(message)
        return measured, "measured now by this check; a run reads the figure cached in RUNS_DIR/.cache"

    auto, reason = hardware.choose_precision(
        "auto",
        ccs,
        facts.cpu_bf16,
        hardware.onednn_enabled(flags=facts.cpu_bf16),  # its bf16 flags: where oneDNN matters to the choice
        hardware.onednn_max_isa(),
        probe if measured or failed else None,
    )
    if auto == "mixed_bfloat16" and not ccs and not (measured or failed):  # --skip-matmul skipped the probe too
        auto = "mixed_bfloat16 or float32"
        reason += (
            f"; a run first measures its bfloat16 probe and takes float32 below {hardware.BF16_MIN_SPEEDUP}x "
            "(skipped here with --skip-matmul: run check without it for the figure)"
        )
    if facts.tf.gpus:
        cc = min(ccs) if ccs else None
        ok16 = bool(cc and cc >= hardware.FP16_MIN_CC)
        okbf = bool(cc and cc >= hardware.BF16_MIN_CC)
        where = f"GPU compute capability {cc[0]}.{cc[1]}" if cc else "GPU compute capability unknown"
        options = {
            "float32": (True, "always correct"),
            "mixed_float16": (ok16, f"{where} {'>=' if ok16 else '<'} 7.0 (float16 tensor cores)"),
            "mixed_bfloat16": (okbf, f"{where} {'>=' if okbf else '<'} 8.0 (bfloat16 tensor cores)"),
        }
    else:
        native = ", ".join(facts.cpu_bf16)
        options = {
            "float32": (True, "always correct"),
            "mixed_float16": (False, "CPUs have no fast float16 matmuls: slower than float32"),
            # auto's reason: native bfloat16, or what keeps oneDNN from it (TF_ENABLE_ONEDNN_OPTS, ONEDNN_MAX_CPU_ISA)
            "mixed_bfloat16": (
                auto.startswith("mixed_bfloat16"),
                reason if native else "CPU has no amx_bf16/avx512_bf16: bfloat16 would be emulated, slower",
            ),
        }
    return {
        "options": {k: {"sensible": ok, "why": why} for k, (ok, why) in options.items()},
        "auto": auto,
        "auto_reason": reason,
    }


# ---------------------------------------------------------------- report


def verdict(facts: Facts, diags: list[Diagnosis], speedup: float | None, auto: str) -> dict[str, Any]:
    errors = [d for d in diags if d.severity == "error"]
    blocked = any(d.code in GPU_BLOCKING for d in errors)  # TensorFlow lists the GPU but cannot run on it
    usable = len(facts.tf.gpus) if cuda_build(facts) and not blocked else 0
    warnings = sum(d.severity == "warning" for d in diags)
    tail = f"; {warnings} warning(s) below" if warnings else ""
    if facts.tf.version is None:
        status, line = "no_tensorflow", f"TensorFlow cannot start: {errors[0].summary}. Fix: {errors[0].fix}"
    elif usable:
        names = ", ".join(sorted({g.get("device_name") or g["name"] for g in facts.tf.gpus}))
        fast = f"; matmul {speedup:.0f}x the CPU" if speedup else ""
        status, line = (
            "gpu",
            f"GPU ready: TensorFlow uses {usable} GPU(s) ({names}){fast}; precision auto -> {auto}{tail}",
        )
    elif errors:
        status, line = (
            "gpu_not_used",
            (f"GPU NOT USED, training would run on the CPU: {errors[0].summary}. Fix: {errors[0].fix}"),
        )
    else:
        status, line = "cpu", f"running on CPU: no GPU here, and nothing is wrong; precision auto -> {auto}{tail}"
    return {"status": status, "line": line, "usable_gpus": usable}


def build_report(facts: Facts, require_gpu: bool = False, own_pids: set[int] | None = None) -> dict[str, Any]:
    diags = diagnose(facts, own_pids)
    prec = precisions(facts)
    cpu = [m["gflops"] for m in facts.tf.matmul if "CPU" in m["device"] and m.get("gflops")]
    gpu = [m["gflops"] for m in facts.tf.matmul if "GPU" in m["device"] and m.get("gflops")]
    speedup = max(gpu) / cpu[0] if cpu and gpu else None
    v = verdict(facts, diags, speedup, prec["auto"])
    if require_gpu and v["status"] == "cpu":
        # "nothing is wrong" and an exit of 1 would contradict each other: this check asked for a GPU.
        v["line"] = (
            "NO GPU, and --require-gpu asks for one: this check fails (exit 1). Nothing else is wrong: "
            f"without --require-gpu, training runs on this CPU with precision auto -> {prec['auto']}"
        )
    shown, noise = classify_log(facts.tf.log, facts.driver_present)
    exit_code = 1 if v["status"] == "no_tensorflow" or (require_gpu and not v["usable_gpus"]) else 0
    g0 = facts.gpus[0] if facts.gpus else None
    growth = dict(facts.tf.memory_growth)  # the probe's, off where TF_FORCE_GPU_ALLOW_GROWTH=false overrides it
    if facts.tf.gpus and facts.env.get("TF_FORCE_GPU_ALLOW_GROWTH") == "false":
        growth["in_effect"] = False
    return {
        "verdict": v,
        "exit_code": exit_code,
        "tensorflow": {
            "version": facts.tf.version,
            "error": facts.tf.error,
            "build": facts.tf.build,
            "gpus": facts.tf.gpus,
            "onednn": facts.tf.onednn,
        },
        "libraries": [asdict(lib) for lib in facts.libraries],
        "driver": {
            "present": facts.driver_present,
            "reason": facts.driver_reason,
            "version": g0.driver_version if g0 else None,
            "cuda_version": g0.cuda_driver_version if g0 else None,
        },
        "gpus": [asdict(g) for g in facts.gpus],
        "memory_growth": growth,
        "matmul": facts.tf.matmul,
        "gpu_speedup": round(speedup, 1) if speedup else None,
        "precision": prec,
        "diagnoses": [asdict(d) for d in diags],
        "tf_log": {"shown": shown, "noise": noise},
        "environment": {
            "in_container": facts.in_container,
            "nvidia_pci_devices": facts.nvidia_pci_devices,
            "cpu_bf16": facts.cpu_bf16,
            **facts.env,
        },
        "seconds": round(facts.tf.seconds, 2),
    }


def format_report(r: dict[str, Any]) -> str:
    rows = [*_build_rows(r), *_device_rows(r), *_runtime_rows(r)]
    lines = ["TensorFlow GPU check", *(f"  {label:<14} {text}" for label, text in rows)]
    if r["diagnoses"]:
        lines.append("Diagnoses")
    for dg in r["diagnoses"]:
        lines.append(f"  [{dg['severity']}] {dg['summary']}")
        lines += [f"      {x}" for x in dg["details"]]
        lines.append(f"      fix: {dg['fix']}")
    lines.append(f"VERDICT: {r['verdict']['line']}")
    return "\n".join(lines)


Rows = list[tuple[str, str]]


def _build_rows(r: dict[str, Any]) -> Rows:
    """What TensorFlow was built for, and the CUDA libraries it needs."""
    tf, build = r["tensorflow"], r["tensorflow"]["build"]
    if not build.get("is_cuda_build"):
        return [("TensorFlow", f"{tf['version'] or 'not available'}, CPU-only build (no CUDA libraries needed)")]
    ccs = build.get("cuda_compute_capabilities") or []
    rows = [
        (
            "TensorFlow",
            f"{tf['version']}, built for CUDA {build.get('cuda_version')}, cuDNN "
            f"{build.get('cudnn_version')}, compute capabilities {', '.join(map(str, ccs)) or '?'}",
        )
    ]
    for lib in r["libraries"]:
        found = f"{lib['path']} ({lib['version'] or 'version unknown'})" if lib["path"] else "NOT FOUND"
        if lib["library"] == "cuda" and not lib["path"] and not r["driver"]["present"]:
            found = "none (it comes with the driver, and there is none here)"  # a CPU machine: nothing wrong
        also = f"; also {', '.join(lib['others'])}" if lib["others"] else ""
        whose = " (the driver's)" if lib["library"] == "cuda" else ""
        rows.append(("  " + lib["library"], f"{lib['expected']}{whose}: {found}{also}"))
    return rows


def _device_rows(r: dict[str, Any]) -> Rows:
    """The driver, the GPUs and who uses them, what TensorFlow sees."""
    d, tf = r["driver"], r["tensorflow"]
    driver = f"{d['version']}, CUDA up to {d['cuda_version'] or '?'}" if d["present"] and d["version"] else None
    rows = [("Driver", driver or f"none ({d['reason']})")]
    for g in r["gpus"]:
        cc = ".".join(map(str, g["compute_capability"])) if g["compute_capability"] else "?"
        rows.append(
            (
                f"GPU {g['index']}",
                f"{g['name']}, {g['memory_used_mb']:.0f} of {g['memory_total_mb']:.0f} MiB used, "
                f"compute capability {cc}",
            )
        )
        for p in g["processes"]:
            used = f"{p['used_memory_mb']:.0f} MiB" if p["used_memory_mb"] is not None else "? MiB"
            rows.append(("", f"process {p['pid']} {p['name']}: {used}"))
    rows.append(("TF sees", ", ".join(g["name"] for g in tf["gpus"]) or "no GPU (runs on the CPU)"))
    mg = r["memory_growth"]
    if tf["gpus"] or mg.get("error"):
        growth = "on for every GPU" if mg.get("in_effect") else f"NOT in effect {mg.get('error') or ''}".rstrip()
        rows.append(("Memory growth", growth))
    return rows


def _runtime_rows(r: dict[str, Any]) -> Rows:
    """The matmul timings, the precision options and TensorFlow's start-up log."""
    rows = []
    for m in r["matmul"]:
        timed = (
            f"{m['n']}x{m['n']} float32 in {m['seconds'] * 1e3:.1f} ms, {m['gflops']:.0f} GFLOP/s"
            if "error" not in m
            else f"failed: {m['error']}"
        )
        rows.append(("Matmul", f"{m['device']}: {timed}"))
    if r["gpu_speedup"]:
        rows.append(("", f"GPU / CPU throughput: {r['gpu_speedup']}x"))
    if r["tensorflow"]["onednn"]:
        rows.append(("CPU kernels", f"oneDNN {r['tensorflow']['onednn']}"))
    p = r["precision"]
    options = "; ".join(f"{k} {'yes' if v['sensible'] else 'no'}" for k, v in p["options"].items())
    rows.append(("Precision", f"{options}; auto -> {p['auto']} ({p['auto_reason']})"))
    noise = r["tf_log"]["noise"]
    if noise:
        rows.append(("TF log", f"{sum(noise.values())} start-up line(s) captured, not errors: " + "; ".join(noise)))
    rows += [("TF log !", line) for line in r["tf_log"]["shown"]]
    return rows


def main(json_output: bool = False, require_gpu: bool = False, skip_matmul: bool = False) -> int:
    """Print the report; exit 0, or NoGPUError (exit 1) with --require-gpu and no usable GPU."""
    report = build_report(collect(skip_matmul), require_gpu, own_pids={os.getpid()})
    print(json.dumps(report, indent=2) if json_output else format_report(report), flush=True)
    if require_gpu and not report["verdict"]["usable_gpus"]:
        d = (
            next((d for d in report["diagnoses"] if d["severity"] == "error"), None)
            or (report["diagnoses"] or [None])[0]
        )
        why = f"{d['summary']}. Fix: {d['fix'].removeprefix(CPU_IS_FINE)}" if d else report["verdict"]["line"]
        raise NoGPUError(f"--require-gpu: no usable GPU: {why}")
    return report["exit_code"]
