"""Which processes train together: TF_CONFIG as TensorFlow defines it, or WORKERS + WORKER_INDEX.

Plain Python (no TensorFlow import), so a malformed cluster is refused in milliseconds with exit 2.
TF_CONFIG is what Kubeflow's TFJob, Vertex AI and most cluster recipes set:

    {"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}

(a "chief" job of one task may come first; it is then worker 0). For hand-made clusters
WORKERS=host1:2222,host2:2222 and WORKER_INDEX=0 build the same thing. When none of those is set,
a SkyPilot job's own SKYPILOT_NODE_IPS (one IP a line, head node first) and SKYPILOT_NODE_RANK
build it too, every node's worker on SKYPILOT_PORT. Worker 0 is the chief: the only process that
writes the run directory.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError

_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_HOST = re.compile(r"^[A-Za-z0-9_.-]+$")
JOBS = ("chief", "worker")
# SkyPilot names the nodes, not a port: every node's worker listens on this one (the port the
# Kubernetes manifests use). Another port: set WORKERS yourself, it wins over SkyPilot's variables.
SKYPILOT_PORT = 2222


@dataclass(frozen=True)
class Cluster:
    workers: tuple[str, ...] = ()  # host:port of every process, chief first; empty: a single process
    index: int = 0  # this process's place in `workers`
    source: str = ""  # TF_CONFIG | WORKERS | "" (one process)

    @property
    def size(self) -> int:
        return max(len(self.workers), 1)

    @property
    def multi(self) -> bool:
        return len(self.workers) > 1

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    def tf_config(self) -> str:
        """TF_CONFIG for TensorFlow's cluster resolver (built from WORKERS / WORKER_INDEX)."""
        return json.dumps({"cluster": {"worker": list(self.workers)}, "task": {"type": "worker", "index": self.index}})

    def tf_config_for(self, environ: Mapping[str, str]) -> str:
        """The TF_CONFIG TensorFlow is given: the launcher's own as it came, else one built from the cluster."""
        return environ["TF_CONFIG"] if self.source == "TF_CONFIG" else self.tf_config()

    def join(self):
        """TensorFlow's join (train.workers.strategy): the strategy, once every worker has started."""
        from .strategy import join_cluster

        return join_cluster(self)

    def describe(self) -> str:
        if not self.multi:
            return "cluster: one process"
        return f"cluster: worker {self.index} of {len(self.workers)} ({self.source}), chief {self.workers[0]}"

    @property
    def port(self) -> int:
        """This worker's port: TensorFlow listens on it on every interface of the host."""
        return int(self.workers[self.index].rsplit(":", 1)[1])

    @property
    def on_loopback(self) -> bool:
        """Every worker on this host's loopback (127.0.0.1, localhost, ::1)."""
        return all(_host_key(a.rsplit(":", 1)[0]) == _LOOPBACK for a in self.workers)

    def exposure_warning(self) -> str:
        """One line for the log: TensorFlow's training server cannot be bound to the address given."""
        where = (
            f"{self.source} names loopback addresses, but"
            if self.on_loopback
            else "the workers talk over the network and"
        )
        return (
            f"WARNING: {where} TensorFlow's training server (gRPC, no authentication) listens on port "
            f"{self.port} of every network interface of this host: keep these ports reachable only by the other "
            "workers (firewall, private network; docs/distributed.md#network)"
        )


_LOOPBACK = "<loopback>"


def _host_key(host: str) -> str:
    """A host as a duplicate check compares it: names ignore case and a final dot, IP addresses are
    compared as addresses (an IPv4-mapped one, [::ffff:10.0.0.2], as its IPv4 address), and every name
    of this host's loopback is one host (TensorFlow binds the port on every interface, so two workers
    on 127.0.0.1:P and localhost:P are one port)."""
    host = host.strip("[]").rstrip(".").lower()
    if host in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"):
        return _LOOPBACK
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    ip = getattr(ip, "ipv4_mapped", None) or ip  # Python 3.11 calls [::ffff:127.0.0.1] no loopback
    return _LOOPBACK if ip.is_loopback or ip.is_unspecified else ip.compressed


