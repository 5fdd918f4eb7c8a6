"""Services and cluster DNS for the embedded cluster's kubelet nodes: kube-proxy and CoreDNS, as clusters run them.

- **kube-proxy** v1.35.4 (``k8s.io/kubernetes/cmd/kube-proxy`` from ``controlplane/kube``), one per kubelet node,
  iptables mode, in the node's network and mount namespaces and its daemons' cgroup (like its kubelet), as
  ``system:kube-proxy`` (the API server's bootstrap RBAC binds that user to ``system:node-proxier``). Its rules
  live in the node's network namespace and go with it.
- **CoreDNS** (``github.com/coredns/coredns``, pinned in ``controlplane/coredns``, a static ``CGO_ENABLED=0``
  binary in an image of its own) as the Deployment ``kube-system/coredns`` behind the Service ``kube-dns`` at the
  10th address of the service range, from Kubernetes' own addon manifest
  (``cluster/addons/dns/coredns/coredns.yaml.base`` of the pinned ``k8s.io/kubernetes``), with every kubelet's
  ``clusterDNS``/``clusterDomain`` pointing at it.

The ``kubernetes`` Service: the API server advertises 127.0.0.1, which an Endpoints object may not hold (its
reconciler logs ``may not be in the loopback range`` every 10 s and writes nothing), so the Service has no
endpoints of its own. :func:`deploy` writes its EndpointSlice with the address the nodes reach the API server
at (the node bridge's, which the host DNATs to 127.0.0.1), what the reconciler would write for an API server
advertising that address; kube-proxy programs ``10.96.0.1:443`` from it like any other Service.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable

import yaml

from ..errors import ControlPlaneError
from . import binaries as _binaries

Progress = Callable[[str], None]
KUBE_PROXY = ("kube", "k8s.io/kubernetes/cmd/kube-proxy")
PROXY_USER = "system:kube-proxy"                 # bound to ClusterRole system:node-proxier by bootstrap RBAC
COREDNS_VERSION = "v1.14.7"                      # the newest on the proxy built against k8s.io v0.35 (v1.15.0: v0.37)
COREDNS = ("coredns", "github.com/coredns/coredns")
COREDNS_ENV = {"CGO_ENABLED": "0"}
COREDNS_ADDON = "cluster/addons/dns/coredns/coredns.yaml.base"   # in k8s.io/kubernetes
CLUSTER_DOMAIN = "cluster.local"
DNS_MEMORY_LIMIT = "170Mi"                       # kube-up's value for the addon's __DNS__MEMORY__LIMIT__
DNS_NAMESPACE = "kube-system"
DNS_SERVICE = "kube-dns"


def _quiet(msg: str) -> None:
    pass


# ---------------------------------------------------------------------------- binaries and the image


def _binary(name: str, module: str, package: str, ldflags: str, env: dict[str, str], progress: Progress) -> Path:
    """``$GPUPROOF_<NAME>``, ``$GPUPROOF_BIN_DIR/<name>``, else built into the cache from ``controlplane/<module>``."""
    override = os.environ.get(_binaries.env_var(name))
    if override:
        return Path(override)
    bin_dir = os.environ.get("GPUPROOF_BIN_DIR")
    if bin_dir and (Path(bin_dir) / name).is_file():
        return Path(bin_dir) / name
    return _binaries.go_build(module, {name: package}, ldflags=ldflags, env=env, progress=progress) / name


def kube_proxy_binary(progress: Progress = _quiet) -> Path:
    module, package = KUBE_PROXY
    return _binary("kube-proxy", module, package, _binaries.LDFLAGS[module], {}, progress)


def coredns_binary(progress: Progress = _quiet) -> Path:
    module, package = COREDNS
    return _binary("coredns", module, package, "-s -w", COREDNS_ENV, progress)


def addon_manifest() -> str:
    """Kubernetes' CoreDNS addon manifest (``COREDNS_ADDON``) of the pinned ``k8s.io/kubernetes``, copied once
    into the ``kube`` module's cache folder (the module cache needs to hold it only then)."""
    module = KUBE_PROXY[0]
    copy = _binaries.module_cache(module, _binaries.LDFLAGS[module]) / Path(COREDNS_ADDON).name
    if not copy.exists():
        from .kubelet.host import _sh

        where = _sh(shutil.which("go") or "go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes",
                    cwd=_binaries.modules_dir() / module, env={**os.environ, "GOFLAGS": "-mod=mod"}).stdout.strip()
        copy.parent.mkdir(parents=True, exist_ok=True)
        tmp = copy.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(Path(where) / COREDNS_ADDON, tmp)
        tmp.replace(copy)
    return copy.read_text()


