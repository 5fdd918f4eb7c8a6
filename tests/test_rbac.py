"""Least-privilege RBAC (issue 11, item 3): deploy/rbac.yaml, and the pre-flight made from the same rules.

- deploy/rbac.yaml is what gpuproof/cluster/rbac.yaml makes, its roles nest, and a malformed rules file gives one line;
- on the embedded cluster, with ServiceAccount tokens bound only to the shipped roles:
  - removing any single rule from a role makes the pre-flight name exactly that rule;
  - the suites pass with only ``gpuproof-no-bench``, ``gpuproof clean`` works with only ``gpuproof-clean``, and
    a recording pass-through to the API server shows that every request they make is granted by a rule of the
    role and that every rule is used (save the few only real GPUs or benchmarks use, listed below);
  - with a rule missing, ``gpuproof run``, a pytest session and ``gpuproof clean`` stop with one line naming it
    and send the cluster nothing but access reviews: no namespace, no lease, nothing deleted.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from gpuproof.cluster import rbac
from gpuproof.errors import ClusterError
from conftest import SuiteResult
from healthy_runs import DRA_SUITE, MIXED, assert_healthy

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "rbac.yaml"
SPEC = rbac.load()
FULL, NO_BENCH, CLEAN = "gpuproof", "gpuproof-no-bench", "gpuproof-clean"
RUN_NEEDS = rbac.run_needs(bench=False)
# Rules a run on the embedded cluster cannot use: its GPU nodes are simulated, so no probe pod reads a GPU
# (the probe's ConfigMap and pod logs), and the benchmarks skip there.
UNUSED_ON_EMBEDDED = {("configmaps", "create"): "probe pods run on real GPUs only",
                      ("pods/log", "get"): "probe and benchmark results are read on real GPUs only",
                      ("daemonsets", "list"): "the DCGM exporter is looked for on real GPU nodes only",
                      ("pods/proxy", "get"): "the DCGM exporter's /metrics is read where one runs (not embedded)",
                      ("pods/proxy", "create"): "ai_service_metrics' requests go to a server pod on a real GPU",
                      ("podmonitors", "create"): "ai_service_metrics runs with --prometheus on real GPUs only",
                      ("prometheuses", "list"): "ai_service_metrics runs with --prometheus on real GPUs only",
                      ("services", "list"): "a cluster's Prometheus is looked for where a DCGM exporter runs",
                      ("services/proxy", "get"): "a Prometheus found in the cluster is read where an exporter runs",
                      **{(res, verb): "the gang suite's gangs: the mixed fleet has no gang scheduler"
                         for res, verbs in (
                          ("jobs", "create delete get list watch"), ("workloads", "create delete"),
                          ("localqueues", "create list watch"), ("clusterqueues", "list")) for verb in verbs.split()},
                      **{(res, verb): "the operators suite: the mixed fleet has no training operator (only the CRD "
                                      "list finds none)" for res, verbs in (
                          ("mutatingwebhookconfigurations", "list"), ("validatingwebhookconfigurations", "list"),
                          ("services", "get"), ("trainjobs", "create list watch"), ("jobsets", "create list watch"))
                         for verb in verbs.split()}}


def _rule(resource: str, verbs: str) -> rbac.Rule:
    return next(r for r in SPEC.rules if resource in r.resources and r.verbs == tuple(verbs.split(",")))


# ----------------------------------------------------------------------------- the files


def test_deploy_manifest_is_made_from_the_rules_and_roles_nest():
    assert DEPLOY.read_text() == rbac.manifest(), \
        "deploy/rbac.yaml is stale: run `python -m gpuproof.rbac > deploy/rbac.yaml`"
    docs = [d for d in yaml.safe_load_all(DEPLOY.read_text()) if d]
    assert docs == rbac.objects()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    # the names the CronJob manifests (deploy/cronjob/) rely on
    assert {("ServiceAccount", FULL), ("ClusterRole", FULL), ("ClusterRoleBinding", FULL)} <= kinds
    crb = next(d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == FULL)
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": FULL, "namespace": "gpuproof-system"}]
    # the run lease's rules name the lease gpuproof.cluster.lease takes, in its namespace
    from gpuproof.cluster import lease

    assert SPEC.namespace == lease.NAMESPACE
    assert {n for r in SPEC.rules for n in r.resource_names} == {lease.NAME}
    # clean <= no-bench <= full, and only the benchmarks' rules set the full role apart
    full, no_bench, clean = (set(SPEC.role_rules(n)) for n in (FULL, NO_BENCH, CLEAN))
    assert clean < no_bench < full == set(SPEC.rules)
    assert {r for r in full - no_bench} == {r for r in SPEC.rules_for({"bench"}) if r.needs == ("bench",)}
    assert SPEC.smallest_role(SPEC.rules_for(RUN_NEEDS)).name == NO_BENCH
    assert SPEC.smallest_role(SPEC.rules_for({"clean"})).name == CLEAN
    # the DRA suite's rules, as the colleague's suite needs them
    assert {(r.resources, r.verbs) for r in SPEC.rules_for({"dra"})} == {
        (("deviceclasses", "resourceslices"), ("get", "list", "watch")),
        (("resourceclaims", "resourceclaimtemplates"), ("create", "delete", "get", "list", "watch"))}


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d.update(rules="nope"), "rules: expected a list of rules"),
    (lambda d: d["rules"][0].update(needs=["run", "fun"]), "rule 1: needs: unknown fun (known:"),
    (lambda d: d["rules"][1].update(verbs=["create", "explode"]), "rule 2: verbs: unknown explode"),
    (lambda d: d["rules"][2].pop("for"), "rule 3: missing for"),
    (lambda d: d["rules"][3].update(namespace="default"), "rule 4: namespace: only gpuproof-system"),
    (lambda d: d["rules"].insert(1, dict(d["rules"][0], verbs=["delete"])),
     "rule 2: grants delete namespaces again (rule 1 does already)"),
    (lambda d: d["roles"]["gpuproof"].update(color="red"), "role gpuproof: expected exactly the keys needs and for"),
])
@pytest.mark.server  # tier: gpuproof.rbac as a process
def test_a_bad_rules_file_gives_one_line_naming_the_entry(tmp_path, edit, expected):
    data = yaml.safe_load(rbac.SPEC_PATH.read_text())
    edit(data)
    bad = tmp_path / "rules.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(rbac.RbacSpecError) as err:
        rbac.load(bad)
    assert expected in str(err.value) and str(err.value).startswith(str(bad)) and "\n" not in str(err.value)
    proc = subprocess.run([sys.executable, "-m", "gpuproof.rbac", "--rules", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.strip().count("\n") == 0, proc
    assert expected in proc.stderr


def test_a_rules_file_that_is_no_yaml_gives_one_line(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("rules: [unclosed\n")
    with pytest.raises(rbac.RbacSpecError, match=r"rules\.yaml: not valid YAML: line 2: ") as err:
        rbac.load(bad)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- on the embedded cluster


class RecordingProxy:
    """A plain-HTTP pass-through to the API server that records every request and its answer.

    gpuproof talks to it with a ServiceAccount token, the API server authenticates and authorizes each
    request as usual; the record says what gpuproof asked for, so a test can match it against the rules.
    """

    def __init__(self, upstream: str, ca_file: str):
        self.requests: list[tuple[str, str, int]] = []       # (method, path?query, status)
        self._lock = threading.Lock()
        self._upstreams: set[http.client.HTTPSConnection] = set()
        up = urlsplit(upstream)
        ctx = ssl.create_default_context(cafile=ca_file)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            upstream: http.client.HTTPSConnection | None = None    # one per client connection, kept alive

            def forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                while True:
                    reused = self.upstream is not None
                    if not reused:
                        self.upstream = http.client.HTTPSConnection(up.hostname, up.port, context=ctx)
                        with proxy._lock:
                            proxy._upstreams.add(self.upstream)
                    try:
                        self.upstream.request(self.command, self.path, body=body, headers=headers)
                        resp = self.upstream.getresponse()
                        break
                    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                        self.finish_upstream()       # a kept-alive connection the server had closed: a fresh one
                        if not reused:
                            raise
                with proxy._lock:
                    proxy.requests.append((self.command, self.path, resp.status))
                try:
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                            self.send_header(k, v)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while chunk := resp.read1(65536):          # as it comes: watches stream
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    resp.close()                             # read to the end: the connection can take the next
                except (OSError, http.client.HTTPException):
                    self.close_connection = True
                if self.close_connection or resp.will_close:
                    self.finish_upstream()

            def finish_upstream(self):
                if self.upstream is not None:
                    with proxy._lock:
                        proxy._upstreams.discard(self.upstream)
                    self.upstream.close()
                    self.upstream = None

            def finish(self):
                self.finish_upstream()
                super().finish()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="rbac-proxy", daemon=True).start()

    def take(self) -> list[tuple[str, str, int]]:
        with self._lock:
            out, self.requests = self.requests, []
        return out

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        with self._lock:
            for conn in list(self._upstreams):        # watches still open upstream end now
                with contextlib.suppress(OSError):
                    if conn.sock is not None:
                        conn.sock.shutdown(socket.SHUT_RDWR)


def attributes(method: str, target: str) -> rbac.Access | None:
    """The RBAC attributes of a request, as the API server's request-info resolver makes them (None: a
    non-resource URL such as /version or discovery)."""
    url = urlsplit(target)
    parts = [p for p in url.path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) > 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
    if method == "GET":
        watch = parse_qs(url.query).get("watch", [""])[0] in ("true", "1")
        verb = "watch" if watch else "get" if name else "list"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return rbac.Access(verb, group, resource, sub, namespace, name)


def granted_by(a: rbac.Access, rules) -> rbac.Rule | None:
    """The rule that grants the request (rules never overlap, rbac.parse sees to that)."""
    res = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    for r in rules:
        if a.verb in r.verbs and a.group in r.api_groups and res in r.resources \
                and (not r.resource_names or a.name in r.resource_names) \
                and (not r.namespace or r.namespace == a.namespace):
            return r
    return None


ALWAYS_ALLOWED = {("authorization.k8s.io", "selfsubjectaccessreviews")}   # every authenticated user (basic-user)


def audit(requests, rules) -> tuple[set[rbac.Rule], list[str]]:
    """(rules used, requests no rule grants) of a recorded conversation."""
    used, outside = set(), []
    for method, target, status in requests:
        a = attributes(method, target)
        if a is None or (a.group, a.resource) in ALWAYS_ALLOWED:
            continue
        rule = granted_by(a, rules)
        if rule is None:
            outside.append(f"{method} {target} -> {status}")
        else:
            used.add(rule)
    return used, outside


def _wait_for(predicate, timeout: float, what: str):
    """Ask until the answer is yes, up to a deadline (RBAC changes reach the authorizer within ~1 s, and
    there is nothing to watch for that: the access review is the only way to see it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


class Rbac:
    """deploy/rbac.yaml applied to the embedded cluster, with a token kubeconfig per ServiceAccount."""

    def __init__(self, embedded, tmp: Path):
        from kubernetes import client as k8s

        self.embedded, self.tmp = embedded, tmp
        self.admin = embedded.client
        self.k8s = k8s
        self.api = k8s.RbacAuthorizationV1Api(self.admin.api)
        self.objects = [d for d in yaml.safe_load_all(DEPLOY.read_text()) if d]
        cfg = yaml.safe_load(embedded.sim.kubeconfig.read_text())
        self.server = cfg["clusters"][0]["cluster"]["server"]
        self.ca = cfg["clusters"][0]["cluster"]["certificate-authority"]
        self.proxy = RecordingProxy(self.server, self.ca)
        self._tokens: dict[str, str] = {}

    def apply(self) -> None:
        from kubernetes import utils

        for obj in self.objects:
            try:
                utils.create_from_dict(self.admin.api, obj)
            except utils.FailToCreateError as exc:
                if exc.api_exceptions[0].status != 409:
                    raise
                if obj["kind"] in ("ClusterRole", "Role"):
                    self.set_rules(obj["kind"], obj["metadata"]["name"], obj["rules"])

    def delete(self) -> None:
        from kubernetes.client.exceptions import ApiException

        for obj in reversed(self.objects):
            kind, name, ns = obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")
            if kind == "Namespace":
                continue          # other tests take the run lease there; an emptied namespace is harmless
            call = {"ServiceAccount": lambda: self.admin.core.delete_namespaced_service_account(name, ns),
                    "ClusterRole": lambda: self.api.delete_cluster_role(name),
                    "ClusterRoleBinding": lambda: self.api.delete_cluster_role_binding(name),
                    "Role": lambda: self.api.delete_namespaced_role(name, ns),
                    "RoleBinding": lambda: self.api.delete_namespaced_role_binding(name, ns)}[kind]
            with contextlib.suppress(ApiException):
                call()
        self.proxy.close()

    def set_rules(self, kind: str, name: str, rules: list[dict]) -> None:
        body = {"rules": rules}
        if kind == "ClusterRole":
            self.api.patch_cluster_role(name, body)
        else:
            self.api.patch_namespaced_role(name, SPEC.namespace, body)

    def token(self, sa: str) -> str:
        if sa not in self._tokens:
            req = self.k8s.AuthenticationV1TokenRequest(spec=self.k8s.V1TokenRequestSpec(
                audiences=[], expiration_seconds=3600))
            self._tokens[sa] = self.admin.core.create_namespaced_service_account_token(
                sa, SPEC.namespace, req).status.token
        return self._tokens[sa]

    def kubeconfig(self, sa: str, recorded: bool = True) -> str:
        """A kubeconfig holding only the ServiceAccount's token (through the recording proxy by default)."""
        cluster = {"server": self.proxy.url} if recorded else {"server": self.server,
                                                               "certificate-authority": self.ca}
        path = self.tmp / f"{sa}{'-recorded' if recorded else ''}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": sa,
            "clusters": [{"name": "embedded", "cluster": cluster}],
            "users": [{"name": sa, "user": {"token": self.token(sa)}}],
            "contexts": [{"name": sa, "context": {"cluster": "embedded", "user": sa}}]}))
        return str(path)

    def client(self, sa: str):
        from gpuproof.cluster.api import connect

        return connect(self.kubeconfig(sa, recorded=False), sa)

    def live_rules(self, kind: str, name: str) -> list[dict]:
        obj = self.api.read_cluster_role(name) if kind == "ClusterRole" else \
            self.api.read_namespaced_role(name, SPEC.namespace)
        return [self.admin.api.sanitize_for_serialization(r) for r in obj.rules]