def _check_unique(name: str, raw: str, addresses: list[str], labels: list[str]) -> None:
    """Two entries for one host:port would make the join wait forever: refuse them up front."""
    seen: dict[tuple[str, int], int] = {}
    for i, address in enumerate(addresses):
        host, port = address.rsplit(":", 1)
        key = (_host_key(host), int(port))
        if key in seen:
            j = seen[key]
            raise ConfigError(
                name,
                raw,
                f"{labels[j]} ({addresses[j]}) and {labels[i]} ({address}) are the same address: "
                "give each worker its own host:port",
            )
        seen[key] = i


def _check_address(name: str, raw: str, address: object) -> str:
    if not isinstance(address, str) or not _ADDRESS.match(address.strip()):
        # An IPv6 address has colons of its own: the port can only be told apart with brackets.
        text = address.strip() if isinstance(address, str) else ""
        host = next((h for h in (text.rsplit(":", 1)[0], text) if ":" in h and _is_ip(h)), "")
        hint = f", an IPv6 address in brackets: [{host}]:2222" if host else ""
        raise ConfigError(name, raw, f"{address!r} is not host:port (e.g. 10.0.0.2:2222{hint})")
    port = int(_ADDRESS.match(address.strip()).group(2))
    if not 1 <= port <= 65535:
        raise ConfigError(name, raw, f"port {port} in {address!r} is outside 1..65535")
    return address.strip()


def from_workers(workers: str, worker_index: int) -> Cluster:
    """WORKERS=host:port,... and WORKER_INDEX=N (-1: not set)."""
    if not workers.strip():
        if worker_index >= 0:
            raise ConfigError("WORKER_INDEX", worker_index, "set only together with WORKERS=host:port,host:port,...")
        return Cluster()
    addresses = [_check_address("WORKERS", workers, a) for a in workers.split(",") if a.strip()]
    if not addresses:  # only commas: "0..-1" for WORKER_INDEX would name the wrong setting
        raise ConfigError("WORKERS", workers, "lists no host:port: give host:port,host:port,... or leave it empty")
    _check_unique("WORKERS", workers, addresses, [f"entry {i}" for i in range(len(addresses))])
    if worker_index < 0:
        raise ConfigError(
            "WORKER_INDEX",
            worker_index,
            f"WORKERS lists {len(addresses)} workers: set WORKER_INDEX to this worker's place, 0..{len(addresses) - 1}",
        )
    if worker_index >= len(addresses):
        raise ConfigError(
            "WORKER_INDEX", worker_index, f"WORKERS lists {len(addresses)} workers: 0..{len(addresses) - 1}"
        )
    return Cluster(tuple(addresses), worker_index, "WORKERS")


