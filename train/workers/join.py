"""Joining a cluster: wait in Python until every other worker has started, then let TensorFlow join.

TensorFlow's own join (building MultiWorkerMirroredStrategy) blocks in C++: a worker that never
starts keeps it waiting without a word and deaf to SIGTERM/SIGINT. So each worker first holds its
own port (the one TensorFlow binds a moment later, so a port in use is found here, in one line) and
exchanges one line with every other worker: `tf-train-join <index> <cluster digest> <address>
<settings> <commit> <changes>`, the settings a short hash of each setting every worker must share
(train.workers.settings.shared), the commit the code's ("-" when neither git nor the image knows it),
the changes a short hash of the checkout's uncommitted changes ("clean" when it has none, "?" when
unknown: an image). One exchange, in either direction, tells both ends that the other is up and has
the same cluster, settings and code; other settings, or another commit or other uncommitted changes
where both know theirs, stop both ends with one line naming them. Only when every other worker has
been met does the port go to TensorFlow, whose join is then short.

While it waits, the worker logs who is missing every JOIN_REPORT_SECONDS, a stop (SIGTERM, Ctrl-C,
MAX_MINUTES) ends it with `Interrupted` (nothing was trained, nothing is lost), and after
JOIN_TIMEOUT seconds it gives up with `WorkersMissingError` naming the missing workers.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import socket
import threading
import time
from collections.abc import Mapping

from ..errors import ConfigError, Interrupted, WorkerLostError
from . import PortInUseError
from .cluster import Cluster

log = logging.getLogger("train")

MAGIC = "tf-train-join"
JOIN_REPORT_SECONDS = 30  # how often the missing workers are logged (the first time at once)
CONNECT_SECONDS = 1.0  # one connection attempt to another worker
LINE_SECONDS = 3.0  # for the other end's line, once connected
POLL_SECONDS = 0.5  # between rounds: a stop request is seen within this
ACCEPT_SECONDS = 0.2  # how often the listener looks whether the join is over, where closing it does not wake it


class WorkersMissingError(WorkerLostError):
    """Several workers: the others did not all start within JOIN_TIMEOUT."""


def digest(cluster: Cluster) -> str:
    """The same on every worker of one cluster (the addresses, in order)."""
    return hashlib.sha256("\n".join(cluster.workers).encode()).hexdigest()[:16]


def settings_token(shared: Mapping[str, object]) -> str:
    """Six hex digits a setting, in the order of its name: short enough for one line whatever the
    number of settings, and each setting that differs can still be named."""
    return "-".join(hashlib.sha256(f"{k}={shared[k]!r}".encode()).hexdigest()[:6] for k in sorted(shared)) or "-"


Code = tuple  # (commit or None, changes): this worker's code as its line tells it
UNKNOWN_CODE: Code = (None, "?")


def _line(cluster: Cluster, token: str, code: Code = UNKNOWN_CODE) -> bytes:
    commit, changes = code
    me = f"{cluster.index} {digest(cluster)} {cluster.workers[cluster.index]} {token} {commit or '-'} {changes}"
    return f"{MAGIC} {me}\n".encode()


def _parse(raw: bytes) -> tuple[int, str, str, str, str | None, str] | None:
    """(index, cluster digest, address, settings token, commit, changes); the token is "" and the
    commit None from a version of this template that sent none, which is refused by name rather than
    taken for another program; the commit "-" when unknown there, the changes "?"."""
    parts = raw.decode("ascii", "replace").split()
    if len(parts) not in (4, 5, 6, 7) or parts[0] != MAGIC or not parts[1].isdigit():
        return None
    parts += [""] * (7 - len(parts))
    return int(parts[1]), parts[2], parts[3], parts[4], parts[5] or None, parts[6] or "?"


def _refusal(
    cluster: Cluster, j: int, name: str, shared: Mapping[str, object], code: Code, got: tuple
) -> ConfigError | None:
    """Worker j's line `got` (as _parse reads it) against this worker's settings and code: the error
    that stops both ends, or None when they may train together."""
    return (
        _other_settings(cluster, j, name, shared, got[3])
        or _other_code(cluster, j, name, code[0], got[4])
        or _other_changes(cluster, j, name, code, got[4:])
    )


def _other_code(cluster: Cluster, j: int, name: str, mine: str | None, theirs: str | None) -> ConfigError | None:
    """The error for worker j running another commit (None: the same, or either does not know its own:
    an image built without GIT_COMMIT beside a git checkout is not refused)."""
    if theirs is None:  # a version from before the commit was sent: it is other code whatever its commit
        return ConfigError(
            name,
            cluster.workers[j],
            f"worker {j} there runs an older version of this template, which does not compare the commits at "
            "the join: start every worker from the same version (commit or image)",
        )
    if not mine or theirs == "-" or theirs.startswith(mine) or mine.startswith(theirs):
        return None  # one may be short: an image built with GIT_COMMIT=$(git rev-parse --short HEAD)
    return ConfigError(
        name,
        cluster.workers[j],
        f"worker {j} there runs commit {theirs[:12]}, this one {mine[:12]}: the same settings can train "
        "another model or read the data otherwise; start every worker from the same commit (or image)",
    )


def _other_changes(cluster: Cluster, j: int, name: str, mine: Code, theirs: tuple) -> ConfigError | None:
    """The error for worker j whose checkout has other uncommitted changes on the same commit (None:
    the same, or either does not know: an image built from a checkout that may have had some)."""
    # Reached only when _other_code let the commits pass: the same, or one unknown ("-" there, None here).
    if not mine[0] or theirs[0] == "-" or "?" in (mine[1], theirs[1]) or mine[1] == theirs[1]:
        return None

    def told(changes: str) -> str:
        return "no uncommitted changes" if changes == "clean" else f"uncommitted changes {changes}"

    return ConfigError(
        name,
        cluster.workers[j],
        f"worker {j} there runs commit {mine[0][:12]} with {told(theirs[1])}, this one with {told(mine[1])}: the "
        "same settings can train another model or read the data otherwise; commit the changes and start every "
        "worker from that commit (or image)",
    )


def _other_settings(
    cluster: Cluster, j: int, name: str, shared: Mapping[str, object], theirs: str
) -> ConfigError | None:
    """The error for worker j started with other shared settings than this one (None: the same)."""
    if not theirs:
        return ConfigError(
            name,
            cluster.workers[j],
            f"worker {j} there runs an older version of this template, which does not compare the settings "
            "at the join: start every worker from the same version (commit or image)",
        )
    names, mine = sorted(shared), settings_token(shared).split("-")
    other = theirs.split("-")
    if len(other) != len(mine):
        # Another version of the template compares other settings: naming every setting as different
        # would send the user to compare settings that are all the same.
        return ConfigError(
            name,
            cluster.workers[j],
            f"worker {j} there compares {len(other)} settings at the join, this one {len(mine)}: it runs another "
            "version of this template; start every worker from the same version (commit or image)",
        )
    differ = [n for n, a, b in zip(names, mine, other) if a != b]
    if not differ:
        return None
    return ConfigError(
        differ[0].upper(),
        shared[differ[0]],
        f"worker {j} ({cluster.workers[j]}) was started with another {', '.join(n.upper() for n in differ)}: give "
        "every worker the same settings (only WORKER_INDEX and where its files are, e.g. RUNS_DIR and "
        "DATA_DIR, may differ; BATCH_SIZE and PRECISION are the chief's)",
    )


def _read_line(conn: socket.socket) -> bytes:
    """Our line, or the first bytes of whatever else answers."""
    magic = MAGIC.encode()
    data = conn.recv(512)
    while data and data[: len(magic)] == magic[: len(data)] and not data.endswith(b"\n") and len(data) < 512:
        chunk = conn.recv(512)
        if not chunk:
            break
        data += chunk
    return data


def _is_grpc(data: bytes) -> bool:
    """An HTTP/2 SETTINGS frame on stream 0: what TensorFlow's gRPC server sends first on a connection."""
    return len(data) >= 9 and data[3] == 0x04 and data[5:9] == b"\0\0\0\0"


