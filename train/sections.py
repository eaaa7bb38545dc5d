"""How a setting is declared: `setting(...)` on a field of a frozen dataclass, the core's or an extra's.

train.config joins the core's fields and each installed extra's section (`<extra>/settings.py`,
found through train.extras) into one Settings class, so every setting stays one flat attribute and
one UPPER_CASE variable wherever it is declared. This module imports nothing of the package: an
extra's settings module imports it without importing the settings it is part of.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

# What a setting is to a resume and to a comparison of runs: said once, on its declaration (`kind=`).
KINDS = {
    "result": "changes what is trained: a resume must be given the run's value, reproduce and compare list it",
    "free": "does not change the result (EPOCHS, PATIENCE, ...): a resume may change it; still listed when compared",
    "surroundings": "where the run lives and what is around training (RUNS_DIR, the budget, the export): "
    "free on resume, and a rerun by reproduce does not compare it",
    "label": "the run's own name: reproduce and compare do not compare it (the rerun has its own; compare's "
    "columns are named by it)",
    "invocation": "how this start was asked for (RESUME, PROGRESS, DEBUG): free on resume, compared nowhere",
}


# The optional rules setting() takes besides its kind (`minimum=` would be a bound never checked).
RULES = ("choices", "min", "max", "url", "recorded_before")


def setting(default: Any, doc: str, kind: str = "result", **kw: Any) -> Any:
    """A setting's field: its default, the one line `.env.example` and the README show, its kind.

    Optional rules, checked by train.config before anything runs: `choices=`, `min=`, `max=`;
    `url=True` (the value may carry a credential: every message and dump masks it);
    `recorded_before=` (the value that gives what a run saved before the setting existed did)."""
    # The kind and the rules' names are checked by train.config, which knows the field's name.
    return field(default=default, metadata={"doc": doc, "kind": kind, **kw})
