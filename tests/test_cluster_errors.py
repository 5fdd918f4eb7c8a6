"""Bad targets give one clear line and create nothing: no permissions, no GPUs, unreachable."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

pytestmark = pytest.mark.sim


def _limited_kubeconfig(embedded, tmp_path) -> str:
    """A user signed by the embedded cluster's CA that may only list nodes and create namespaces."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    from kubernetes import client as k8s

    pki = embedded.sim.dir / "pki"
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "limited")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(hours=1))
            .sign(ca_key, hashes.SHA256()))
    (tmp_path / "limited.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "limited.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    rbac = k8s.RbacAuthorizationV1Api(embedded.client.api)
    rbac.create_cluster_role(k8s.V1ClusterRole(metadata=k8s.V1ObjectMeta(name="gpuproof-test-limited"), rules=[
        k8s.V1PolicyRule(api_groups=[""], resources=["nodes"], verbs=["list", "get"]),
        k8s.V1PolicyRule(api_groups=[""], resources=["namespaces"], verbs=["create"])]))
    rbac.create_cluster_role_binding(k8s.V1ClusterRoleBinding(
        metadata=k8s.V1ObjectMeta(name="gpuproof-test-limited"),
        role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole",
                               name="gpuproof-test-limited"),
        subjects=[k8s.RbacV1Subject(kind="User", name="limited", api_group="rbac.authorization.k8s.io")]))
    cfg = yaml.safe_load(embedded.sim.kubeconfig.read_text())
    cfg["users"][0]["user"] = {"client-certificate": str(tmp_path / "limited.crt"),
                               "client-key": str(tmp_path / "limited.key")}
    path = tmp_path / "limited-kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_missing_permissions_named_before_anything_is_created(embedded, tmp_path):
    import subprocess
    import sys

    from kubernetes import client as k8s

    from conftest import REPO

    kc = _limited_kubeconfig(embedded, tmp_path)
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "suites/test_advertisement.py", f"--kubeconfig={kc}",
                               f"--report-dir={tmp_path}", "--run-id=limited2", "-q", "-p", "no:cacheprovider"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        rbac = k8s.RbacAuthorizationV1Api(embedded.client.api)
        rbac.delete_cluster_role_binding("gpuproof-test-limited")
        rbac.delete_cluster_role("gpuproof-test-limited")
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 1), out
    assert "gpuproof cannot use its target cluster: the credentials for cluster" in out
    # each rule of gpuproof/cluster/rbac.yaml the user lacks is named; the one it has (create namespaces) is not
    assert "RBAC rule(s) gpuproof needs before it creates anything: missing RBAC rule: list,watch,delete namespaces " \
           "(cluster-wide)" in out
    assert "missing RBAC rule: create,delete,list,watch pods (cluster-wide)" in out
    assert "missing RBAC rule: create namespaces" not in out
    assert "Traceback" not in out
    assert "limited2" not in embedded.client.leftover_runs()


def test_cluster_without_gpus_fails_discovery_clearly(embedded, tmp_path):
    with embedded.fleet_loaded({"name": "cpu-only", "pools": [{"name": "cpu", "count": 2}]}):
        res = embedded.run_suite("suites/test_discovery.py", "suites/test_advertisement.py", report_dir=tmp_path,
                                 run_id="no-gpus")
    assert res.code == 1, res
    assert "has no node with nvidia.com/gpu.present=true or an NVIDIA GPU resource" in res.output
    assert "expected 'at least 1 GPU node', actual '0 GPU nodes among 2'" in res.output
    assert "no GPU nodes in the cluster" in res.output          # the per-node checks skip, saying why


def test_unreachable_cluster_stops_the_run_with_one_line(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))
    proc = subprocess.run([sys.executable, "-m", "gpuproof.cli", "run", f"--kubeconfig={kc}",
                           f"--report-dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "cannot reach cluster gone at https://127.0.0.1:9" in out
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in out, out     # one line, before pytest
    assert "Traceback" not in out


def test_a_lease_that_cannot_be_released_is_said_not_raised():
    """The API server gone at the end of a run (issue #41: a run killed its cleanup with `internal error:
    MaxRetryError`): releasing the run lease says why in one line and raises nothing; the lease expires by itself."""
    import socket
    from types import SimpleNamespace

    from kubernetes import client as k8s

    from gpuproof.cluster.lease import RunLease

    with socket.socket() as s:                   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = k8s.Configuration()
    conf.host = f"http://127.0.0.1:{port}"
    conf.retries = 0
    lease = RunLease(SimpleNamespace(api=k8s.ApiClient(conf)), "run-1", duration_s=45)
    lease.held = True
    why = lease.release()
    assert why.startswith("the API server did not answer (") and "expires by itself in 45 s" in why, why
    assert "\n" not in why and lease.release() == ""          # released once: nothing more to say


def test_a_throttled_api_server_slows_a_request_down_and_does_not_fail_it(tmp_path):
    """429 Too Many Requests (API priority and fairness, or a low --max-requests-inflight) turns a request away before
    it is handled: gpuproof sends it again, as Retry-After says, any method (issue #41 item 6)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gpuproof.cluster.api import connect

    seen = []

    class Throttling(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            seen.append((self.command, self.path))
            if len(seen) <= 3:
                self.send_response(429)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps({"major": "1", "minor": "34", "gitVersion": "v1.34.0",
                               "buildDate": "2025-08-27T00:00:00Z",
                               "compiler": "gc", "gitCommit": "0", "gitTreeState": "clean", "goVersion": "go1.24",
                               "platform": "linux/amd64"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Throttling)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{srv.server_address[1]}"}}],
        "users": [{"name": "t", "user": {}}], "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    try:
        cluster = connect(str(kubeconfig))           # its reachability check: 3 answers of 429, then the version
        assert [m for m, _ in seen] == ["GET"] * 4 and seen[-1][1] == "/version/"
        seen.clear()
        cluster.api.rest_client.request("POST", cluster.server + "/version/", body={})
        assert [m for m, _ in seen] == ["POST"] * 4      # not only the idempotent methods: 429 was never handled
    finally:
        srv.shutdown()
        srv.server_close()