def build(progress: Progress = _quiet) -> tuple[Path, str]:
    """Build (or find) kube-proxy, CoreDNS, its image and the addon manifest; returns the image."""
    from . import images

    kube_proxy_binary(progress)
    addon_manifest()
    return images.coredns_image(coredns_binary(progress), COREDNS_VERSION)


def prepare(nodes: list, node_images: dict[str, list[tuple[Path, str]]] | None,
            progress: Progress = _quiet) -> dict[str, list[tuple[Path, str]]]:
    """Build what the nodes need before they start; returns ``node_images`` (node name -> images it alone
    imports) with CoreDNS's on the node it runs on."""
    image = build(progress)
    first = coredns_node([n.name for n in nodes])
    return {**(node_images or {}), first: [*(node_images or {}).get(first, []), image]}


def coredns_node(nodes: list[str]) -> str:
    """The kubelet node CoreDNS runs on: the first. Its image (76 MB) is imported there alone, which saves
    about a second per other node; where CoreDNS runs makes no difference to the pods that ask it."""
    return nodes[0]


# ---------------------------------------------------------------------------- kube-proxy on each node


def dns_ip(api_service: str) -> str:
    """kube-dns's ClusterIP: the conventional 10th address of the service range. The API server gives the
    ``kubernetes`` Service the range's first (10.96.0.1 of ``--service-cluster-ip-range=10.96.0.0/16``)."""
    return str(ipaddress.ip_address(api_service) + 9)


def kubelet_dns(api_service: str) -> dict:
    """The kubelet configuration's cluster DNS: pods with ``dnsPolicy: ClusterFirst`` get kube-dns."""
    if not api_service:
        return {}
    return {"clusterDNS": [dns_ip(api_service)], "clusterDomain": CLUSTER_DOMAIN}


