"""cluster: TF_CONFIG and WORKERS/WORKER_INDEX, read and refused before TensorFlow is imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import PROJECT_ROOT, subprocess_env

from train.config import load_settings
from train.errors import ConfigError
from train.workers.cluster import SKYPILOT_PORT, Cluster, from_tf_config, from_workers, read_cluster


def _tf_config(workers, index, chief=None, kind="worker"):
    cluster = {"worker": workers}
    if chief:
        cluster["chief"] = chief
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def test_no_cluster_is_one_process():
    c = read_cluster("", -1, {})
    assert c == Cluster() and not c.multi and c.is_chief and c.size == 1


def test_workers_and_index_build_tensorflows_tf_config():
    c = read_cluster("10.0.0.1:2222, 10.0.0.2:2222", 1, {})
    assert c.workers == ("10.0.0.1:2222", "10.0.0.2:2222") and c.index == 1 and not c.is_chief and c.size == 2
    assert json.loads(c.tf_config()) == {
        "cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    assert from_tf_config(c.tf_config()) == Cluster(c.workers, 1, "TF_CONFIG")


def test_tf_config_with_a_chief_job_puts_the_chief_first():
    raw = _tf_config(["w0:1", "w1:1"], 1, chief=["c:1"])
    assert from_tf_config(raw) == Cluster(("c:1", "w0:1", "w1:1"), 2, "TF_CONFIG")
    assert from_tf_config(_tf_config(["w0:1"], 0, chief=["c:1"], kind="chief")).is_chief


def test_tensorflow_is_given_a_launchers_tf_config_as_it_came_and_one_built_from_workers():
    """Rebuilt, a launcher's chief job would become a worker: TensorFlow would name its tasks otherwise."""
    raw = _tf_config(["w0:1"], 0, chief=["c:1"])
    assert read_cluster("", -1, {"TF_CONFIG": raw}).tf_config_for({"TF_CONFIG": raw}) == raw
    workers = read_cluster("c:1,w0:1", 1, {})
    assert workers.tf_config_for({}) == workers.tf_config()


def test_the_log_line_names_this_worker_the_source_and_the_chief():
    assert Cluster().describe() == "cluster: one process"
    assert from_workers("a:1,b:2,c:3", 2).describe() == "cluster: worker 2 of 3 (WORKERS), chief a:1"


@pytest.mark.parametrize(
    "workers, index, name, allowed",
    [
        ("a:1,b:2", -1, "WORKER_INDEX", "WORKERS lists 2 workers: set WORKER_INDEX to this worker's place, 0..1"),
        ("a:1,b:2", 2, "WORKER_INDEX", "WORKERS lists 2 workers: 0..1"),  # out of range
        ("a:1,b", 0, "WORKERS", "'b' is not host:port (e.g. 10.0.0.2:2222)"),  # missing port: no IPv6 hint
        (
            "::1:2222,::2:2222",
            0,
            "WORKERS",
            "'::1:2222' is not host:port (e.g. 10.0.0.2:2222, an IPv6 address in brackets: [::1]:2222)",
        ),
        (  # and no port
            "fd00::1,fd00::2",
            0,
            "WORKERS",
            "'fd00::1' is not host:port (e.g. 10.0.0.2:2222, an IPv6 address in brackets: [fd00::1]:2222)",
        ),
        ("a:1,b:99999", 0, "WORKERS", "port 99999 in 'b:99999' is outside 1..65535"),
        ("a:1,b:65536", 0, "WORKERS", "port 65536 in 'b:65536' is outside 1..65535"),
        (
            "a:1,a:1",
            0,
            "WORKERS",
            "entry 0 (a:1) and entry 1 (a:1) are the same address: give each worker its own host:port",
        ),
        (" , ", 0, "WORKERS", "lists no host:port: give host:port,host:port,... or leave it empty"),  # not WORKER_INDEX
        ("", 0, "WORKER_INDEX", "set only together with WORKERS=host:port,host:port,..."),
    ],
)
def test_bad_workers_name_the_setting(workers, index, name, allowed):
    with pytest.raises(ConfigError) as info:
        from_workers(workers, index)
    assert (info.value.name, info.value.value) == (name, index if name == "WORKER_INDEX" else workers)
    assert info.value.allowed == allowed


def test_the_ports_1_and_65535_are_allowed():
    assert from_workers("a:1,a:65535", 0).workers == ("a:1", "a:65535")


def _tf_cluster(cluster, task=None):
    return json.dumps({"cluster": cluster, "task": task or {"type": "worker", "index": 0}})


