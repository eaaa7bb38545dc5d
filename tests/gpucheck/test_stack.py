"""The lock files agree with TensorFlow's tested stack and with each other (train/gpucheck/stack.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from train.gpucheck import stack
from train.gpucheck.stack import StackError, TestedStack

ROOT = Path(__file__).resolve().parents[2]


def test_locks_match_the_tested_stack_and_each_other():
    tested, problems = stack.check_locks()
    assert problems == []
    assert tested == stack.TESTED["2.21"]


def test_tf_2_21_row_is_the_published_configuration():
    assert stack.TESTED["2.21"] == TestedStack("2.21", "3.10", "3.13", "12.5", "9.3", "525.60.13", "8.9", "555.42.06")
    assert stack.TESTED["2.21"].pythons == ["3.10", "3.11", "3.12", "3.13"]


@pytest.mark.parametrize("python", stack.TESTED["2.21"].pythons)
def test_cpu_lock_downloads_no_cuda_and_shares_versions(python):
    cpu = stack.locked_versions(stack.CPU_LOCK, python)
    gpu = stack.locked_versions(stack.GPU_LOCK, python)
    assert not [n for n in cpu if n.startswith("nvidia-") and n.endswith("-cu12")]
    assert "tensorflow" not in cpu and cpu["tensorflow-cpu"] == gpu["tensorflow"]
    assert gpu["nvidia-cudnn-cu12"].startswith("9.3.") and gpu["nvidia-cuda-runtime-cu12"].startswith("12.5.")
    shared = cpu.keys() & gpu.keys()
    assert len(shared) > 20 and {n: cpu[n] for n in shared} == {n: gpu[n] for n in shared}


def test_every_locked_package_carries_a_hash():
    for lock in (stack.CPU_LOCK, stack.GPU_LOCK, stack.TEST_LOCK):
        blocks = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text())
        pinned = [b for b in blocks if "==" in b.split("\n")[0]]
        assert pinned and all("--hash=sha256:" in b for b in pinned), lock


def test_pyproject_python_range_matches_the_table():
    tested = stack.TESTED["2.21"]
    requires = re.search(r'^requires-python = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert requires == f">={tested.python_min},<3.{int(tested.python_max.split('.')[1]) + 1}"


def test_the_lock_inputs_pin_the_same_tensorflow():
    cpu = re.search(r"^tensorflow-cpu==(\S+)", (ROOT / "requirements/cpu.in").read_text(), re.M)
    gpu = re.search(r"^tensorflow\[and-cuda\]==(\S+)", (ROOT / "requirements/gpu.in").read_text(), re.M)
    assert cpu and gpu and cpu.group(1) == gpu.group(1) == stack.locked_versions(stack.GPU_LOCK)["tensorflow"]


def _write_locks(tmp_path: Path, cuda="12.5.82", cudnn="9.3.0.75", numpy_gpu="2.4.6", cpu_extra="", numpy_test="2.4.6"):
    h = "    --hash=sha256:" + "0" * 64
    gpu = tmp_path / "gpu.lock"
    gpu.write_text(
        f"tensorflow==2.21.0 \\\n{h}\nnvidia-cuda-runtime-cu12=={cuda} \\\n{h}\n"
        f"nvidia-cudnn-cu12=={cudnn} \\\n{h}\nnumpy=={numpy_gpu} ; python_full_version >= '3.11' \\\n{h}\n"
        f"numpy==2.2.6 ; python_full_version < '3.11' \\\n{h}\n"
    )
    cpu = tmp_path / "cpu.lock"
    cpu.write_text(
        f"tensorflow-cpu==2.21.0 \\\n{h}\nNumPy==2.4.6 ; python_full_version >= '3.11' \\\n{h}\n"
        f"numpy==2.2.6 ; python_full_version < '3.11' \\\n{h}\n{cpu_extra}"
    )
    test = tmp_path / "test.lock"
    test.write_text(f"pytest==9.2.0 \\\n{h}\nnumpy=={numpy_test} ; python_full_version >= '3.11' \\\n{h}\n")
    return cpu, gpu, test


def test_check_locks_accepts_a_consistent_pair(tmp_path):
    assert stack.check_locks(*_write_locks(tmp_path))[1] == []


def test_check_locks_reports_a_cuda_upgrade_that_breaks_the_match(tmp_path):
    _, problems = stack.check_locks(*_write_locks(tmp_path, cuda="12.9.79", cudnn="9.28.0.42"))
    assert len(problems) == 2
    assert "nvidia-cuda-runtime-cu12==12.9.79" in problems[0] and "CUDA 12.5" in problems[0]
    assert "cuDNN 9.3" in problems[1]


def test_check_locks_reports_diverging_shared_versions_and_cuda_on_cpu(tmp_path):
    cuda_line = "nvidia-cublas-cu12==12.5.3.2 \\\n    --hash=sha256:" + "1" * 64 + "\n"
    _, problems = stack.check_locks(*_write_locks(tmp_path, numpy_gpu="2.5.5", cpu_extra=cuda_line))
    assert any("numpy is 2.4.6" in p and "Python 3.11" in p for p in problems)
    assert any("would download CUDA packages: nvidia-cublas-cu12" in p for p in problems)


def test_check_locks_reports_a_test_lock_that_would_change_a_runtime_version(tmp_path):
    _, problems = stack.check_locks(*_write_locks(tmp_path, numpy_test="2.5.0"))
    assert any("numpy is 2.5.0 in" in p and "test.lock" in p and "gpu.lock" in p for p in problems)
    assert any("numpy is 2.5.0 in" in p and "cpu.lock" in p for p in problems)


def test_unknown_tensorflow_version_names_the_fix():
    with pytest.raises(StackError, match=r"TensorFlow 2\.99\.0 has no row in train/gpucheck/stack.py TESTED"):
        stack.stack_for("2.99.0")


def test_empty_lock_is_an_error_that_says_how_to_fix_it(tmp_path):
    (tmp_path / "empty.lock").write_text("# nothing\n")
    with pytest.raises(StackError, match="invoke lock"):
        stack.read_lock(tmp_path / "empty.lock")


def test_a_lock_line_is_read_as_pip_reads_it(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text(
        "-c other.lock\nTensorFlow[and-cuda]==2.21.0 ; python_version >= '3.10' and sys_platform == 'linux' \\\n"
        "    --hash=sha256:" + "0" * 64 + "\n    # via -r requirements/core.in\nzope.interface==7.2 \\\n"
    )
    pins = stack.read_lock(lock)
    assert [(p.name, p.version) for p in pins] == [("tensorflow", "2.21.0"), ("zope-interface", "7.2")]
    assert stack.locked_versions(lock, "3.11") == {"tensorflow": "2.21.0", "zope-interface": "7.2"}
    assert stack.locked_versions(lock, "3.9") == {"zope-interface": "7.2"}  # the marker is evaluated


@pytest.mark.parametrize(
    "line, why",
    [("numpy>=2 \\", "does not pin one version"), ("numpy==2.4.6 ; python_version >>> '3'", "is not a requirement")],
)
def test_a_line_that_is_no_pin_names_the_file_the_line_and_the_fix(tmp_path, line, why):
    lock = tmp_path / "x.lock"
    lock.write_text(f"# header\n{line}\n")
    with pytest.raises(StackError, match=f"x.lock, line 2: .*{why}.*invoke lock"):
        stack.read_lock(lock)


def test_main_prints_the_stack(capsys):
    assert stack.main() == 0
    out = capsys.readouterr().out
    assert "TensorFlow 2.21.0 | CUDA 12.5" in out and "driver >= 525.60.13" in out


def test_installed_tensorflow_was_built_with_the_tested_cuda():
    """In the GPU image: the wheel's own build info agrees with the table (skipped for CPU builds)."""
    tf = pytest.importorskip("tensorflow")
    info = tf.sysconfig.get_build_info()
    if not info.get("is_cuda_build"):
        pytest.skip("a CPU-only TensorFlow build (tensorflow-cpu) has no CUDA to compare")
    tested = stack.stack_for(tf.__version__)
    assert stack.major_minor(info["cuda_version"]) == tested.cuda
    assert str(info["cudnn_version"]).split(".")[0] == tested.cudnn.split(".")[0]


def test_describe_names_the_driver_floor_for_gpus_newer_than_the_machine_code():
    # H100/H200 and newer run TensorFlow's kernels from CUDA 12.5 PTX: 525.60.13 is not enough there.
    text = stack.describe()
    assert "NVIDIA driver >= 525.60.13 (compute capability <= 8.9), >= 555.42.06 (newer GPUs)" in text