@pytest.fixture(scope="module")
def roles(embedded, tmp_path_factory):
    r = Rbac(embedded, tmp_path_factory.mktemp("rbac"))
    r.apply()
    try:
        for sa, needs in ((FULL, rbac.run_needs(bench=True)), (NO_BENCH, RUN_NEEDS), (CLEAN, {"clean"})):
            cluster = r.client(sa)
            _wait_for(lambda: not rbac.missing(cluster, needs), 15, f"the roles of {sa} to take effect")
        yield r
    finally:
        r.delete()


def _without(rules: list[dict], i: int) -> list[dict]:
    return rules[:i] + rules[i + 1:]


def _spec_rule(policy_rule: dict) -> rbac.Rule:
    return next(r for r in SPEC.rules if r.policy_rule() == policy_rule)


@pytest.mark.sim
@pytest.mark.parametrize("role, needs", [(FULL, rbac.run_needs(bench=True)), (CLEAN, {"clean"})],
                         ids=["gpuproof", "gpuproof-clean"])
def test_removing_any_rule_makes_the_preflight_name_exactly_that_rule(roles, role, needs):
    sa = roles.client(role)
    assert rbac.missing(sa, needs) == []
    rbac.preflight(sa, needs)                       # the whole role: nothing to say
    seen = []
    for kind in ("ClusterRole", "Role"):
        live = roles.live_rules(kind, role)
        for i, pr in enumerate(live):
            rule = _spec_rule(pr)
            probe = rule.accesses()[0]
            roles.set_rules(kind, role, _without(live, i))
            try:
                _wait_for(lambda: not rbac.allowed(sa, probe), 10, f"{rule.describe()} to be withdrawn")
                assert rbac.missing(sa, needs) == [(rule, list(rule.verbs))]
                with pytest.raises(ClusterError) as err:
                    rbac.preflight(sa, needs)
                msg = str(err.value)
                assert msg.count("missing RBAC rule:") == 1 and "\n" not in msg, msg
                assert f"missing RBAC rule: {rule.describe()}, needed by " in msg, msg
                assert f"ClusterRole and Role {role} (or use ServiceAccount gpuproof-system/{role})" in msg, msg
                if "dra" in rule.needs:
                    assert "needed by the DRA suite: " in msg, msg
            finally:
                roles.set_rules(kind, role, live)
                _wait_for(lambda: rbac.allowed(sa, probe), 10, f"{rule.describe()} to be granted again")
            seen.append(rule)
    assert sorted(seen, key=SPEC.rules.index) == SPEC.role_rules(role)     # every rule of the role was tried


