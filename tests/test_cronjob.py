"""The in-cluster nightly (deploy/cronjob, deploy/image) against the embedded cluster's real API server:

- deploy/rbac.yaml and deploy/cronjob/*.yaml apply with server-side dry-run and strict field
  validation, in the documented order, and nothing is left behind; broken copies are refused;
- the pieces fit: the CronJob runs as the ServiceAccount that rbac.yaml binds to ClusterRole gpuproof,
  mounts the claim and ConfigMaps that exist, as the user the image runs as;
- the image's entrypoint, run as it runs in the pod (a real token of ServiceAccount gpuproof mounted
  where the kubelet mounts it, KUBERNETES_SERVICE_HOST/PORT), authenticates as that ServiceAccount,
  runs gpuproof with only the rights rbac.yaml grants, keeps the run on the report volume, prunes old
  runs, takes its exit code from the rules and uploads the run folder.

Not run: the image build (no Docker engine) and the CronJob's pod (kwok nodes run no containers).
"""

from __future__ import annotations

import contextlib
import http.server
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RBAC = REPO / "deploy" / "rbac.yaml"
CRONJOB_DIR = REPO / "deploy" / "cronjob"
IMAGE_DIR = REPO / "deploy" / "image"
ENTRYPOINT = IMAGE_DIR / "gpuproof-in-cluster"
NAMESPACE = "gpuproof-system"
SA = "gpuproof"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def apply_order() -> list[dict]:
    """What `kubectl apply -f deploy/rbac.yaml -f deploy/cronjob/` applies, in that order."""
    files = ([RBAC] if RBAC.exists() else []) + sorted(CRONJOB_DIR.glob("*.yaml"))
    return [d for f in files for d in docs(f)]


