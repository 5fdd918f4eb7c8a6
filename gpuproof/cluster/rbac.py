"""Least-privilege RBAC: the rules gpuproof needs, the manifest that grants them, and the pre-flight.

``gpuproof/cluster/rbac.yaml`` lists every RBAC rule gpuproof needs, each with what needs it (``clean``,
``run``, ``lease``, ``dra``, ``bench``) and why. From it come:

- ``deploy/rbac.yaml`` (``python -m gpuproof.rbac > deploy/rbac.yaml``): Namespace ``gpuproof-system``
  and, per role (``gpuproof``, ``gpuproof-no-bench``, ``gpuproof-clean``), a ServiceAccount, a
  ClusterRole with the cluster-wide rules, a Role in ``gpuproof-system`` with the run lease's rules,
  and the bindings of both to the ServiceAccount;
- the pre-flight (:func:`preflight`): before a run or ``gpuproof clean`` creates anything, one
  SelfSubjectAccessReview per verb, resource (and namespace and name, for the lease's rules) of
  every rule the command needs; what is denied is named rule by rule, in one line.

The rules are read from the file shipped in the package, so an installed gpuproof checks what it
needs whatever its checkout state; tests/test_rbac.py keeps deploy/rbac.yaml equal to what this
module makes of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import yaml

from ..errors import ClusterError, GpuproofError

SPEC_PATH = Path(__file__).with_name("rbac.yaml")
NEEDS = {"clean": "gpuproof clean", "run": "the suites", "lease": "the run lease",
         "dra": "the DRA suite", "bench": "the benchmarks (--bench)"}
READ_VERBS = frozenset({"get", "list", "watch"})
VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"})
PART_OF = {"app.kubernetes.io/part-of": "gpuproof"}
GENERATE = "python -m gpuproof.rbac"


class RbacSpecError(GpuproofError):
    """gpuproof/cluster/rbac.yaml (or a file given instead) is malformed; the message names the file and the entry."""


@dataclasses.dataclass(frozen=True)
class Access:
    """One question for the cluster: may we <verb> <group>/<resource>[/<subresource>] [<name>] [in <namespace>]?"""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""


@dataclasses.dataclass(frozen=True)
class Rule:
    needs: tuple[str, ...]
    purpose: str
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    namespace: str = ""                        # '' = cluster-wide (ClusterRole)
    resource_names: tuple[str, ...] = ()

    def accesses(self) -> list[Access]:
        """Every (verb, group, resource, name) the rule grants, as access reviews ask about them."""
        out = []
        for group, res, verb in itertools.product(self.api_groups, self.resources, self.verbs):
            resource, _, sub = res.partition("/")
            for name in self.resource_names or ("",):
                out.append(Access(verb, group, resource, sub, self.namespace, name))
        return out

    @property
    def scope(self) -> str:
        return f"namespace {self.namespace}" if self.namespace else "cluster-wide"

    def describe(self, verbs: Iterable[str] | None = None) -> str:
        """'create scheduling.k8s.io/priorityclasses (cluster-wide)': the rule, or only some of its verbs."""
        verbs = [v for v in self.verbs if verbs is None or v in set(verbs)]
        what = ",".join(f"{g}/{r}" if g else r for g in self.api_groups for r in self.resources)
        named = f" named {','.join(self.resource_names)}" if self.resource_names else ""
        return f"{','.join(verbs)} {what}{named} ({self.scope})"

    def policy_rule(self) -> dict:
        rule = {"apiGroups": list(self.api_groups), "resources": list(self.resources)}
        if self.resource_names:
            rule["resourceNames"] = list(self.resource_names)
        rule["verbs"] = list(self.verbs)
        return rule


@dataclasses.dataclass(frozen=True)
class Role:
    name: str
    needs: tuple[str, ...]
    purpose: str


@dataclasses.dataclass(frozen=True)
class Spec:
    namespace: str
    roles: tuple[Role, ...]
    rules: tuple[Rule, ...]

    def role(self, name: str) -> Role:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    def rules_for(self, needs: Iterable[str]) -> list[Rule]:
        """The rules any of these needs call for, in file order."""
        wanted = set(needs)
        return [r for r in self.rules if wanted & set(r.needs)]

    def role_rules(self, name: str) -> list[Rule]:
        return self.rules_for(self.role(name).needs)

    def smallest_role(self, rules: Iterable[Rule]) -> Role | None:
        """The role with the fewest rules that has all of these."""
        wanted = set(rules)
        fits = [r for r in self.roles if wanted <= set(self.role_rules(r.name))]
        return min(fits, key=lambda r: len(self.role_rules(r.name)), default=None)


# ----------------------------------------------------------------------------- reading the rules


def load(path: str | Path | None = None) -> Spec:
    """Read and check the rules file (default: the one shipped in the package)."""
    p = Path(path) if path is not None else SPEC_PATH
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise RbacSpecError(f"{p}: cannot read the RBAC rules: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise RbacSpecError(f"{p}: not valid YAML: {where}{getattr(exc, 'problem', exc)}") from None
    return parse(data, str(p))


def parse(data, source: str = "rbac rules") -> Spec:
    def fail(where: str, problem: str):
        raise RbacSpecError(f"{source}: {where}: {problem}")

    if not isinstance(data, dict):
        fail("top level", "expected a mapping with namespace, roles and rules")
    unknown = set(data) - {"namespace", "roles", "rules"}
    if unknown:
        fail("top level", f"unknown key(s) {', '.join(sorted(unknown))}")
    namespace = data.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        fail("namespace", "expected the ServiceAccounts' namespace, a non-empty string")

    def words(where: str, value, allowed=None, empty_ok=False) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (not value and not empty_ok):
            fail(where, f"expected a list of strings, got {value!r}")
        if len(set(value)) != len(value):
            fail(where, f"repeats an entry: {value}")
        bad = [v for v in value if allowed is not None and v not in allowed]
        if bad:
            fail(where, f"unknown {', '.join(bad)} (known: {', '.join(sorted(allowed))})")
        return tuple(value)

    roles_in = data.get("roles")
    if not isinstance(roles_in, dict) or not roles_in:
        fail("roles", "expected a mapping of role name to {needs, for}")
    roles = []
    for name, body in roles_in.items():
        if not isinstance(body, dict) or set(body) != {"needs", "for"}:
            fail(f"role {name}", "expected exactly the keys needs and for")
        roles.append(Role(str(name), words(f"role {name}: needs", body["needs"], NEEDS), str(body["for"])))

    rules_in = data.get("rules")
    if not isinstance(rules_in, list) or not rules_in:
        fail("rules", "expected a list of rules")
    rules, seen = [], {}
    keys = {"needs", "for", "apiGroups", "resources", "verbs", "namespace", "resourceNames"}
    for i, body in enumerate(rules_in, 1):
        where = f"rule {i}"
        if not isinstance(body, dict):
            fail(where, "expected a mapping")
        if set(body) - keys:
            fail(where, f"unknown key(s) {', '.join(sorted(set(body) - keys))}")
        missing = {"needs", "for", "apiGroups", "resources", "verbs"} - set(body)
        if missing:
            fail(where, f"missing {', '.join(sorted(missing))}")
        if not isinstance(body["for"], str) or not body["for"].strip():
            fail(f"{where}: for", "expected a sentence saying what needs the rule")
        ns = body.get("namespace", "")
        if ns not in ("", namespace):
            fail(f"{where}: namespace", f"only {namespace} (the run lease's) can hold namespaced rules, not {ns!r}")
        rule = Rule(needs=words(f"{where}: needs", body["needs"], NEEDS), purpose=" ".join(body["for"].split()),
                    api_groups=words(f"{where}: apiGroups", body["apiGroups"]),
                    resources=words(f"{where}: resources", body["resources"]),
                    verbs=words(f"{where}: verbs", body["verbs"], VERBS), namespace=ns,
                    resource_names=words(f"{where}: resourceNames", body.get("resourceNames", []), empty_ok=True))
        # one grant, one rule: a rule that repeats another's access could be removed without anything failing
        for a in rule.accesses():
            if a in seen:
                fail(where, f"grants {a.verb} {a.group + '/' if a.group else ''}{a.resource} again "
                            f"(rule {seen[a]} does already)")
            seen[a] = i
        rules.append(rule)
    used = {n for r in rules for n in r.needs}
    for role in roles:
        if not set(role.needs) & used:
            fail(f"role {role.name}", "no rule serves its needs")
    return Spec(namespace, tuple(roles), tuple(rules))


# ----------------------------------------------------------------------------- the manifest


def objects(spec: Spec | None = None) -> list[dict]:
    """deploy/rbac.yaml's objects, in apply order (plain API dicts)."""
    spec = spec or load()
    ns = spec.namespace
    out: list[dict] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": dict(PART_OF)}}]
    rbac = "rbac.authorization.k8s.io/v1"
    for role in spec.roles:
        rules = spec.role_rules(role.name)
        cluster_meta = {"name": role.name, "labels": dict(PART_OF)}
        ns_meta = {"name": role.name, "namespace": ns, "labels": dict(PART_OF)}
        subject = [{"kind": "ServiceAccount", "name": role.name, "namespace": ns}]
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(ns_meta)})
        for kind, scoped in (("ClusterRole", [r for r in rules if not r.namespace]),
                             ("Role", [r for r in rules if r.namespace])):
            if not scoped:
                continue
            m = dict(ns_meta if kind == "Role" else cluster_meta)
            out.append({"apiVersion": rbac, "kind": kind,
                        "metadata": {**m, "annotations": {"gpuproof.dev/for": role.purpose}},
                        "rules": [r.policy_rule() for r in scoped]})
            out.append({"apiVersion": rbac, "kind": f"{kind}Binding", "metadata": m,
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role.name},
                        "subjects": subject})
    return out