@pytest.mark.sim
def test_no_bench_role_is_enough_for_a_run_without_benchmarks_and_names_what_the_benchmarks_add(roles):
    sa = roles.client(NO_BENCH)
    rbac.preflight(sa, RUN_NEEDS)
    rbac.preflight(sa, rbac.run_needs(bench=False, lease=False))
    bench = [r for r in SPEC.rules_for({"bench"}) if r.needs == ("bench",)]     # the gang suite makes Jobs too
    assert rbac.missing(sa, rbac.run_needs(bench=True)) == [(r, list(r.verbs)) for r in bench]
    with pytest.raises(ClusterError) as err:
        rbac.preflight(sa, rbac.run_needs(bench=True))
    assert str(err.value).count("missing RBAC rule:") == len(bench) == 2
    assert "needed by the benchmarks (--bench)" in str(err.value)
    assert "Bind the credentials to ClusterRole and Role gpuproof (or use ServiceAccount gpuproof-system/gpuproof)" \
        in str(err.value)
    # a dry run of gpuproof clean needs only the read verbs of its rules
    clean_sa = roles.client(CLEAN)
    rbac.preflight(clean_sa, {"clean"}, read_only=True)
    assert rbac.missing(clean_sa, RUN_NEEDS, read_only=True) != []


def _gpuproof(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "gpuproof.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.sim
def test_suites_pass_with_only_the_no_bench_role_and_use_every_rule_of_it(roles, embedded, tmp_path):
    rules = SPEC.role_rules(NO_BENCH)
    kc = roles.kubeconfig(NO_BENCH)
    roles.proxy.take()
    # the whole suite as a user runs it, on the mixed fleet (the session's)
    # a short run lease, so that it is renewed (updated) while the run lasts
    proc = _gpuproof("run", f"--kubeconfig={kc}", "--shared-requests-refused=g6.4xlarge", f"--report-dir={tmp_path}",
                     "--run-id=rbac-mixed", env={"GPUPROOF_LEASE_SECONDS": "3"})
    assert_healthy(SuiteResult(proc, tmp_path / "rbac-mixed"), MIXED)      # as green, by name, as with admin rights
    used, outside = audit(roles.proxy.take(), rules)
    assert outside == [], "requests the role does not grant (refused, or silently skipped):\n" + "\n".join(outside)
    # the DRA suite with NVIDIA's DRA driver's devices published, through pytest itself (-m "not bench": the
    # session's pre-flight must not ask for the benchmarks' rules)
    with embedded.fleet_loaded("dra"):
        cmd = [sys.executable, "-m", "pytest", "suites/test_dra.py", f"--kubeconfig={kc}", "-m", "not bench",
               f"--report-dir={tmp_path}", "--run-id=rbac-dra", "-p", "no:cacheprovider", "-q",
               "-o", "addopts=-ra --strict-markers", f"--rootdir={REPO}"]
        dra_run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert_healthy(SuiteResult(dra_run, tmp_path / "rbac-dra"), DRA_SUITE)
    dra_used, outside = audit(roles.proxy.take(), rules)
    assert outside == [], "\n".join(outside)
    # least privilege: every rule of the role served some request, but those only real GPUs call for
    unused = {(res, verb) for r in set(rules) - used - dra_used for res in r.resources for verb in r.verbs}
    assert unused == set(UNUSED_ON_EMBEDDED), f"rules no request used: {sorted(unused)}"


def _leftovers(admin, run_id: str) -> None:
    """A killed run's objects: its namespace and PriorityClass, and its expired run lease."""
    import datetime as dt

    from kubernetes import client as k8s

    from gpuproof.cluster.api import run_labels
    from gpuproof.cluster.lease import NAME, NAMESPACE

    labels = run_labels(run_id)
    admin.core.create_namespace({"metadata": {"name": f"gpuproof-{run_id}", "labels": labels}})
    admin.scheduling.create_priority_class({"metadata": {"name": f"gpuproof-{run_id}-low", "labels": labels},
                                            "value": -100})
    long_ago = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)).replace(microsecond=123456)
    k8s.CoordinationV1Api(admin.api).create_namespaced_lease(NAMESPACE, {
        "metadata": {"name": NAME}, "spec": {"holderIdentity": run_id, "leaseDurationSeconds": 60,
                                             "acquireTime": long_ago, "renewTime": long_ago}})


