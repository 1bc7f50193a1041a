"""deploy/kubernetes: the RBAC and the webhook rules are the ones the code generates, so the
e2e test that runs the control plane under them (test_kube_manifests.py) proves what ships."""
from pathlib import Path

import yaml

from harness.paths import ROOT
from mcp26.xds.admission import WEBHOOK_CONFIGURATION, rules
from mcp26.xds.kube_control import cluster_rules, namespace_rules

DEPLOY = ROOT / "deploy" / "kubernetes"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def test_the_roles_are_exactly_what_the_control_plane_uses():
    by_kind = {d["kind"]: d for d in docs("rbac.yaml")}
    assert by_kind["ClusterRole"]["rules"] == cluster_rules()
    assert by_kind["Role"]["rules"] == namespace_rules()
    verbs = {v for r in cluster_rules() for v in r["verbs"]}
    assert verbs == {"list", "watch", "patch", "create", "get"}            # no delete, no update, no *
    assert not any(r["resources"] == ["*"] or r["apiGroups"] == ["*"] for r in cluster_rules())


def test_the_webhook_sends_the_kinds_the_control_plane_validates():
    (hook,) = docs("webhook.yaml")
    assert hook["metadata"]["name"] == WEBHOOK_CONFIGURATION
    (w,) = hook["webhooks"]
    assert w["rules"] == rules() and w["failurePolicy"] == "Fail" and w["sideEffects"] == "None"
    assert "caBundle" not in w["clientConfig"]        # the control plane fills it from the mesh CA


def test_every_file_is_listed_in_the_kustomization():
    k = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(p.name for p in Path(DEPLOY).glob("*.yaml") if p.name != "kustomization.yaml")