def from_tf_config(raw: str) -> Cluster:
    """TF_CONFIG as TensorFlow defines it; only the chief and worker jobs are supported."""
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError("TF_CONFIG", raw, f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ConfigError("TF_CONFIG", raw, 'expected {"cluster": {"worker": ["host:port", ...]}, "task": {...}}')
    cluster, task = config["cluster"], config.get("task")
    other = sorted(set(cluster) - set(JOBS))
    if other:
        raise ConfigError("TF_CONFIG", raw, f"job(s) {', '.join(other)} are not supported: use chief and worker only")
    jobs = {}
    for job in JOBS:
        addresses = cluster.get(job, [])
        if not isinstance(addresses, list):
            raise ConfigError("TF_CONFIG", raw, f'cluster.{job} must be a list of "host:port"')
        jobs[job] = [_check_address("TF_CONFIG", raw, a) for a in addresses]
    if len(jobs["chief"]) > 1:
        raise ConfigError("TF_CONFIG", raw, "at most one chief")
    everyone = jobs["chief"] + jobs["worker"]
    if not everyone:
        raise ConfigError("TF_CONFIG", raw, "the cluster lists no worker")
    labels = [f"cluster.{job}[{i}]" for job in JOBS for i in range(len(jobs[job]))]
    _check_unique("TF_CONFIG", raw, everyone, labels)
    if (
        not isinstance(task, dict)
        or task.get("type") not in JOBS
        or not isinstance(task.get("index"), int)
        or isinstance(task.get("index"), bool)
    ):
        raise ConfigError("TF_CONFIG", raw, 'task must be {"type": "worker" or "chief", "index": N}')
    kind, index = task["type"], task["index"]
    if not 0 <= index < len(jobs[kind]):
        raise ConfigError(
            "TF_CONFIG", raw, f"task index {index} is out of range: cluster.{kind} has {len(jobs[kind])} entries"
        )
    return Cluster(tuple(everyone), index + (len(jobs["chief"]) if kind == "worker" else 0), "TF_CONFIG")


def from_skypilot(node_ips: str, node_rank: str | None) -> Cluster:
    """SKYPILOT_NODE_IPS (one IP a line, head node first) and SKYPILOT_NODE_RANK, as SkyPilot sets
    them on every node of a job; the head node (rank 0) is the chief. One node: one process."""
    lines = [line.strip() for line in node_ips.splitlines() if line.strip()]
    for i, host in enumerate(lines):  # blank lines are not nodes: ranks count the others
        if not _HOST.match(host) and not _is_ip(host):
            raise ConfigError(
                "SKYPILOT_NODE_IPS",
                node_ips,
                f"node {i} ({host!r}) is not an IP address or host name: one node a line, as SkyPilot sets it",
            )
    addresses = [f"[{h}]:{SKYPILOT_PORT}" if ":" in h else f"{h}:{SKYPILOT_PORT}" for h in lines]
    _check_unique("SKYPILOT_NODE_IPS", node_ips, addresses, [f"node {i}" for i in range(len(lines))])
    span = f"SKYPILOT_NODE_IPS lists {len(lines)} node{'s' if len(lines) > 1 else ''}: expected 0..{len(lines) - 1}"
    if node_rank is None or not node_rank.strip():
        raise ConfigError(
            "SKYPILOT_NODE_RANK",
            node_rank or "",
            f"{span} (SkyPilot sets it on each node; by hand, set WORKERS and WORKER_INDEX instead)",
        )
    try:
        rank = int(node_rank.strip())
    except ValueError:
        raise ConfigError("SKYPILOT_NODE_RANK", node_rank, f"not a whole number; {span}") from None
    if not 0 <= rank < len(lines):
        raise ConfigError("SKYPILOT_NODE_RANK", node_rank, span)
    if len(lines) == 1:
        return Cluster()
    return Cluster(tuple(addresses), rank, "SKYPILOT_NODE_IPS")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def read_cluster(workers: str, worker_index: int, environ: Mapping[str, str]) -> Cluster:
    """The cluster from the settings and the environment; ConfigError naming the setting.

    TF_CONFIG, else WORKERS / WORKER_INDEX, else SkyPilot's SKYPILOT_NODE_IPS / SKYPILOT_NODE_RANK
    (set in every SkyPilot job, so either of the others, when given, wins over them)."""
    raw = environ.get("TF_CONFIG", "").strip()
    if raw and workers.strip():
        raise ConfigError(
            "WORKERS",
            workers,
            "TF_CONFIG is set too: use one of them (TF_CONFIG wins in most launchers; unset WORKERS)",
        )
    if raw:
        if worker_index >= 0:
            raise ConfigError(
                "WORKER_INDEX", worker_index, "TF_CONFIG names this worker's index already: unset WORKER_INDEX"
            )
        return from_tf_config(raw)
    if workers.strip() or worker_index >= 0 or not environ.get("SKYPILOT_NODE_IPS", "").strip():
        return from_workers(workers, worker_index)
    return from_skypilot(environ["SKYPILOT_NODE_IPS"], environ.get("SKYPILOT_NODE_RANK"))