def _lease_exists(admin) -> bool:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    from gpuproof.cluster.lease import NAME, NAMESPACE

    try:
        k8s.CoordinationV1Api(admin.api).read_namespaced_lease(NAME, NAMESPACE)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


@pytest.mark.sim
def test_clean_works_with_only_the_clean_role_and_uses_every_rule_of_it(roles, embedded):
    admin = embedded.client
    assert not _lease_exists(admin)
    _leftovers(admin, "rbac-killed")
    kc = roles.kubeconfig(CLEAN)
    roles.proxy.take()
    dry = _gpuproof("clean", f"--kubeconfig={kc}", "--dry-run")
    assert dry.returncode == 0 and "run rbac-killed: namespaces gpuproof-rbac-killed" in dry.stdout, dry
    assert "would remove lease gpuproof-system/gpuproof-run of gpuproof run rbac-killed" in dry.stdout, dry
    proc = _gpuproof("clean", f"--kubeconfig={kc}")
    assert proc.returncode == 0 and "removed the leftovers of 1 run(s)" in proc.stdout, proc
    assert "rbac-killed" not in admin.leftover_runs() and not _lease_exists(admin)
    used, outside = audit(roles.proxy.take(), SPEC.role_rules(CLEAN))
    # a run that may not create gpuproof-system keeps its lease in default, so clean looks there too; with
    # the shipped roles no run does, and the refusal there is expected (and harmless: nothing to find)
    assert {o.split(" -> ")[0] for o in outside} <= {
        "GET /apis/coordination.k8s.io/v1/namespaces/default/leases/gpuproof-run"}, outside
    assert used == set(SPEC.role_rules(CLEAN))