def manifest(spec: Spec | None = None) -> str:
    """deploy/rbac.yaml's text: the objects, with each rule's needs and purpose as a comment above it."""
    spec = spec or load()
    by_rule = {json.dumps(r.policy_rule(), sort_keys=True): r for r in spec.rules}
    sizes = ", ".join(f"{r.name} {len(spec.role_rules(r.name))}" for r in spec.roles)
    lines = [f"# Generated from gpuproof/cluster/rbac.yaml by `{GENERATE} > deploy/rbac.yaml`: "
             "edit that file, not this one.",
             "#",
             f"# What gpuproof needs in a cluster, least privilege. Each role is a ServiceAccount in {spec.namespace}",
             "# with a ClusterRole (cluster-wide rules) and a Role (the run lease's rules) of the same name:"]
    lines += [f"#   {r.name}: {r.purpose}" for r in spec.roles]
    lines += [f"# Rules per role: {sizes}.",
              "# `gpuproof run` and `gpuproof clean` check the rules they need before they create anything,",
              "# and name each missing one. Bind your own user or CI identity to a role instead of using its",
              "# ServiceAccount if you like.", ""]
    for obj in objects(spec):
        lines.append("---")
        head = {k: v for k, v in obj.items() if k != "rules"}
        lines.append(yaml.safe_dump(head, sort_keys=False, width=200).rstrip())
        if "rules" in obj:
            lines.append("rules:")
            for pr in obj["rules"]:
                rule = by_rule[json.dumps(pr, sort_keys=True)]
                lines.append(f"  # {', '.join(NEEDS[n] for n in rule.needs)}: {rule.purpose}")
                first = True
                for key, value in pr.items():
                    lines.append(f"  {'- ' if first else '  '}{key}: [{', '.join(_scalar(v) for v in value)}]")
                    first = False
    return "\n".join(lines) + "\n"