TASK = 'task must be {"type": "worker" or "chief", "index": N}'


@pytest.mark.parametrize(
    "raw, allowed",
    [
        ('{"cluster": {"worker": ["a:1"]', "not valid JSON (Expecting ',' delimiter at character 30)"),
        ('["a:1"]', 'expected {"cluster": {"worker": ["host:port", ...]}, "task": {...}}'),
        (_tf_config(["a:1", "b:1"], 2), "task index 2 is out of range: cluster.worker has 2 entries"),
        (_tf_config(["a:1", "b"], 0), "'b' is not host:port (e.g. 10.0.0.2:2222)"),
        (_tf_config(["a:1", 5], 0), "5 is not host:port (e.g. 10.0.0.2:2222)"),
        (_tf_cluster({"worker": "a:1"}), 'cluster.worker must be a list of "host:port"'),
        (
            _tf_cluster({"worker": ["a:1"], "ps": ["p:1"], "evaluator": ["e:1"]}),
            "job(s) evaluator, ps are not supported: use chief and worker only",
        ),
        (_tf_cluster({"worker": ["a:1"], "chief": ["c:1", "d:1"]}), "at most one chief"),
        (json.dumps({"cluster": {"worker": ["a:1"]}}), TASK),
        (_tf_cluster({"worker": ["a:1"]}, {"type": "worker", "index": True}), TASK),
        (_tf_cluster({"worker": ["a:1"]}, {"type": "evaluator", "index": 0}), TASK),
        (_tf_config([], 0), "the cluster lists no worker"),
    ],
)
def test_bad_tf_config_names_it(raw, allowed):
    with pytest.raises(ConfigError) as info:
        from_tf_config(raw)
    assert (info.value.name, info.value.value, info.value.allowed) == ("TF_CONFIG", raw, allowed)


@pytest.mark.parametrize(
    "workers, first, second",
    [
        ("LOCALHOST:2222,localhost:2222", "LOCALHOST:2222", "localhost:2222"),  # names ignore case
        ("h:2222,h:02222", "h:2222", "h:02222"),  # ports are numbers
        ("127.0.0.1:2222,localhost:2222", "127.0.0.1:2222", "localhost:2222"),  # one loopback
        ("10.0.0.1:1,[::1]:7,127.0.0.2:7", "[::1]:7", "127.0.0.2:7"),
        ("a:1,Host.Example.:5,host.example:5", "Host.Example.:5", "host.example:5"),  # a final dot
        ("[::ffff:10.0.0.1]:3,[::FFFF:a00:1]:3", "[::ffff:10.0.0.1]:3", "[::FFFF:a00:1]:3"),  # one IPv6 address
        ("127.0.0.1:7,localhost.localdomain:7", "127.0.0.1:7", "localhost.localdomain:7"),  # /etc/hosts' names
        ("[::1]:7,IP6-localhost:7", "[::1]:7", "IP6-localhost:7"),
        ("ip6-loopback:7,localhost:7", "ip6-loopback:7", "localhost:7"),
        ("10.0.0.1:3,[::ffff:10.0.0.1]:3", "10.0.0.1:3", "[::ffff:10.0.0.1]:3"),  # IPv4-mapped: the IPv4 address
        ("[::ffff:127.0.0.1]:7,localhost:7", "[::ffff:127.0.0.1]:7", "localhost:7"),
    ],
)
def test_one_address_written_two_ways_is_refused_naming_both_entries(workers, first, second):
    with pytest.raises(ConfigError) as info:
        from_workers(workers, 0)
    i, j = workers.split(",").index(first), workers.split(",").index(second)
    assert info.value.name == "WORKERS"
    assert f"entry {i} ({first}) and entry {j} ({second}) are the same address" in str(info.value)


def test_other_hosts_or_ports_are_not_duplicates():
    assert from_workers("10.0.0.1:2222,10.0.0.2:2222,127.0.0.1:2223,hostA:2222", 0).size == 4
    # Only the brackets and a final dot are dropped from a name, no other letter.
    assert from_workers("Xnode:1,nodeX:1,node:1", 0).size == 3


def test_the_chief_listed_again_as_a_worker_in_tf_config_is_refused():
    raw = _tf_config(["w0:1", "C:1"], 0, chief=["c:1"])
    with pytest.raises(ConfigError) as info:
        from_tf_config(raw)
    assert (info.value.name, info.value.value) == ("TF_CONFIG", raw)
    assert "cluster.chief[0] (c:1) and cluster.worker[1] (C:1) are the same address" in str(info.value)


