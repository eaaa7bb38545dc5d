"""train.gpucheck.facts: libraries found on disk, and the TensorFlow probe (with a TensorFlow stand-in,
a crashing and a hanging subprocess). No GPU, no TensorFlow import."""

from __future__ import annotations

import json
import subprocess
import sys

from check_fakes import CPU_BUILD, CUDA_BUILD, on

from train.gpucheck import check
from train.gpucheck import facts as check_facts
from train.gpucheck.facts import Facts, TfFacts


def test_find_library_on_disk(tmp_path):
    (tmp_path / "libcudnn.so.8").write_bytes(b"")
    wrong = check_facts.find_library("cudnn", 9, [tmp_path])
    assert wrong.path is None and wrong.others == [str(tmp_path / "libcudnn.so.8")]
    (tmp_path / "libcudnn.so.9").write_bytes(b"not an ELF file")
    broken = check_facts.find_library("cudnn", 9, [tmp_path])
    assert broken.path == str(tmp_path / "libcudnn.so.9") and broken.version is None and broken.error


def test_libraries_not_looked_for_on_a_cpu_build():
    assert check_facts.collect_libraries(CPU_BUILD, {}) == []


class _FakeTF:
    """A TensorFlow stand-in for probe_main: one GPU whose memory growth comes too late."""

    __version__ = "2.21.0"

    def __init__(self):
        gpu = type("PhysicalDevice", (), {"name": "/physical_device:GPU:0"})()
        late = RuntimeError("Physical devices cannot be modified after being initialized")
        exp = type(
            "Exp",
            (),
            {
                "set_memory_growth": staticmethod(lambda g, on: (_ for _ in ()).throw(late)),
                "get_memory_growth": staticmethod(lambda g: False),
                "get_device_details": staticmethod(lambda g: {"device_name": "Tesla T4", "compute_capability": (7, 5)}),
            },
        )
        self.config = type(
            "Config", (), {"list_physical_devices": staticmethod(lambda kind: [gpu]), "experimental": exp}
        )
        self.sysconfig = type("Sysconfig", (), {"get_build_info": staticmethod(lambda: dict(CUDA_BUILD))})


def test_probe_records_the_late_memory_growth_call(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorflow", _FakeTF())
    check_facts.probe_main(skip_matmul=True)
    out = json.loads(capsys.readouterr().out.split("@@train-check@@", 1)[1])
    assert (
        out["memory_growth"]["late_call"] == "tf.config.experimental.set_memory_growth('/physical_device:GPU:0', True)"
    )
    assert out["gpus"] == [{"name": "/physical_device:GPU:0", "device_name": "Tesla T4", "compute_capability": [7, 5]}]
    facts = on("525.60.13_t4", TfFacts(**out))
    assert check.build_report(facts)["diagnoses"][0]["code"] == "memory_growth_too_late"


def test_probe_that_crashes_or_hangs_is_a_finding(monkeypatch):
    monkeypatch.setattr(check_facts.sys, "executable", "/bin/false")
    crashed = check_facts.run_probe(skip_matmul=True)
    assert crashed.version is None and "exited with status 1" in crashed.error
    monkeypatch.setattr(check_facts.sys, "executable", "/bin/sleep")
    monkeypatch.setattr(
        check_facts.subprocess,
        "run",
        lambda *a, **k: (_ for _ in ()).throw(subprocess.TimeoutExpired("probe", 0.1, stderr=b"still loading")),
    )
    hung = check_facts.run_probe(skip_matmul=True, timeout=0.1)
    assert "did not finish" in hung.error and hung.log == ["still loading"]
    assert check.build_report(Facts(tf=hung))["exit_code"] == 1


def test_a_cuda_build_looks_for_the_drivers_libcuda_first():
    """libcuda.so.1 comes with the driver (no wheel has it): looked for beside the CUDA wheels' libraries."""
    wanted = [lib.expected for lib in check_facts.collect_libraries(CUDA_BUILD, {})]
    assert wanted == ["libcuda.so.1", "libcudart.so.12", "libcublas.so.12", "libcudnn.so.9"]


def test_the_file_a_soname_links_to_is_not_another_library(tmp_path):
    """The driver's libcuda.so.1 links to libcuda.so.<driver version>: not a second libcuda of another major."""
    (tmp_path / "libcuda.so.535.129.03").write_bytes(b"not an ELF file")
    (tmp_path / "libcuda.so.1").symlink_to("libcuda.so.535.129.03")
    assert check_facts.find_library("cuda", 1, [tmp_path]).others == []
    (tmp_path / "libcuda.so.1").unlink()  # ldconfig never run: the versioned file alone is worth naming
    assert check_facts.find_library("cuda", 1, [tmp_path]).others == [str(tmp_path / "libcuda.so.535.129.03")]