def _scalar(v: str) -> str:
    return v if re.fullmatch(r"[a-z0-9][a-z0-9./-]*", v) else json.dumps(v)


# ----------------------------------------------------------------------------- the pre-flight


def run_needs(bench: bool, lease: bool = True) -> set[str]:
    """What a run needs: the suites and the DRA suite, the run lease unless --no-lease, the benchmarks if chosen."""
    return {"run", "dra"} | ({"lease"} if lease else set()) | ({"bench"} if bench else set())


def pytest_needs(config) -> set[str]:
    """What a pytest session over the suites needs, from its options (before collection ends)."""
    return run_needs(bench=_bench_selected(config), lease=not config.getoption("--no-lease", False))


def _bench_selected(config) -> bool:
    """Whether benchmarks may run in this session: -m does not rule them out, nor do the paths given."""
    args = [a.split("::")[0] for a in (config.args or [])]
    if args and all(a.endswith(".py") and not Path(a).name.startswith("test_bench") for a in args):
        return False
    expr = config.getoption("markexpr", "") or ""
    if not expr.strip():
        return True
    try:
        from _pytest.mark.expression import Expression

        compiled = Expression.compile(expr)
        names = sorted(set(re.findall(r"[A-Za-z_][\w.-]*", expr)) - {"and", "or", "not", "True", "False", "bench"})
        if len(names) > 12:
            return True
        # a bench test may carry any other markers: selected if some combination of them lets it through
        for values in itertools.product((False, True), repeat=len(names)):
            marks = dict(zip(names, values), bench=True)
            if compiled.evaluate(lambda name, **kw: marks.get(name, False)):
                return True
        return False
    except Exception:         # an expression pytest itself will refuse, or another pytest: assume they run
        return True


