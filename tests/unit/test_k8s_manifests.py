"""The Kubernetes manifests against the schemas of a current Kubernetes release.

``kubernetes-validate`` ships the OpenAPI schemas of every release; ``strict`` also
refuses fields the schema does not know (a misspelt ``livenessProbe`` would otherwise
be dropped by the API server without a word). ``deploy/k8s`` is rendered the way
``kubectl apply -k`` would for the parts this kustomization uses (its resources, common
labels, the image tag) and every rendered object is validated; the manifests outside
the kustomization (a Job template, the optional HPA, ...) are validated as they are.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUSTOMIZATION = K8S / "kustomization.yaml"
RELEASE = kubernetes_validate.latest_version()


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def manifests() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p != KUSTOMIZATION)


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    for key in ("jobTemplate", "template"):  # CronJob → Job → Pod, Deployment → Pod
        if key in spec:
            return containers(spec[key])
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


def render(kustomization: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``kubectl kustomize`` makes of the fields this kustomization uses."""
    known = {"apiVersion", "kind", "resources", "labels", "images"}
    unknown = set(kustomization) - known
    assert not unknown, f"render() does not implement {sorted(unknown)}: extend it"
    rendered = []
    for name in kustomization["resources"]:
        for doc in documents(K8S / name):
            obj = copy.deepcopy(doc)
            for label in kustomization.get("labels", []):
                obj.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
            for image in kustomization.get("images", []):
                for container in containers(obj):
                    repo = container["image"].rsplit(":", 1)[0]
                    if repo == image["name"]:
                        container["image"] = f"{image.get('newName', repo)}:{image['newTag']}"
            rendered.append(obj)
    return rendered


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.name)
def test_each_manifest_is_valid_for_a_current_kubernetes_release(path: Path) -> None:
    for doc in documents(path):
        if not doc["apiVersion"].startswith("keda.sh/"):  # KEDA's: test_keda_manifest.py
            kubernetes_validate.validate(doc, RELEASE, strict=True)


def test_the_kustomization_renders_to_valid_objects_with_the_tagged_image() -> None:
    kustomization = documents(KUSTOMIZATION)[0]
    objects = render(kustomization)
    assert {o["kind"] for o in objects} >= {"Deployment", "Service", "ConfigMap",
                                            "PodDisruptionBudget"}
    for obj in objects:
        kubernetes_validate.validate(obj, RELEASE, strict=True)
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    tag = kustomization["images"][0]["newTag"]
    assert [c["image"] for c in containers(deployment)] == [f"txstage:{tag}"]


def test_the_validator_refuses_a_misspelt_field() -> None:
    # A check that cannot fail proves nothing: a probe under a misspelt key is refused.
    [deployment] = [d for d in documents(K8S / "deployment.yaml") if d["kind"] == "Deployment"]
    broken = copy.deepcopy(deployment)
    pod = broken["spec"]["template"]["spec"]["containers"][0]
    pod["livenessProbes"] = pod.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, RELEASE, strict=True)
