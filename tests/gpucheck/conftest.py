"""Each test of the GPU check starts with an empty CUDA-version cache.

gpuinfo keeps the CUDA version nvidia-smi gave per driver version for the life of the process (it
cannot change while the driver is loaded); in one pytest process a test's fake nvidia-smi would
otherwise answer for every later test that fakes the same driver.
"""

from __future__ import annotations

import pytest

from train.gpucheck import gpuinfo


@pytest.fixture(autouse=True)
def fresh_cuda_version_cache(monkeypatch):
    monkeypatch.setattr(gpuinfo, "_cuda_cache", {})