@pytest.mark.sim
def test_a_missing_rule_stops_run_pytest_and_clean_before_they_touch_anything(roles, embedded, tmp_path):
    admin = embedded.client
    assert not _lease_exists(admin)
    # the preemption suite's PriorityClasses: without the pre-flight a run would get far before needing it
    rule = _rule("priorityclasses", "create")
    live = roles.live_rules("ClusterRole", NO_BENCH)
    roles.set_rules("ClusterRole", NO_BENCH, [r for r in live if r != rule.policy_rule()])
    sa = roles.client(NO_BENCH)
    probe = rule.accesses()[0]
    kc = roles.kubeconfig(NO_BENCH)
    named = f"missing RBAC rule: {rule.describe()}, needed by the suites: "
    try:
        _wait_for(lambda: not rbac.allowed(sa, probe), 10, "the rule to be withdrawn")
        roles.proxy.take()
        proc = _gpuproof("run", f"--kubeconfig={kc}", f"--report-dir={tmp_path}", "--run-id=rbac-refused")
        err = proc.stderr.strip()
        assert proc.returncode == 2 and err.count("\n") == 0 and "Traceback" not in err, proc
        assert err.count("missing RBAC rule:") == 1 and named in err, err
        # pytest on its own (the plugin's pre-flight), also with benchmarks deselected by path
        py = subprocess.run([sys.executable, "-m", "pytest", "suites/test_preemption.py", f"--kubeconfig={kc}",
                             f"--report-dir={tmp_path}", "--run-id=rbac-refused2", "-q", "-p", "no:cacheprovider",
                             f"--rootdir={REPO}"], cwd=REPO, capture_output=True, text=True, timeout=120)
        out = py.stdout + py.stderr
        said = [line for line in out.splitlines()
                if "gpuproof cannot use its target cluster: the credentials for cluster" in line]
        assert py.returncode != 0 and said and "Traceback" not in out, out
        assert all(line.count("missing RBAC rule:") == 1 and named in line for line in said), said
        asked = roles.proxy.take()
        # nothing but questions: access reviews and the version, no namespace, no lease, no pod
        assert asked and all(a is None or (a.group, a.resource) in ALWAYS_ALLOWED
                             for a in (attributes(m, t) for m, t, _ in asked)), asked
        assert not {"rbac-refused", "rbac-refused2"} & set(admin.leftover_runs()) and not _lease_exists(admin)
    finally:
        roles.set_rules("ClusterRole", NO_BENCH, live)
        _wait_for(lambda: rbac.allowed(sa, probe), 10, "the rule to be granted again")

    # gpuproof clean without its namespaces rule deletes nothing, not even the expired lease
    rule = _rule("namespaces", "list,watch,delete")
    live = roles.live_rules("ClusterRole", CLEAN)
    _leftovers(admin, "rbac-kept")
    try:
        roles.set_rules("ClusterRole", CLEAN, [r for r in live if r != rule.policy_rule()])
        clean_sa = roles.client(CLEAN)
        _wait_for(lambda: not rbac.allowed(clean_sa, rule.accesses()[0]), 10, "the rule to be withdrawn")
        roles.proxy.take()
        proc = _gpuproof("clean", f"--kubeconfig={roles.kubeconfig(CLEAN)}")
        err = proc.stderr.strip()
        assert proc.returncode == 2 and err.count("\n") == 0, proc
        assert err.count("missing RBAC rule:") == 1 and \
            f"missing RBAC rule: {rule.describe()}, needed by gpuproof clean: " in err, err
        asked = roles.proxy.take()
        assert asked and all(a is None or (a.group, a.resource) in ALWAYS_ALLOWED
                             for a in (attributes(m, t) for m, t, _ in asked)), asked
        assert "rbac-kept" in admin.leftover_runs() and _lease_exists(admin)
    finally:
        roles.set_rules("ClusterRole", CLEAN, live)
        admin.clean(["rbac-kept"])
        from gpuproof.cluster.lease import remove_expired

        remove_expired(admin)