def proxy_config(node, state, kubeconfig: Path) -> dict:
    """kube-proxy's configuration on ``node`` (a :class:`gpuproof.sim.kubelet.Node`)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables", "hostnameOverride": node.name, "bindAddress": node.ip(state.subnet),
        # every node's pod range is a /24 of one /16 (Node.pod_cidr)
        "clusterCIDR": str(ipaddress.ip_network(node.pod_cidr).supernet(new_prefix=16)),
        "detectLocalMode": "ClusterCIDR", "nodePortAddresses": ["primary"],
        # masquerade all Service traffic: without br_netfilter (a host-wide module, left alone) a backend's reply
        # to a client pod on its own bridge would skip the DNAT's conntrack entry
        "iptables": {"masqueradeAll": True},
        # leave conntrack's limits alone: nf_conntrack_max and its hash size are the host's, not the node's
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "metricsBindAddress": "127.0.0.1:10249",
    }


def start_proxy(sim_dir: Path, state, node, root: Path, join: Callable[[], None], *nsenter: str) -> None:
    """Start ``node``'s kube-proxy in its namespaces (``nsenter`` arguments) and daemons' cgroup (``join``)."""
    from .kubelet.host import _spawn, client_kubeconfig

    etc = root / "etc" / "kube-proxy"
    etc.mkdir(parents=True, exist_ok=True)
    kubeconfig = client_kubeconfig(sim_dir, state, etc, PROXY_USER)
    (etc / "config.yaml").write_text(yaml.safe_dump(proxy_config(node, state, kubeconfig), sort_keys=False))
    proc = _spawn(root / "logs" / "kube-proxy.log", join, "nsenter", *nsenter, str(kube_proxy_binary()),
                  f"--config={etc / 'config.yaml'}", "--v=1")
    state.pids[f"{node.name}/kube-proxy"] = proc.pid


# ---------------------------------------------------------------------------- objects in the API


def kubernetes_endpoints(state) -> dict:
    """The ``kubernetes`` Service's EndpointSlice: the API server as the nodes reach it (see the module's doc)."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "kubernetes"}},
            "endpoints": [{"addresses": [state.gateway], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": state.api_port, "protocol": "TCP"}]}


def coredns_manifests(addon: str, api_service: str, image: str, node: str) -> list[dict]:
    """Kubernetes' CoreDNS addon, filled in as kube-up does, with these changes: our image (the nodes pull
    nothing); no ``forward`` (the nodes reach no upstream resolver) and so no ``loop``, which only guards it
    (alone it logs ``no next plugin found`` at start); on ``node``, the one that has the image, whatever its
    taints (a kwok node would only pretend to run it); and a readiness
    probe every second, not 10: a kubelet that has just started delays each first probe by a random part of
    the period (``prober/worker.go``), so CoreDNS on a new node would be Ready 0-20 s after it answers."""
    text = (addon.replace("__DNS__DOMAIN__", CLUSTER_DOMAIN).replace("__DNS__SERVER__", dns_ip(api_service))
            .replace("__DNS__MEMORY__LIMIT__", DNS_MEMORY_LIMIT))
    docs = [d for d in yaml.safe_load_all(text) if d]
    for d in docs:
        if d["kind"] == "ConfigMap":
            corefile = re.sub(r"\n *forward [^{\n]*\{[^}]*\}", "", d["data"]["Corefile"])
            d["data"]["Corefile"] = re.sub(r"\n *loop\n", "\n", corefile)
        elif d["kind"] == "Deployment":
            spec = d["spec"]["template"]["spec"]
            spec["containers"][0].update(image=image, imagePullPolicy="Never")
            spec["containers"][0]["readinessProbe"]["periodSeconds"] = 1
            spec["tolerations"] = [*spec.get("tolerations", []), {"operator": "Exists", "effect": "NoSchedule"}]
            spec["nodeSelector"] = {**spec.get("nodeSelector", {}), "kubernetes.io/hostname": node}
    return docs


def unload(client) -> None:
    """Remove CoreDNS's pods and the ``kubernetes`` EndpointSlice of the previous kubelet nodes; keep the rest
    (RBAC, ConfigMap, Service), which :func:`deploy` finds again."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    with contextlib.suppress(ApiException):
        client.apps.delete_namespaced_deployment("coredns", DNS_NAMESPACE)
    with contextlib.suppress(ApiException):
        client.core.delete_collection_namespaced_pod(DNS_NAMESPACE, label_selector="k8s-app=kube-dns",
                                                     grace_period_seconds=0)
    with contextlib.suppress(ApiException):
        k8s.DiscoveryV1Api(client.api).delete_namespaced_endpoint_slice("kubernetes", "default")


def deploy(client, state, progress: Progress = _quiet) -> None:
    """Publish the ``kubernetes`` endpoints and create CoreDNS (its RBAC, Corefile, Deployment and Service)."""
    from . import images
    from .kubelet.host import _create

    unload(client)
    _, image = images.coredns_image(coredns_binary(), COREDNS_VERSION)
    node = coredns_node(state.nodes)
    _create(client, [kubernetes_endpoints(state),
                     *coredns_manifests(addon_manifest(), state.api_service, image, node)])
    progress(f"kube-proxy on {len(state.nodes)} kubelet node(s); CoreDNS {COREDNS_VERSION} on {node} at "
             f"{dns_ip(state.api_service)} ({DNS_SERVICE}.{DNS_NAMESPACE})")


def wait(client, state, timeout: float) -> None:
    """Until CoreDNS is ready behind kube-dns and every node's kube-proxy has its address in the node's rules
    (kube-proxy syncs up to a second after the API says so: a pod asking before that is refused)."""
    from kubernetes import client as k8s

    from ..cluster.api import watch_until
    from .kubelet.host import _sh

    deadline = time.monotonic() + timeout

    def ready(cache) -> str:
        return next((e.addresses[0] for s in cache.values() for e in s.endpoints or [] if e.conditions.ready), "")

    pod = watch_until(k8s.DiscoveryV1Api(client.api).list_namespaced_endpoint_slice, ready, timeout,
                      f"CoreDNS to be ready behind {DNS_SERVICE}", namespace=DNS_NAMESPACE,
                      label_selector=f"kubernetes.io/service-name={DNS_SERVICE}")
    rule = f'"{DNS_NAMESPACE}/{DNS_SERVICE}:dns -> {pod}:53"'          # kube-proxy's comment on its rule
    for i, name in enumerate(state.nodes):
        delay = 0.05
        while rule not in _sh("ip", "netns", "exec", state.netns(i), "iptables", "-t", "nat", "-S",
                              check=False).stdout:
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for kube-proxy on kubelet node "
                                        f"{name} to route {DNS_SERVICE} to {pod}; see its kube-proxy.log")
            time.sleep(delay)     # rules have no watch: poll with a growing interval
            delay = min(delay * 1.5, 0.5)