def missing(cluster, needs: Iterable[str], read_only: bool = False, spec: Spec | None = None,
            workers: int = 8) -> list[tuple[Rule, list[str]]]:
    """(rule, its denied verbs) for each rule these needs call for that the credentials lack, in file order."""
    spec = spec or load()
    rules = spec.rules_for(needs)
    asks = [(rule, a) for rule in rules for a in rule.accesses() if not read_only or a.verb in READ_VERBS]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        answers = list(pool.map(lambda ra: allowed(cluster, ra[1]), asks))
    denied: dict[Rule, list[str]] = {}
    for (rule, a), ok in zip(asks, answers):
        if not ok and a.verb not in denied.setdefault(rule, []):
            denied[rule].append(a.verb)
    return [(rule, verbs) for rule, verbs in denied.items() if verbs]


def allowed(cluster, a: Access) -> bool:
    """The cluster's answer to one SelfSubjectAccessReview."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    review = k8s.V1SelfSubjectAccessReview(spec=k8s.V1SelfSubjectAccessReviewSpec(
        resource_attributes=k8s.V1ResourceAttributes(verb=a.verb, group=a.group, resource=a.resource,
                                                     subresource=a.subresource or None,
                                                     namespace=a.namespace or None, name=a.name or None)))
    try:
        answer = k8s.AuthorizationV1Api(cluster.api).create_self_subject_access_review(review)
    except ApiException as exc:
        raise ClusterError(f"cluster {cluster.name} did not answer an access review (SelfSubjectAccessReview, "
                           f"HTTP {exc.status} {exc.reason}), so gpuproof cannot check its permissions") from None
    return bool(answer.status.allowed)


def preflight(cluster, needs: Iterable[str], read_only: bool = False, spec: Spec | None = None) -> None:
    """Raise ClusterError, one line naming every missing rule, unless the credentials have all that ``needs``
    call for (``read_only``: only their get/list/watch verbs, e.g. for ``gpuproof clean --dry-run``)."""
    spec = spec or load()
    needs = set(needs)
    lacking = missing(cluster, needs, read_only=read_only, spec=spec)
    if not lacking:
        return
    role = spec.smallest_role(spec.rules_for(needs))
    parts = [f"missing RBAC rule: {rule.describe(verbs)}, needed by "
             f"{' and '.join(NEEDS[n] for n in rule.needs if n in needs)}: {rule.purpose}" for rule, verbs in lacking]
    hint = (f"Bind the credentials to ClusterRole and Role {role.name} (or use ServiceAccount "
            f"{spec.namespace}/{role.name}) from deploy/rbac.yaml; `{GENERATE} | kubectl apply -f -` creates them"
            if role else "See deploy/rbac.yaml")
    raise ClusterError(f"the credentials for cluster {cluster.name} lack {len(lacking)} RBAC rule(s) gpuproof needs "
                       f"before it creates anything: " + "; ".join(parts) + f". {hint}.")


# ----------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=GENERATE, description="Print deploy/rbac.yaml (the RBAC gpuproof needs), "
                                "made from gpuproof/cluster/rbac.yaml; pipe it to `kubectl apply -f -`.")
    p.add_argument("--rules", metavar="FILE", default=None,
                   help="rules file (default: the shipped gpuproof/cluster/rbac.yaml)")
    args = p.parse_args(argv)
    try:
        sys.stdout.write(manifest(load(args.rules)))
    except GpuproofError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
