"""train/__init__.py: Keras's plotting helpers do not pull matplotlib into every start; everyone else still gets it."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import subprocess_env

CHILD = """
import json, sys
import train, tensorflow, keras
at_start = sorted(m for m in sys.modules if m.split(".")[0] == "matplotlib")
import matplotlib.pyplot as plt  # a user's own code (a model factory, a notebook) imports it as usual
print(json.dumps({"at_start": at_start, "pyplot": plt.__name__, "keras": keras.__version__}))
"""


def test_tensorflow_starts_without_matplotlib_and_user_code_still_imports_it():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["at_start"] == [] and out["pyplot"] == "matplotlib.pyplot"