def test_a_duplicate_address_exits_2_in_one_line_naming_both_entries(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "train", "fit"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=subprocess_env(WORKERS="localhost:2222,LOCALHOST:2222", WORKER_INDEX="1", PYTHONPATH=str(PROJECT_ROOT)),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("ConfigError: WORKERS=") and "entry 0 (localhost:2222) and entry 1 (LOCALHOST:2222)" in line


def test_the_exposure_warning_says_every_interface_for_loopback_and_network_clusters():
    local = from_workers("127.0.0.1:5000,localhost:5001,[::ffff:127.0.0.1]:5002", 1)
    remote = from_workers("10.0.0.1:2222,10.0.0.2:2222", 0)
    assert local.on_loopback and not remote.on_loopback
    assert "port 5001 of every network interface" in local.exposure_warning()
    assert "loopback addresses, but" in local.exposure_warning()
    assert remote.exposure_warning() == (
        "WARNING: the workers talk over the network and TensorFlow's training server (gRPC, no authentication) "
        "listens on port 2222 of every network interface of this host: keep these ports reachable only by the "
        "other workers (firewall, private network; docs/distributed.md#network)"
    )
    # The setting that named them: a launcher's TF_CONFIG holds no WORKERS to look for.
    tf_config = read_cluster("", -1, {"TF_CONFIG": _tf_config(["127.0.0.1:5000", "127.0.0.1:5001"], 0)})
    assert tf_config.exposure_warning().startswith("WARNING: TF_CONFIG names loopback addresses, but")


def test_tf_config_and_workers_together_are_refused():
    with pytest.raises(ConfigError) as info:
        read_cluster("a:1,b:1", -1, {"TF_CONFIG": _tf_config(["a:1", "b:1"], 0)})
    assert (info.value.name, info.value.value) == ("WORKERS", "a:1,b:1")
    assert (
        info.value.allowed == "TF_CONFIG is set too: use one of them (TF_CONFIG wins in most launchers; unset WORKERS)"
    )


def test_tf_config_and_worker_index_together_are_refused():
    with pytest.raises(ConfigError) as info:
        read_cluster("", 0, {"TF_CONFIG": _tf_config(["a:1", "b:1"], 1)})
    assert (info.value.name, info.value.value) == ("WORKER_INDEX", 0)
    assert info.value.allowed == "TF_CONFIG names this worker's index already: unset WORKER_INDEX"


def test_settings_check_the_cluster_and_that_the_batch_divides_by_the_workers():
    s = load_settings({"workers": "a:1,b:1", "worker_index": "1", "batch_size": "64"}, env_file=None, environ={})
    assert (s.workers, s.worker_index) == ("a:1,b:1", 1)
    with pytest.raises(ConfigError) as info:
        load_settings({"workers": "a:1,b:1,c:1", "worker_index": "0", "batch_size": "64"}, env_file=None, environ={})
    assert info.value.name == "BATCH_SIZE" and "multiple of 3" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_settings({}, env_file=None, environ={"TF_CONFIG": "{oops"})
    assert info.value.name == "TF_CONFIG"


@pytest.mark.parametrize(
    "env, name",
    [
        ({"TF_CONFIG": "{not json"}, "TF_CONFIG"),
        ({"TF_CONFIG": _tf_config(["127.0.0.1:1", "127.0.0.1:2"], 5)}, "TF_CONFIG"),
        ({"WORKERS": "127.0.0.1:1,127.0.0.1"}, "WORKERS"),
        ({"WORKERS": "127.0.0.1:1,127.0.0.1:2"}, "WORKER_INDEX"),
    ],
)
def test_each_bad_cluster_setting_exits_2_with_one_line_before_tensorflow(tmp_path, env, name):
    code = (
        "import sys; from train.cli import main; rc = main(['fit']); "
        "assert 'tensorflow' not in sys.modules; sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=subprocess_env(**env, PYTHONPATH=str(PROJECT_ROOT)),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ConfigError: {name}="), lines


# --- SkyPilot: SKYPILOT_NODE_IPS / SKYPILOT_NODE_RANK when neither TF_CONFIG nor WORKERS is set ---


def test_skypilots_node_ips_and_rank_build_the_cluster_head_node_first():
    env = {"SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.7\n", "SKYPILOT_NODE_RANK": "1"}
    c = read_cluster("", -1, env)
    assert c == Cluster(("10.0.0.5:2222", "10.0.0.7:2222"), 1, "SKYPILOT_NODE_IPS")
    assert c.port == SKYPILOT_PORT == 2222 and not c.is_chief
    assert json.loads(c.tf_config_for(env))["cluster"]["worker"] == ["10.0.0.5:2222", "10.0.0.7:2222"]
    assert "worker 1 of 2 (SKYPILOT_NODE_IPS)" in c.describe()
    assert read_cluster("", -1, {"SKYPILOT_NODE_IPS": "fe80::1\n10.0.0.7", "SKYPILOT_NODE_RANK": "0"}).workers[0] == (
        "[fe80::1]:2222"
    )


def test_one_skypilot_node_is_one_process():
    assert read_cluster("", -1, {"SKYPILOT_NODE_IPS": "10.0.0.5", "SKYPILOT_NODE_RANK": "0"}) == Cluster()


def test_tf_config_or_workers_win_over_skypilots_variables():
    sky = {"SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.7", "SKYPILOT_NODE_RANK": "1"}
    assert read_cluster("a:1,b:1", 0, sky) == Cluster(("a:1", "b:1"), 0, "WORKERS")
    raw = _tf_config(["c:1", "d:1"], 1)
    assert read_cluster("", -1, {**sky, "TF_CONFIG": raw}) == Cluster(("c:1", "d:1"), 1, "TF_CONFIG")
    assert Cluster(("c:1", "d:1"), 1, "TF_CONFIG").tf_config_for({"TF_CONFIG": raw}) == raw
    for index in (0, 1):
        with pytest.raises(ConfigError) as info:  # WORKER_INDEX alone is still refused, SkyPilot or not
            read_cluster("", index, sky)
        assert (info.value.name, info.value.value) == ("WORKER_INDEX", index)


@pytest.mark.parametrize(
    "ips, rank, name, words",
    [
        ("10.0.0.5\n10.0.0.7", None, "SKYPILOT_NODE_RANK", "lists 2 nodes: expected 0..1"),
        ("10.0.0.5\n10.0.0.7", " ", "SKYPILOT_NODE_RANK", "SkyPilot sets it on each node"),
        ("10.0.0.5\n10.0.0.7", "one", "SKYPILOT_NODE_RANK", "not a whole number; SKYPILOT_NODE_IPS lists 2 nodes"),
        ("10.0.0.5\n10.0.0.7", "2", "SKYPILOT_NODE_RANK", "expected 0..1"),
        ("10.0.0.5\n10.0.0.7", "-1", "SKYPILOT_NODE_RANK", "expected 0..1"),
        ("10.0.0.5", "1", "SKYPILOT_NODE_RANK", "lists 1 node: expected 0..0"),
        ("10.0.0.5 10.0.0.7", "0", "SKYPILOT_NODE_IPS", "node 0 ('10.0.0.5 10.0.0.7') is not an IP address"),
        ("10.0.0.5,10.0.0.7", "0", "SKYPILOT_NODE_IPS", "one node a line"),
        ("10.0.0.5\n10.0.0.7:2222", "0", "SKYPILOT_NODE_IPS", "node 1 ('10.0.0.7:2222')"),
        ("10.0.0.5\n\n10.0.0.5", "0", "SKYPILOT_NODE_IPS", "node 0 (10.0.0.5:2222) and node 1 (10.0.0.5:2222)"),
        ("127.0.0.1\nlocalhost", "0", "SKYPILOT_NODE_IPS", "are the same address"),
    ],
)
def test_bad_skypilot_variables_name_the_variable(ips, rank, name, words):
    env = {"SKYPILOT_NODE_IPS": ips} if rank is None else {"SKYPILOT_NODE_IPS": ips, "SKYPILOT_NODE_RANK": rank}
    with pytest.raises(ConfigError) as info:
        read_cluster("", -1, env)
    assert info.value.name == name and words in str(info.value)
    assert info.value.value == (ips if name == "SKYPILOT_NODE_IPS" else rank or "")
    assert "\n" not in str(info.value)  # the IPs' newlines are shown escaped: one line


def test_a_bad_skypilot_rank_exits_2_in_one_line_before_tensorflow(tmp_path):
    code = (
        "import sys; from train.cli import main; rc = main(['fit']); "
        "assert 'tensorflow' not in sys.modules; sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=subprocess_env(
            SKYPILOT_NODE_IPS="10.0.0.5\n10.0.0.7", SKYPILOT_NODE_RANK="7", PYTHONPATH=str(PROJECT_ROOT)
        ),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ConfigError: SKYPILOT_NODE_RANK='7'"), lines