def find(objs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


@pytest.fixture(scope="module")
def api(embedded):
    """A dynamic client on the embedded cluster, and the namespace the set lives in (made as gpuproof's
    run lease makes it; never deleted, other tests take the lease there)."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic import DynamicClient

    admin = embedded.client
    with contextlib.suppress(ApiException):
        admin.core.create_namespace({"metadata": {"name": NAMESPACE,
                                                  "labels": {"app.kubernetes.io/managed-by": "gpuproof"}}})
    return DynamicClient(admin.api)


def dry_run_apply(api, obj: dict):
    resource = api.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    return api.server_side_apply(resource, body=obj, field_manager="gpuproof-deploy", force_conflicts=True,
                                 dry_run="All", query_params=[("fieldValidation", "Strict")])


def test_rbac_and_cronjob_set_apply_with_server_side_dry_run(api):
    assert RBAC.exists(), "deploy/rbac.yaml is applied first: the CronJob's ServiceAccount and rights are there"
    objs = apply_order()
    applied = {}
    for obj in objs:
        out = dry_run_apply(api, obj)
        applied[(obj["kind"], obj["metadata"]["name"])] = out
        assert out.metadata.name == obj["metadata"]["name"]
    cron = applied[("CronJob", "gpuproof-nightly")]
    assert cron.spec.jobTemplate.spec.template.spec.serviceAccountName == SA     # as the server stored it
    assert {k for k, _ in applied} >= {"CronJob", "PersistentVolumeClaim", "ConfigMap", "ServiceAccount",
                                       "ClusterRole", "ClusterRoleBinding"}
    # a dry run leaves nothing behind
    from kubernetes.dynamic.exceptions import NotFoundError

    with pytest.raises(NotFoundError):
        api.resources.get(api_version="batch/v1", kind="CronJob").get(name="gpuproof-nightly", namespace=NAMESPACE)


BROKEN = {
    # what is wrong: (edit of cronjob.yaml, what the API server says)
    "bad-schedule": (('schedule: "17 2 * * *"', 'schedule: "17 25 * * *"'), "spec.schedule"),
    "bad-time-zone": (("timeZone: Etc/UTC", "timeZone: Mars/Olympus"), "spec.timeZone"),
    "field-typo": (("serviceAccountName: gpuproof", "serviceAcountName: gpuproof"),
                   "serviceAcountName: field not declared in schema"),
    "wrong-restart-policy": (("restartPolicy: Never", "restartPolicy: Always"), "restartPolicy"),
    "bad-quantity": (("storage: 5Gi", "storage: five-gigs"), "quantities must match"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_manifest_is_refused_by_the_api_server(api, case):
    from kubernetes.dynamic.exceptions import DynamicApiError

    (old, new), says = BROKEN[case]
    source = next(p for p in sorted(CRONJOB_DIR.glob("*.yaml")) if old in p.read_text())
    broken = [d for d in yaml.safe_load_all(source.read_text().replace(old, new)) if d]
    with pytest.raises(DynamicApiError) as err:
        for obj in broken:
            dry_run_apply(api, obj)
    assert says in str(err.value.summary()), err.value.summary()


def test_a_removed_api_version_is_refused(api):
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    cron = find(docs(CRONJOB_DIR / "cronjob.yaml"), "CronJob")
    with pytest.raises(ResourceNotFoundError):
        dry_run_apply(api, {**cron, "apiVersion": "batch/v1beta1"})


def test_the_pieces_fit_together():
    objs = apply_order()
    cron = find(objs, "CronJob", "gpuproof-nightly")
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    # the ServiceAccount rbac.yaml makes and binds to ClusterRole gpuproof
    find(objs, "ServiceAccount", pod["serviceAccountName"])
    binding = next(o for o in objs if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == "gpuproof")
    assert {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE} in binding["subjects"]
    find(objs, "ClusterRole", "gpuproof")
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] in
            ("CronJob", "PersistentVolumeClaim", "ConfigMap", "ServiceAccount")} == {NAMESPACE}
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and cron["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 0
    # volumes and config refer to what the set makes
    volumes = {v["name"]: v for v in pod["volumes"]}
    find(objs, "PersistentVolumeClaim", volumes["reports"]["persistentVolumeClaim"]["claimName"])
    config = find(objs, "ConfigMap", "gpuproof-nightly")
    container = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    env = {e["name"]: e for e in container["env"]}
    assert mounts["reports"] == env["GPUPROOF_REPORT_DIR"]["value"] == "/reports"
    assert env["GPUPROOF_ARGS"]["valueFrom"]["configMapKeyRef"] == {"name": "gpuproof-nightly", "key": "args"}
    assert mounts["config"] == "/etc/gpuproof"          # the entrypoint's default rules/baseline folder
    from gpuproof.report.baseline import parse_rules

    assert parse_rules(yaml.safe_load(config["data"]["rules.yaml"]), "config.yaml")
    # the image runs as the user the pod asks for, with the entrypoint the tests run
    dockerfile = (IMAGE_DIR / "Dockerfile").read_text()
    assert f"USER {pod['securityContext']['runAsUser']}:" in dockerfile
    assert 'ENTRYPOINT ["/usr/local/bin/gpuproof-in-cluster"]' in dockerfile
    for src in re.findall(r"^COPY (\S+) ", dockerfile, re.M):
        assert src == "dist/" or (REPO / src).exists(), f"the Dockerfile copies {src}, which is not in the repository"


# ---------------------------------------------------------------------------- the entrypoint, as in the pod


class Uploads(http.server.BaseHTTPRequestHandler):
    received: dict[str, tuple[bytes, dict]] = {}

    def do_PUT(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Uploads.received[self.path] = (body, dict(self.headers))
        self.send_response(201)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def upload_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Uploads)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Uploads.received = {}
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def rbac_applied(embedded):
    """deploy/rbac.yaml created for real (what this test creates is deleted after; the namespace stays)."""
    from kubernetes import utils
    from kubernetes.client import RbacAuthorizationV1Api
    from kubernetes.client.exceptions import ApiException

    admin = embedded.client
    rbac_api = RbacAuthorizationV1Api(admin.api)
    made = []
    for obj in docs(RBAC):
        try:
            utils.create_from_dict(admin.api, obj)
            made.append(obj)
        except utils.FailToCreateError as exc:
            if exc.api_exceptions[0].status != 409:
                raise
    try:
        yield
    finally:
        for obj in reversed(made):
            kind, name, ns = obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")
            delete = {"ServiceAccount": lambda: admin.core.delete_namespaced_service_account(name, ns),
                      "ClusterRole": lambda: rbac_api.delete_cluster_role(name),
                      "ClusterRoleBinding": lambda: rbac_api.delete_cluster_role_binding(name),
                      "Role": lambda: rbac_api.delete_namespaced_role(name, ns),
                      "RoleBinding": lambda: rbac_api.delete_namespaced_role_binding(name, ns)}.get(kind)
            if delete is not None:
                with contextlib.suppress(ApiException):
                    delete()


def pod_environment(embedded, tmp_path: Path) -> dict[str, str]:
    """What the kubelet gives the CronJob's container: the ServiceAccount's token, CA and namespace in a
    folder, and the API server's address in KUBERNETES_SERVICE_HOST/PORT."""
    from kubernetes import client as k8s

    cfg = yaml.safe_load(Path(embedded.kubeconfig).read_text())["clusters"][0]["cluster"]
    host, port = re.match(r"https://([^:/]+):(\d+)", cfg["server"]).groups()
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    token = embedded.client.core.create_namespaced_service_account_token(
        SA, NAMESPACE, k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[],
                                                                                     expiration_seconds=3600)))
    (sa_dir / "token").write_text(token.status.token)
    shutil.copy(cfg["certificate-authority"], sa_dir / "ca.crt")
    (sa_dir / "namespace").write_text(NAMESPACE)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"     # gpuproof and python3, as in the image
    return dict(os.environ, PATH=path, KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port,
                GPUPROOF_SA_DIR=str(sa_dir))


