"""The names and RBAC rules of the Kubernetes integration (gpuops.integrations.kubernetes.names)."""

from __future__ import annotations

from gpuops.integrations.kubernetes import names


def test_the_cluster_role_rules_are_the_calls_one_rule_per_group_and_resources() -> None:
    rules = names.cluster_role_rules()
    assert rules[0] == {
        "apiGroups": [""],
        "resources": ["nodes"],
        "verbs": ["list", "patch"],
    }
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in rules
    pairs = [(r.api_group, res) for r in names.RBAC_RULES for res in r.resources]
    assert len(pairs) == len(set(pairs)), "a resource granted twice"
    assert all(
        set(r["verbs"]) <= {"get", "list", "patch", "update", "create", "delete"} for r in rules
    )


def test_every_name_gpuops_writes_is_under_its_prefix() -> None:
    written = [
        names.CORDONED_BY,
        names.DECISION,
        names.EPISODE,
        names.REASON,
        names.AT,
        names.CANCELLED,
        names.TAINT_KEY,
        names.PREVIOUS_REPLICAS,
        names.REPLICAS,
        names.RECLAIMED_BY,
        names.SCALED_OUT,
        names.VETO_LABEL,
        names.DRAIN_MODE_LABEL,
    ]
    assert all(n.startswith("gpuops.io/") for n in written)
    assert names.verb_of("post") == "create" and names.verb_of("PUT") == "update"


def test_a_scalable_resource_needs_get_patch_and_its_scale_subresource() -> None:
    rules = [r.as_policy_rule() for r in names.rules_for_scalable("example.com", "pools")]
    assert rules == [
        {"apiGroups": ["example.com"], "resources": ["pools"], "verbs": ["get", "patch"]},
        {"apiGroups": ["example.com"], "resources": ["pools/scale"], "verbs": ["get", "update"]},
    ]
