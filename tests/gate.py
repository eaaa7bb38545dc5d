"""A model factory that waits for a go file: MODEL=gate:dense16 with GATE_FILE=<path>.

Imported inside a training subprocess (tests/ is on its PYTHONPATH). The run holds its lock and
has written its record by the time the model is built, so a test can act on a run that is
certainly in progress, then create the file to let it train. No timing involved.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def dense16(input_shape, num_classes):
    from faults import dense16 as build

    go = Path(os.environ["GATE_FILE"])
    (go.parent / (go.name + ".waiting")).write_text(str(os.getpid()))  # the event the test waits for
    while not go.exists():
        time.sleep(0.01)
    return build(input_shape, num_classes)