def test_entrypoint_kubeconfig_is_the_pods_serviceaccount(embedded, rbac_applied, tmp_path):
    from kubernetes import client as k8s

    from gpuproof.cluster.api import connect

    env = pod_environment(embedded, tmp_path)
    out = tmp_path / "kubeconfig"
    proc = subprocess.run(["bash", str(ENTRYPOINT), "kubeconfig", str(out)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    cluster = connect(str(out))
    review = k8s.AuthenticationV1Api(cluster.api).create_self_subject_review(
        k8s.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"))
    assert review.status.user_info.username == f"system:serviceaccount:{NAMESPACE}:{SA}"
    # outside a pod it says why, in one line
    env.pop("KUBERNETES_SERVICE_HOST")
    proc = subprocess.run(["bash", str(ENTRYPOINT), "kubeconfig", str(out)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "gpuproof-in-cluster: KUBERNETES_SERVICE_HOST/PORT are not set: not running in a pod?"


def test_entrypoint_runs_the_nightly_as_the_serviceaccount(embedded, rbac_applied, upload_server, tmp_path):
    from gpuproof.report.baseline import make_baseline, save_baseline
    from gpuproof.report.data import load_run
    from synthetic_runs import make_run

    env = pod_environment(embedded, tmp_path)
    reports = tmp_path / "reports"            # the CronJob's volume
    for old in ("nightly-20250101-000000", "nightly-20250102-000000", "nightly-20250103-000000"):
        (reports / old).mkdir(parents=True)
    (reports / "keep-me").mkdir()             # not a nightly run: never pruned
    config = tmp_path / "etc-gpuproof"        # the CronJob's ConfigMaps
    config.mkdir()
    (config / "rules.yaml").write_text(yaml.safe_load((CRONJOB_DIR / "config.yaml").read_text())["data"]["rules.yaml"])
    save_baseline(make_baseline([load_run(make_run(tmp_path / "good", "good"))]), config / "baseline.json")
    env.update(GPUPROOF_REPORT_DIR=str(reports), GPUPROOF_RUN_ID="nightly-20260101-021700", GPUPROOF_KEEP_RUNS="2",
               GPUPROOF_ARGS="-- -k test_discovery", GPUPROOF_BASELINE=str(config / "baseline.json"),
               GPUPROOF_RULES=str(config / "rules.yaml"), GPUPROOF_REPORT_URL=f"{upload_server}/nightly/",
               GPUPROOF_REPORT_AUTH="Bearer t0ken")
    proc = subprocess.run(["bash", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    run = reports / "nightly-20260101-021700"
    assert (run / "summary.md").is_file(), out[-4000:]
    # the run itself passed with only rbac.yaml's rights (run lease included) ...
    junit = (run / "junit.xml").read_text()
    assert re.search(r'tests="[1-9]', junit) and 'failures="0"' in junit and 'errors="0"' in junit, out[-4000:]
    assert "the rules decide the exit code" not in out
    # ... and the rules decide the exit code: a run without the baseline's benchmark figures fails them
    assert proc.returncode == 2 and "has no metrics" in out, out[-4000:]
    # kept on the volume: the newest two nightly runs (this one included), and what is not a nightly
    assert sorted(p.name for p in reports.iterdir()) == ["keep-me", "nightly-20250103-000000",
                                                         "nightly-20260101-021700"]
    # uploaded as a .tar.gz holding the run folder
    body, headers = Uploads.received["/nightly/nightly-20260101-021700.tar.gz"]
    assert headers["Authorization"] == "Bearer t0ken" and headers["Content-Type"] == "application/gzip"
    names = tarfile.open(fileobj=io.BytesIO(body), mode="r:gz").getnames()
    assert "nightly-20260101-021700/summary.md" in names and "nightly-20260101-021700/checks.jsonl" in names
