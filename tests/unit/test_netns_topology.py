"""The pure parts of the Kubernetes-shaped netns testbed: the stub DNS answer, pod command lines, the zone.

Rules:
- a DNS answer carries every A record of the name, rotated by the turn, with the question echoed and
  the query's id; an unknown name is NXDOMAIN, a known name asked for AAAA is NOERROR with no data,
  and a malformed query is FORMERR (a resolver then tries elsewhere instead of hanging);
- a container's command line is the template's with ``$(VAR)`` expanded from the downward API over
  the template's own ``env`` values, its program resolved, and every path under a volume mount (also
  after ``--flag=``) rewritten to the folder standing for the volume, and nothing else;
- the zone gives each Service name its pods (both control planes, both root pods, each cell's leaf
  pods) and the config names only those (no pod address but the servers').
"""

from __future__ import annotations

import struct
from pathlib import Path

from dlb.testbed.k8s_pods import Readiness, containers, expand
from dlb.testbed.netns_fleet import CONTROL_PLANE_NAME, NetnsPlan, leaf_pods_name, netns_config, root_name, zone
from dlb.testbed.stub_dns import RCODE_FORMERR, RCODE_NXDOMAIN, RCODE_OK, answer


def _query(name: str, qtype: int = 1, qid: int = 0x1234) -> bytes:
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", qtype, 1)


def _records(reply: bytes, query: bytes) -> tuple[int, int, list[str]]:
    qid, flags, _, ancount, _, _ = struct.unpack("!HHHHHH", reply[:12])
    at = len(query)
    assert reply[12:at] == query[12:]  # the question, echoed
    ips = []
    for _ in range(ancount):
        _, rtype, _, _, length = struct.unpack("!HHHIH", reply[at:at + 12])
        assert rtype == 1 and length == 4
        ips.append(".".join(str(b) for b in reply[at + 12:at + 16]))
        at += 12 + length
    return qid, flags & 0x000F, ips


def test_answer_rotates_every_record_and_keeps_the_id() -> None:
    z = {"root.east.dlb.example.com": ["198.18.0.5", "198.18.0.6", "198.18.0.7"]}
    q = _query("Root.East.dlb.example.com")
    seen = [_records(answer(q, z, turn), q) for turn in range(4)]
    assert [s[0] for s in seen] == [0x1234] * 4 and {s[1] for s in seen} == {RCODE_OK}
    assert [s[2][0] for s in seen] == ["198.18.0.5", "198.18.0.6", "198.18.0.7", "198.18.0.5"]
    assert all(sorted(s[2]) == z["root.east.dlb.example.com"] for s in seen)


def test_answer_unknown_aaaa_and_malformed() -> None:
    z = {"a.example.com": ["198.18.0.2"]}
    assert _records(answer(_query("b.example.com"), z), _query("b.example.com"))[1:] == (RCODE_NXDOMAIN, [])
    assert _records(answer(_query("a.example.com", 28), z), _query("a.example.com", 28))[1:] == (RCODE_OK, [])
    bad = answer(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05ab", z)
    assert struct.unpack("!H", bad[:2])[0] == 0x1234 and struct.unpack("!H", bad[2:4])[0] & 0xF == RCODE_FORMERR


def test_expand_leaves_unknown_variables() -> None:
    assert expand("--cell=$(DLB_CELL) $(NOPE)", {"DLB_CELL": "east"}) == "--cell=east $(NOPE)"


def test_containers_as_this_machine_runs_them() -> None:
    template = {"spec": {"containers": [
        {"name": "agent", "args": ["serve", "leaf", "--config=/etc/dlb/dlb.yaml", "--check=$(POD_IP):10010", "--serve=$(CELLS)",
                                   "--other=/etc/dlbx/y"],
         "env": [{"name": "POD_IP", "valueFrom": {}}, {"name": "CELLS", "value": "a,b"}],
         "volumeMounts": [{"name": "config", "mountPath": "/etc/dlb"}, {"name": "scratch", "mountPath": "/tmp"}],
         "ports": [{"name": "http-metrics", "containerPort": 19010}],
         "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http-metrics"}}},
        {"name": "envoy", "command": ["envoy"], "args": ["-c", "/etc/envoy/bootstrap.yaml"],
         "volumeMounts": [{"name": "bootstrap", "mountPath": "/etc/envoy"}], "readinessProbe": {"tcpSocket": {"port": 9902}}},
    ]}}
    agent, envoy = containers(template, {"POD_IP": "198.18.0.9"}, {"config": Path("/run/x/config"), "bootstrap": Path("/run/x/b")},
                              {"dlb": ["py", "-m", "dlb.cli"], "envoy": ["/bin/envoy"]})
    assert agent.argv == ["py", "-m", "dlb.cli", "serve", "leaf", "--config=/run/x/config/dlb.yaml", "--check=198.18.0.9:10010",
                          "--serve=a,b", "--other=/etc/dlbx/y"]
    assert agent.ready == Readiness(19010, "/readyz") and agent.mounts == {"/etc/dlb": "config", "/tmp": "scratch"}
    assert envoy.argv == ["/bin/envoy", "-c", "/run/x/b/bootstrap.yaml"] and envoy.ready == Readiness(9902, None)


def test_zone_and_config_name_the_pods_by_service() -> None:
    p = NetnsPlan(cells=("east", "west"))
    ip = {h: f"198.18.0.{k + 2}" for k, h in enumerate(p.host_names)}
    z = zone(p, ip)
    assert z[CONTROL_PLANE_NAME] == [ip["cp"], ip["cp2"]]
    assert z[root_name("east")] == [ip["root"], ip["root2"]]
    assert z[leaf_pods_name("west")] == [ip["west-leaf"], ip["west-leaf2"]]
    cfg = netns_config(p, ip, "/run/token")
    text = str(cfg)
    pods = [ip[h] for h in p.host_names if h not in p.cells]
    assert not [a for a in pods if a + ":" in text or a + "'" in text]  # only names, but the servers' addresses
    assert cfg["cells"][0]["leaf"]["replicas"] == "dns"
