"""deploy/k8s/keda-scaledobject.yaml against KEDA's CRD schemas (the models
cloudcoil-models-keda generates from them), strictly: a field the schema does not know
fails, as kubernetes-validate's strict mode does for the other manifests. And the
manifest scales the stage that deploy/k8s describes: its group, topic, brokers, Secret,
and no more replicas than the HPA allows."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication
from pydantic import BaseModel, ValidationError

from tests.unit.test_k8s_manifests import K8S, documents

KEDA = K8S / "keda-scaledobject.yaml"
# The stage's sasl.mechanism as KEDA's Kafka scaler names it.
KEDA_SASL = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256",
             "SCRAM-SHA-512": "scram_sha512"}
MODELS: dict[str, type[BaseModel]] = {"ScaledObject": ScaledObject,
                                      "TriggerAuthentication": TriggerAuthentication}


def validate(doc: dict[str, Any]) -> None:
    """Validate ``doc`` against its kind's schema; ValueError names what the schema
    dropped (the models ignore unknown fields, the API server prunes them)."""
    model = MODELS[doc["kind"]].model_validate(doc)
    kept = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
    dropped = _dropped(doc, kept)
    if dropped:
        raise ValueError(f"{doc['kind']}: fields KEDA's schema does not know: {dropped}")


def _dropped(given: Any, kept: Any, where: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        return [found for key, value in given.items()
                for found in ([f"{where}.{key}"] if key not in kept
                              else _dropped(value, kept[key], f"{where}.{key}"))]
    if isinstance(given, list) and isinstance(kept, list):
        return [found for n, (a, b) in enumerate(zip(given, kept, strict=False))
                for found in _dropped(a, b, f"{where}[{n}]")]
    return []


def objects() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in documents(KEDA)}


def test_the_keda_objects_are_valid_against_kedas_schema() -> None:
    found = objects()
    assert set(found) == set(MODELS)
    for doc in found.values():
        validate(doc)


@pytest.mark.parametrize("break_it", [
    lambda so: so["spec"].update(maxReplicas=8),                        # HPA's spelling
    lambda so: so["spec"]["triggers"][0].update(authenticationRefs={}),  # misspelt
    lambda so: so["spec"].update(minReplicaCount="none"),                 # wrong type
])
def test_the_validation_refuses_a_broken_scaled_object(break_it: Any) -> None:
    broken = copy.deepcopy(objects()["ScaledObject"])
    break_it(broken)
    with pytest.raises((ValueError, ValidationError)):
        validate(broken)


def test_the_trigger_scales_the_stage_deploy_k8s_describes() -> None:
    found = objects()
    spec = found["ScaledObject"]["spec"]
    [trigger] = spec["triggers"]
    settings = next(d for d in documents(K8S / "configmap.yaml") if d["kind"] == "ConfigMap")
    data = settings["data"]
    [deployment] = [d for d in documents(K8S / "deployment.yaml") if d["kind"] == "Deployment"]
    [hpa] = documents(K8S / "hpa.yaml")
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["consumerGroup"] == data["TXSTAGE_GROUP_ID"]
    assert meta["topic"] == data["TXSTAGE_INPUT_TOPICS"]
    assert meta["bootstrapServers"] == data["TXSTAGE_BOOTSTRAP_SERVERS"]
    assert meta["allowIdleConsumers"] == "false"
    assert int(meta["lagThreshold"]) > 0 and int(meta["activationLagThreshold"]) >= 0
    assert meta["sasl"] == KEDA_SASL[data["TXSTAGE_KAFKA__sasl.mechanism"]]
    assert data["TXSTAGE_KAFKA__security.protocol"] == "SASL_SSL" and meta["tls"] == "enable"
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert spec["maxReplicaCount"] == hpa["spec"]["maxReplicas"]
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down == hpa["spec"]["behavior"]["scaleDown"]  # as slow as the HPA's
    auth = found["TriggerAuthentication"]
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    secrets = {volume["secret"]["secretName"] for volume in
               deployment["spec"]["template"]["spec"]["volumes"] if "secret" in volume}
    refs = {(ref["parameter"], ref["name"], ref["key"]) for ref in auth["spec"]["secretTargetRef"]}
    assert {name for _, name, _ in refs} == secrets == {"txstage-kafka"}
    assert {(p, k) for p, _, k in refs} == {("username", "sasl.username"),
                                            ("password", "sasl.password"), ("ca", "ca.pem")}


def test_the_manifest_is_plain_yaml_with_two_documents() -> None:
    assert len([d for d in yaml.safe_load_all(KEDA.read_text()) if d]) == 2
