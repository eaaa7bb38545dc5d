"""train.gpucheck.check: the report, the verdict, the text and JSON formats and the exit codes, from faked
facts (tests/gpucheck/check_fakes.py). No GPU, no TensorFlow import except in the tests marked slow."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from check_fakes import CUINIT_NOISE, codes, cpu_tf, cuda_tf, on, tf_gpus

from train import cli
from train.gpucheck import check, gpuinfo
from train.gpucheck.facts import Facts, TfFacts

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_machine_gets_a_calm_report_exit_0(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    facts = Facts(
        tf=cpu_tf(
            log=CUINIT_NOISE,
            matmul=[{"device": "/CPU:0", "n": 1024, "seconds": 0.03, "gflops": 70.0}],
            bf16_speedup=1.5,  # measured with the matmul
            onednn="on (TensorFlow's default on a CPU with AVX512-VNNI, AVX512-BF16 or AMX)",
        ),
        driver_reason="NVML: NVML Shared Library Not Found",
        cpu_bf16=["avx512_bf16"],
    )
    r = check.build_report(facts)
    assert r["exit_code"] == 0 and r["verdict"]["status"] == "cpu" and r["verdict"]["usable_gpus"] == 0
    assert {d["severity"] for d in r["diagnoses"]} == {"info"}
    text = check.format_report(r)
    assert "VERDICT: running on CPU" in text and "cuInit" in text and "CUDA_ERROR_NO_DEVICE" not in text
    assert "\n  CPU kernels    oneDNN on (TensorFlow's default on a CPU with AVX512-VNNI" in text
    assert r["tensorflow"]["onednn"].startswith("on (")
    assert r["precision"]["auto"] == "mixed_bfloat16" and r["tf_log"]["shown"] == []


@pytest.mark.parametrize("speedup, auto", [(0.55, "float32"), (1.6, "mixed_bfloat16")])
def test_auto_on_a_bf16_cpu_follows_the_probe_as_in_training(monkeypatch, speedup, auto):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    p = check.precisions(Facts(tf=cpu_tf(bf16_speedup=speedup), cpu_bf16=["avx512_bf16"]))
    assert p["auto"] == auto and p["options"]["mixed_bfloat16"]["sensible"] is (auto == "mixed_bfloat16")
    assert f"ran {speedup:.2f}x float32's (measured now by this check; a run reads" in p["auto_reason"]


def test_auto_on_a_bf16_cpu_without_the_probe_says_the_probe_decides(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    p = check.precisions(Facts(tf=cpu_tf(), cpu_bf16=["avx512_bf16"]))  # --skip-matmul: no probe figure
    assert p["auto"] == "mixed_bfloat16 or float32" and "skipped here with --skip-matmul" in p["auto_reason"]


def test_auto_on_a_bf16_cpu_whose_probe_failed_is_float32_as_in_training(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    failed = "AbortedError: could not create a primitive descriptor for the convolution"
    p = check.precisions(Facts(tf=cpu_tf(bf16_probe_error=failed), cpu_bf16=["avx512_bf16"]))
    assert p["auto"] == "float32" and p["auto_reason"].endswith(f"but the bfloat16 probe failed: {failed}")


def test_auto_on_a_bf16_cpu_with_onednn_turned_off_is_float32_as_in_training(monkeypatch):
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    p = check.precisions(Facts(tf=cpu_tf(), cpu_bf16=["avx512_bf16"]))
    assert p["auto"] == "float32" and "TF_ENABLE_ONEDNN_OPTS" in p["auto_reason"]


@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE"])
def test_bfloat16_is_not_sensible_on_a_bf16_cpu_with_onednn_capped_below_it(monkeypatch, isa):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    p = check.precisions(Facts(tf=cpu_tf(), cpu_bf16=["avx512_bf16"]))
    assert p["auto"] == "float32" and p["options"]["mixed_bfloat16"]["sensible"] is False
    assert f"ONEDNN_MAX_CPU_ISA={isa}" in p["options"]["mixed_bfloat16"]["why"]


def test_require_gpu_on_cpu_exits_1_through_the_cli(monkeypatch, capsys):
    monkeypatch.setattr(check, "collect", lambda skip_matmul=False: Facts(tf=cpu_tf()))
    assert check.build_report(Facts(tf=cpu_tf()), require_gpu=True)["exit_code"] == 1
    assert cli.main(["check", "--require-gpu", "--skip-matmul"]) == 1
    out, err = capsys.readouterr()
    assert "VERDICT: NO GPU, and --require-gpu asks for one: this check fails (exit 1)" in out
    assert "nothing is wrong" not in out and err.startswith("NoGPUError: --require-gpu: no usable GPU")
    assert "none needed to train on the CPU" not in err  # the fix of a check that asked for a GPU
    assert cli.main(["check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"]["status"] == "cpu"


def test_healthy_gpus_report_speedup_and_precision():
    matmul = [
        {"device": "/GPU:0", "n": 4096, "seconds": 0.0075, "gflops": 18325.0},
        {"device": "/GPU:1", "n": 4096, "seconds": 0.0075, "gflops": 18300.0},
        {"device": "/CPU:0", "n": 1024, "seconds": 0.03, "gflops": 71.6},
    ]
    mg = {"in_effect": True, "error": None, "late_call": None}
    r = check.build_report(
        on(
            "535.129.03_2xa100",
            cuda_tf(gpus=tf_gpus(2, (8, 0), "NVIDIA A100-SXM4-40GB"), matmul=matmul, memory_growth=mg),
        ),
        require_gpu=True,
    )
    assert r["diagnoses"] == [] and r["exit_code"] == 0 and r["gpu_speedup"] == 255.9
    assert r["verdict"]["line"].startswith("GPU ready: TensorFlow uses 2 GPU(s) (NVIDIA A100-SXM4-40GB); matmul 256x")
    assert r["precision"]["auto"] == "mixed_bfloat16" and "on for every GPU" in check.format_report(r)


def test_tensorflow_that_cannot_start_exits_1():
    r = check.build_report(Facts(tf=TfFacts(error="import tensorflow failed: ImportError: libcuda.so.1")))
    assert r["exit_code"] == 1 and r["verdict"]["status"] == "no_tensorflow"
    assert codes(r)["tensorflow_unavailable"]["fix"].startswith("install the locked requirements")


def test_json_has_exactly_the_documented_fields():
    r = check.build_report(on("550.54.15_h100", cuda_tf(gpus=tf_gpus())))
    assert set(json.loads(json.dumps(r))["gpus"][0]) == {
        "index",
        "name",
        "uuid",
        "memory_total_mb",
        "memory_used_mb",
        "driver_version",
        "compute_capability",
        "cuda_driver_version",
        "processes",
    }
    text = (ROOT / "docs" / "gpu-check.md").read_text().partition("## JSON fields")[2]
    assert set(r) == set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M))


@pytest.mark.slow
def test_real_check_on_this_machine():
    done = subprocess.run(
        [sys.executable, "-m", "train", "check", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    r = json.loads(done.stdout)
    errors = [d["code"] for d in r["diagnoses"] if d["severity"] == "error"]
    # The verdict this machine's facts call for: a GPU TensorFlow uses, else an error that explains
    # why none is used, else a CPU machine with nothing wrong.
    expected = "gpu" if r["tensorflow"]["gpus"] else "gpu_not_used" if errors else "cpu"
    assert done.returncode == 0 and r["verdict"]["status"] == expected, (r["verdict"], errors)
    assert r["verdict"]["usable_gpus"] == len(r["tensorflow"]["gpus"])
    if not gpuinfo.probe().driver_present:  # no NVIDIA driver here: nothing can be a usable GPU
        assert r["gpus"] == [] and r["verdict"]["status"] != "gpu"
    assert r["tensorflow"]["version"] and any("CPU" in m["device"] for m in r["matmul"])


@pytest.mark.gpu
@pytest.mark.slow
def test_real_gpu_passes_require_gpu():
    if not gpuinfo.probe().driver_present:
        pytest.skip("needs an NVIDIA GPU and driver")
    done = subprocess.run(
        [sys.executable, "-m", "train", "check", "--require-gpu"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
