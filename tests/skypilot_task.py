"""Read a SkyPilot task YAML with SkyPilot's own loader, offline, and write what it understood as JSON.

Run by SkyPilot's interpreter (.venv-skypilot), not by the suite's: tests/test_deploy_skypilot.py
starts it. The loader is the one `sky jobs launch` uses (dag_utils.load_chain_dag_from_yaml:
SkyPilot's schema check, envs, secrets, resources). Any connection or DNS lookup raises before it
leaves this process, so a loader that went online would fail the test instead of passing quietly.

    python tests/skypilot_task.py TASK.yaml OUT.json '[{"envs": {...}, "secrets": {...}}, ...]'

OUT.json holds one result per set of overrides, in their order: several reads pay for one import of
SkyPilot (seconds), and each read is the loader's alone (it is given the YAML's path and the overrides).
"""

from __future__ import annotations

import json
import socket
import sys


def _offline(what: str):
    raise OSError(f"network access attempted while reading the task YAML: {what}")


socket.socket.connect = lambda self, address: _offline(f"connect to {address}")
socket.socket.connect_ex = lambda self, address: _offline(f"connect to {address}")
socket.getaddrinfo = lambda host, port, *args, **kwargs: _offline(f"look up {host}:{port}")
socket.create_connection = lambda address, *args, **kwargs: _offline(f"connect to {address}")


def main(path: str, out: str, overrides: str) -> None:
    results = [read(path, given) for given in json.loads(overrides)]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f)


def read(path: str, given: dict) -> dict:
    from sky.utils import dag_utils

    try:
        dag = dag_utils.load_chain_dag_from_yaml(
            path,
            env_overrides=list(given.get("envs", {}).items()),
            secret_overrides=list(given.get("secrets", {}).items()),
        )
    except ValueError as exc:  # SkyPilot's refusal of the YAML, as `sky jobs launch` shows it
        result = {"error": str(exc)}
    else:
        (task,) = dag.tasks
        (resources,) = task.resources
        result = {
            "name": task.name,
            "num_nodes": task.num_nodes,
            "run": task.run,
            "envs": task.envs,
            "secrets": sorted(task.secrets),
            "secrets_at_launch": sorted(ref.name for ref in task.managed_secret_refs),
            "image_id": resources.image_id,
            "accelerators": resources.accelerators,
            "use_spot": resources.use_spot,
            "job_recovery": resources.job_recovery,
            "ports": resources.ports,
        }
    return result


if __name__ == "__main__":
    main(*sys.argv[1:])