def _bind(port: int) -> socket.socket:
    """Listen on `port` the way TensorFlow's gRPC server will: every interface, IPv6 and IPv4."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 in this kernel or container
            continue
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(16)
            return sock
        except OSError as exc:
            sock.close()
            if family == socket.AF_INET6 and exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                continue  # IPv6 switched off: TensorFlow falls back to 0.0.0.0 too
            raise
    raise OSError(errno.EAFNOSUPPORT, "neither IPv6 nor IPv4 sockets are available")


class _Listener:
    """This worker's port until TensorFlow takes it: answers every other worker's line with its own."""

    def __init__(self, cluster: Cluster, name: str, shared: Mapping[str, object], code: Code):
        self.cluster, self.name, self.met, self.shared, self.code = cluster, name, set(), shared, code
        self.refused: ConfigError | None = None  # a worker of this cluster with other settings
        # Callers of another cluster, by address: that worker refuses itself and exits, while this one
        # would wait out JOIN_TIMEOUT for a worker that will never come without a word of why.
        self.strangers: dict[str, int] = {}
        address = cluster.workers[cluster.index]
        try:
            self.sock = _bind(cluster.port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(name, address, cluster.port) from None
            raise ConfigError(
                name, address, f"this worker cannot listen on port {cluster.port} ({exc.strerror}): choose another"
            ) from None
        self.sock.settimeout(ACCEPT_SECONDS)
        self._lock, self._done = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._serve, name="join-listener", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(LINE_SECONDS)
                    conn.sendall(_line(self.cluster, settings_token(self.shared), self.code))
                    got = _parse(_read_line(conn))
                    conn.recv(1)  # the other end closes first: no TIME_WAIT left on this port for TensorFlow
                except OSError:
                    continue
            # A worker of another cluster (another digest) is not one of ours: it refuses itself.
            if got and got[1] != digest(self.cluster) and got[2] not in self.strangers:
                with self._lock:
                    self.strangers[got[2]] = got[0]
                log.warning("%s", self.stranger_line(got[2]))
            elif got and got[1] == digest(self.cluster) and 0 <= got[0] < len(self.cluster.workers):
                # Told here too, not only to the worker that called: both ends stop, neither waits on.
                refused = _refusal(self.cluster, got[0], self.name, self.shared, self.code, got)
                with self._lock:
                    self.met.add(got[0])
                    self.refused = self.refused or refused

    def stranger_line(self, address: str) -> str:
        return (
            f"a worker of another cluster called from {address} (its worker {self.strangers[address]}, with "
            f"another {self.name}); it stops itself: give every worker the same {self.name}"
        )

    def stranger_lines(self) -> list[str]:
        with self._lock:
            return [self.stranger_line(address) for address in self.strangers]

    def seen(self) -> set[int]:
        with self._lock:
            if self.refused is not None:
                raise self.refused
            return set(self.met)

    def close(self) -> None:
        self._done.set()
        try:  # wakes the accept under way (Linux): the port is TensorFlow's at once, not at the next look
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # a listening socket is not connected (macOS): the accept's timeout ends it
        self.sock.close()
        self._thread.join(timeout=5)


def _probe(cluster: Cluster, j: int, name: str, shared: Mapping[str, object], code: Code) -> str:
    """'met' (ours, or TensorFlow's server), 'absent' (nothing listens there yet), 'unresolved' (the
    host name does not resolve) or 'foreign'."""
    host, port = cluster.workers[j].rsplit(":", 1)
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS)
    except socket.gaierror:  # a name no resolver knows: a typo, or a pod's DNS name not published yet
        return "unresolved"
    except OSError:  # refused, unreachable, timed out
        return "absent"
    try:
        with conn:
            conn.settimeout(LINE_SECONDS)
            first = _read_line(conn)
            got = _parse(first)
            if got is None:
                # TensorFlow's server: that worker met everyone and is in TensorFlow's join, waiting
                # for this one (it was restarted since, or met it a moment ago). Anything else is not ours.
                return "met" if _is_grpc(first) else "foreign"
            conn.sendall(_line(cluster, settings_token(shared), code))
    except TimeoutError:  # connected, then silence: ours and TensorFlow's server speak first, an HTTP server waits
        return "foreign"
    except OSError:  # reset or closed on the way
        return "absent"
    if got[1] != digest(cluster):
        raise ConfigError(
            name,
            cluster.workers[j],
            f"the worker there was started with another cluster ({got[2]} is its worker {got[0]}): "
            f"give every worker the same {name}",
        )
    if got[0] != j:
        # Two workers given one index (a .env copied from host to host) would both enter TensorFlow's
        # join as that task, where they wait for ever: refused here, on each of them.
        setting = _INDEX_SETTING.get(name, name)
        raise ConfigError(
            setting,
            cluster.index if setting == "WORKER_INDEX" else cluster.workers[cluster.index],
            f"the worker at {cluster.workers[j]} says it is worker {got[0]} ({got[2]}), not worker {j}: "
            f"give each worker its own {setting}, its place in {name}",
        )
    refused = _refusal(cluster, j, name, shared, code, got)
    if refused is not None:
        raise refused
    return "met"


def _log_waiting(cluster: Cluster, missing: list[int], status, waited: float, timeout: float, unresolved: str):
    foreign = _foreign(cluster, missing, status)
    log.info(
        "waiting for %s to start (%.0f s%s)%s%s",
        _who(cluster, missing),
        waited,
        f" of JOIN_TIMEOUT={timeout:g} s" if timeout else "",
        f"; {foreign}" if foreign else "",
        f"; {unresolved}" if unresolved else "",
    )


def _foreign(cluster: Cluster, missing: list[int], status: Mapping[int, str]) -> str:
    """What the wait and its timeout add for a missing worker whose port another program answers on."""
    foreign = [j for j in missing if status.get(j) == "foreign"]
    return f"another program answers at {_who(cluster, foreign)}" if foreign else ""


# The setting that gives a worker its place in the cluster named by each source.
_INDEX_SETTING = {"WORKERS": "WORKER_INDEX", "SKYPILOT_NODE_IPS": "SKYPILOT_NODE_RANK"}


def _who(cluster: Cluster, missing: list[int]) -> str:
    return ", ".join(f"worker {j} ({cluster.workers[j]})" for j in missing)


def _unresolved(cluster: Cluster, missing: list[int], status: Mapping[int, str], name: str) -> str:
    """What the wait and its timeout add for a missing worker whose host name does not resolve here: a
    typo in WORKERS would otherwise be waited for as a worker that is late, for all of JOIN_TIMEOUT."""
    hosts = [cluster.workers[j].rsplit(":", 1)[0] for j in missing if status.get(j) == "unresolved"]
    if not hosts:
        return ""
    return f"{', '.join(hosts)} {'does' if len(hosts) == 1 else 'do'} not resolve here (yet): check {name}"


def wait_for_workers(
    cluster: Cluster,
    timeout: float,
    stop,
    name: str,
    shared: Mapping[str, object] | None = None,
    commit: str | None = None,
    changes: str = "?",
) -> None:
    """Return once every other worker of `cluster` has started; see the module docstring.

    `timeout` in seconds (0: no limit); `stop` a train.training.stop_flag.StopFlag; `name` the setting that
    made the cluster (WORKERS or TF_CONFIG), for the messages; `shared` the settings every worker
    must have alike, by name; `commit` this worker's code (None: unknown, compared with none), `changes`
    its uncommitted changes ("clean", a short hash of them, or "?": unknown, compared with none)."""
    shared = dict(shared or {})
    code = ("".join((commit or "").split()) or None, changes)  # one word of the line, whatever GIT_COMMIT was
    listener = _Listener(cluster, name, shared, code)
    try:
        started, reported = time.monotonic(), None
        met: set[int] = set()
        while True:
            met |= listener.seen()
            status = {}
            for j in range(len(cluster.workers)):
                if j != cluster.index and j not in met:
                    status[j] = _probe(cluster, j, name, shared, code)
                    if status[j] == "met":
                        met.add(j)
            missing = [j for j in range(len(cluster.workers)) if j != cluster.index and j not in met]
            if not missing:
                log.info("joined: every worker of %d has started", len(cluster.workers))
                return
            if stop.check():
                raise Interrupted(
                    f"{stop.reason} while waiting for {_who(cluster, missing)}: nothing was trained, so nothing "
                    "is lost; start every worker again"
                )
            waited = time.monotonic() - started
            unresolved = _unresolved(cluster, missing, status, name)
            if timeout and waited >= timeout:
                why = "; ".join(
                    filter(None, [unresolved, _foreign(cluster, missing, status), *listener.stranger_lines()])
                )
                raise WorkersMissingError(
                    f"{_who(cluster, missing)} did not start within JOIN_TIMEOUT={timeout:g} s"
                    f"{f' ({why})' if why else ''}: start "
                    f"{'it' if len(missing) == 1 else 'them'} with the same {name}, check the host:port and that "
                    "it is reachable from here, or raise JOIN_TIMEOUT"
                )
            if reported is None or time.monotonic() - reported >= JOIN_REPORT_SECONDS:
                _log_waiting(cluster, missing, status, waited, timeout, unresolved)
                reported = time.monotonic()
            time.sleep(POLL_SECONDS)
    finally:
        listener.close()
