"""Services and cluster DNS on kubelet nodes (issue #28): kube-proxy (iptables mode) in each node's network
namespace and CoreDNS behind ``kube-dns``, shown from inside the nodes and their pods; nothing left after
``down``. One cluster: 2 kubelet nodes (no GPUs) and a kwok node, which CoreDNS must stay off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuproof.sim.fleet_file import parse_fleet
from gpuproof.sim import clusternet, kubelet

NEEDS = kubelet.missing()
needs_kubelet = pytest.mark.skipif(bool(NEEDS), reason=NEEDS)

FLEET = {"name": "net", "pools": [{"name": "k", "count": 2, "backend": "kubelet"}, {"name": "cpu", "count": 1}]}
DNS = "10.96.0.10"

# Run with the host's Python inside a node's or a pod's network namespace: a raw DNS query (so that no
# resolver configuration of the host plays a part), an HTTPS or HTTP GET. Prints one JSON line.
PROBE = r'''
import json, random, socket, ssl, struct, sys, urllib.request

def dns(server, name):
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        s.sendto(q, (server, 53))
        data = s.recv(4096)
    answers, i = [], 12
    while data[i]:
        i += data[i] + 1
    i += 5
    for _ in range(struct.unpack(">H", data[6:8])[0]):
        i += 2 if data[i] & 0xC0 == 0xC0 else data[i:].index(0) + 1
        rtype, _, _, size = struct.unpack(">HHIH", data[i:i + 10])
        if rtype == 1:
            answers.append(socket.inet_ntoa(data[i + 10:i + 14]))
        i += 10 + size
    return {"rcode": data[3] & 15, "a": answers}

def get(url, ca=""):
    ctx = ssl.create_default_context(cafile=ca) if ca else None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    with opener.open(url, timeout=5) as r:
        return {"status": r.status, "body": r.read(4000).decode(errors="replace")}

what, *args = sys.argv[1:]
try:
    print(json.dumps({"dns": dns, "get": get}[what](*args)))
except OSError as exc:
    print(json.dumps({"error": repr(exc)}))
'''


def probe(netns: list[str], *args: str) -> dict:
    """Run PROBE in a namespace (``nsenter``/``ip netns exec`` arguments)."""
    out = subprocess.run([*netns, sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def resolve(netns: list[str], name: str, want: str, timeout: float = 40.0) -> dict:
    """Ask kube-dns for ``name`` until it answers ``want`` (CoreDNS's cache keeps a miss up to 30 s)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = probe(netns, "dns", DNS, name)
        if got.get("a") == [want] or time.monotonic() > deadline:
            return got
        time.sleep(0.5)       # the answer comes from CoreDNS's watch of the API: no event to wait on here


def pod_netns(uid: str) -> tuple[list[str], str]:
    """``nsenter`` arguments for a pod's network namespace, and its /etc/resolv.conf, found by the pod's cgroup."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if f"pod{uid}" in (proc / "cgroup").read_text():
                resolv = (proc / "root" / "etc" / "resolv.conf").read_text()
                return ["nsenter", f"--net=/proc/{proc.name}/ns/net"], resolv
        except OSError:
            continue
    raise AssertionError(f"no process of pod {uid} found")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from conftest import private_cluster

    with private_cluster(FLEET, tmp_path_factory.mktemp("net") / "s", "net.yaml") as c:
        yield c.sim, kubelet._load(c.sim.dir), c.client


def _nodes(state, client) -> tuple[str, str, dict[str, list[str]]]:
    """(the node CoreDNS runs on, the other kubelet node, node -> ``ip netns exec`` arguments)."""
    dns = client.core.list_namespaced_pod("kube-system", label_selector="k8s-app=kube-dns").items
    assert len(dns) == 1, f"expected 1 CoreDNS pod, got {[p.metadata.name for p in dns]}"
    here = dns[0].spec.node_name
    assert here in state.nodes, f"CoreDNS runs on {here}, not on a kubelet node {state.nodes}"
    other = next(n for n in state.nodes if n != here)
    return here, other, {n: ["ip", "netns", "exec", state.netns(i)] for i, n in enumerate(state.nodes)}


@pytest.mark.build  # tier: CoreDNS's addon manifest, from the Go module cache by `go list` unless setup copied it
def test_coredns_manifests_are_upstreams_without_forward():
    docs = {d["kind"]: d for d in clusternet.coredns_manifests(clusternet.addon_manifest(), "10.96.0.1", "img:1",
                                                                       "k-0")}
    assert docs["Service"]["spec"]["clusterIP"] == DNS
    corefile = docs["ConfigMap"]["data"]["Corefile"]
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa {\n        pods insecure\n        fallthrough" in corefile
    assert "forward" not in corefile, corefile
    assert docs["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["imagePullPolicy"]) == ("img:1", "Never")
    assert docs["Deployment"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/os": "linux", "kubernetes.io/hostname": "k-0"}


def test_kwok_only_fleet_gets_no_cluster_dns():
    fleet = parse_fleet({"name": "x", "pools": [{"name": "cpu", "count": 2}]}, source="x.yaml")
    assert kubelet.fleet_nodes(fleet) == []          # kubelet.load returns before anything of clusternet runs
    assert clusternet.kubelet_dns("") == {}


@pytest.mark.sim
@needs_kubelet
def test_kubernetes_service_through_kube_proxy(cluster):
    sim, state, client = cluster
    here, other, netns = _nodes(state, client)
    # from the node CoreDNS does not run on: the query crosses to the other node's pod through kube-dns
    got = probe(netns[other], "dns", DNS, "kubernetes.default.svc.cluster.local")
    assert got == {"rcode": 0, "a": ["10.96.0.1"]}, \
        f"{other}: kubernetes.default.svc.cluster.local via {DNS}: expected 10.96.0.1, got {got}"
    version = probe(netns[other], "get", "https://10.96.0.1/version", str(sim.dir / "pki" / "ca.crt"))
    assert version.get("status") == 200 and '"gitVersion": "v1.35.4"' in version.get("body", ""), \
        f"{other}: https://10.96.0.1/version: expected the API server's v1.35.4, got {version}"
    for node, ns in netns.items():
        rules = subprocess.run([*ns, "iptables", "-t", "nat", "-S"], capture_output=True, text=True).stdout
        mine = [r for r in rules.splitlines() if "DNAT" in r and "KUBE-SEP-" not in r]
        assert mine == [], f"{node}: expected only kube-proxy's DNAT rules, got {mine}"
        assert '"default/kubernetes:https -> ' in rules, f"{node}: no kube-proxy rule for the kubernetes Service"


@pytest.mark.sim
@needs_kubelet
def test_pods_resolve_headless_records_and_reach_services_on_other_nodes(cluster):
    from gpuproof.cluster.api import watch_until
    from kubernetes import client as k8s

    sim, state, client = cluster
    here, other, netns = _nodes(state, client)
    client.core.create_namespaced_service("default", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "hl"},
        "spec": {"clusterIP": "None", "selector": {"app": "hl"}, "ports": [{"name": "x", "port": 80}]}})
    for name, node, extra in (("w0", other, {"hostname": "w0", "subdomain": "hl"}), ("near", here, {})):
        client.core.create_namespaced_pod("default", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "hl"} if extra else {}},
            "spec": {"nodeName": node, **extra, "containers": [
                {"name": "c", "image": "gpuproof.local/pause:3.10", "imagePullPolicy": "Never"}]}})
    pods = watch_until(client.core.list_namespaced_pod,
                       lambda c: all(n in c and c[n].status.phase == "Running" and c[n].status.pod_ip
                                     for n in ("w0", "near")) and c, 60, "pods w0 and near to run",
                       namespace="default")
    watch_until(k8s.DiscoveryV1Api(client.api).list_namespaced_endpoint_slice,
                lambda c: any(e.hostname == "w0" and e.conditions.ready for s in c.values() for e in s.endpoints or []),
                60, "the headless Service hl to list w0", namespace="default",
                label_selector="kubernetes.io/service-name=hl")
    w0_ip = pods["w0"].status.pod_ip
    in_w0, resolv = pod_netns(pods["w0"].metadata.uid)
    assert f"nameserver {DNS}" in resolv and "search default.svc.cluster.local svc.cluster.local cluster.local" \
        in resolv, f"{other}: pod w0's resolv.conf: expected kube-dns and the cluster's search path, got {resolv!r}"
    got = resolve(in_w0, "w0.hl.default.svc.cluster.local", w0_ip)
    assert got == {"rcode": 0, "a": [w0_ip]}, \
        f"{other}: w0.hl.default.svc.cluster.local from pod w0: expected {w0_ip}, got {got}"
    # a ClusterIP Service whose only pod is on the other node: CoreDNS's metrics port behind kube-dns
    metrics = probe(in_w0, "get", f"http://{DNS}:9153/metrics")
    assert metrics.get("status") == 200 and "coredns_build_info" in metrics.get("body", ""), \
        f"{other}: pod w0 -> {DNS}:9153 (CoreDNS on {here}): expected CoreDNS's metrics, got {metrics}"
    # a pod on CoreDNS's own node: the reply comes back through the node (kube-proxy masquerades), not the bridge
    in_near, _ = pod_netns(pods["near"].metadata.uid)
    got = resolve(in_near, "w0.hl.default.svc.cluster.local", w0_ip)
    assert got == {"rcode": 0, "a": [w0_ip]}, f"{here}: w0.hl from pod near: expected {w0_ip}, got {got}"
    got = probe(netns[here], "dns", DNS, "hl.default.svc.cluster.local")
    assert got == {"rcode": 0, "a": [w0_ip]}, f"{here}: hl.default.svc.cluster.local: expected {w0_ip}, got {got}"


@pytest.mark.sim
@needs_kubelet
def test_down_leaves_no_rules_or_processes(cluster):
    from test_kubelet_backend import host_leftovers

    sim, state, _ = cluster
    proxies = [pid for key, pid in state.pids.items() if key.endswith("/kube-proxy")]
    assert len(proxies) == len(state.nodes), f"expected a kube-proxy per node, got {state.pids}"
    sim.down()
    assert host_leftovers(state.cluster) == []
    alive = [p for p in proxies if Path(f"/proc/{p}").exists()]
    assert alive == [], f"kube-proxy processes left after down: {alive}"
