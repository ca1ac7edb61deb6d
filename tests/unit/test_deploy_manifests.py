"""The Kubernetes manifests under deploy/, validated offline and checked against the code.

Every document of every YAML file under deploy/ is validated: Kubernetes kinds against the
schemas ``kubernetes-validate`` ships (strict: unknown fields are errors), KEDA's
ScaledObject against the schema vendored in deploy/schemas/. Then the manifests are held
to the code: every PLAZA_* variable is a real setting with a value that parses, and each
KEDA trigger watches the consumer group and topic ``plaza.naming.Names`` gives its model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from plaza.naming import Names
from plaza.settings import PlazaSettings

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KEDA_SCHEMA = DEPLOY / "schemas" / "keda-scaledobject.schema.json"
KUBERNETES_VERSIONS = ("1.29", "1.37")
"""The oldest Kubernetes the manifests are written for, and the newest the pinned
kubernetes-validate knows."""
GATEWAY_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}


def load_documents() -> list[tuple[str, dict[str, Any]]]:
    files = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    docs = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((str(path.relative_to(ROOT)), doc))
    return docs


DOCUMENTS = load_documents()


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCUMENTS if doc["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    found = [doc for doc in of_kind(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"one {kind} {name!r} under deploy/, found {len(found)}"
    return found[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def keda_validator() -> Any:
    schema = json.loads(KEDA_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def setting_variables() -> set[str]:
    """Every setting's environment variable, built from PlazaSettings' fields."""
    names = set()
    for name, field in PlazaSettings.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            names |= {f"PLAZA_{name}__{sub}".upper() for sub in section.model_fields}
        else:
            names.add(f"PLAZA_{name}".upper())
    return names


def configmap() -> dict[str, str]:
    return named("ConfigMap", "plaza-settings")["data"]  # type: ignore[no-any-return]


def host_models(deployment: dict[str, Any]) -> list[str]:
    """The models after ``--host.models`` in a host's command."""
    command = container(deployment)["command"]
    assert "--host.models" in command, command
    return str(command[command.index("--host.models") + 1]).split(",")


# -- schemas ---------------------------------------------------------------------------------


def test_deploy_holds_the_manifests() -> None:
    kinds = {doc["kind"] for _, doc in DOCUMENTS}
    assert {"ConfigMap", "Deployment", "ScaledObject", "Service"} <= kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("path", "doc"), DOCUMENTS, ids=[p for p, _ in DOCUMENTS])
def test_every_document_is_valid(path: str, doc: dict[str, Any], version: str) -> None:
    if doc["kind"] == "ScaledObject":
        keda_validator().validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validators_refuse_what_is_wrong() -> None:
    """Both validators can fail: a misspelt field, a missing required one, a wrong type."""
    scaled = json.loads(json.dumps(of_kind("ScaledObject")[0]))
    scaled["spec"]["maxReplicas"] = 4
    with pytest.raises(jsonschema.ValidationError):
        keda_validator().validate(scaled)
    scaled = json.loads(json.dumps(of_kind("ScaledObject")[0]))
    del scaled["spec"]["triggers"][0]["metadata"]["consumerGroup"]
    with pytest.raises(jsonschema.ValidationError):
        keda_validator().validate(scaled)
    gateway = json.loads(json.dumps(named("Deployment", "plaza-gateway")))
    container(gateway)["ports"][0]["containerPort"] = "eight thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(gateway, KUBERNETES_VERSIONS[-1], strict=True)
    gateway = json.loads(json.dumps(named("Deployment", "plaza-gateway")))
    container(gateway)["readinesProbe"] = container(gateway).pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(gateway, KUBERNETES_VERSIONS[-1], strict=True)


# -- the manifests against the code ------------------------------------------------------------


def test_every_plaza_variable_is_a_setting_and_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    known = setting_variables()
    variables = dict(configmap())
    for deployment in of_kind("Deployment"):
        for env in container(deployment).get("env", []):
            if env["name"].startswith("PLAZA_"):
                assert env["name"] in known, f"{env['name']} is no setting (docs/settings.md)"
    unknown = sorted(set(variables) - known)
    assert not unknown, f"not settings (docs/settings.md lists them): {unknown}"
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = PlazaSettings()
    assert settings.kafka.partitions == int(variables["PLAZA_KAFKA__PARTITIONS"])
    assert settings.kafka.bootstrap_servers == variables["PLAZA_KAFKA__BOOTSTRAP_SERVERS"]


def test_keda_triggers_watch_the_groups_and_topics_of_the_hosts_models() -> None:
    data = configmap()
    names = Names(topic_prefix=data.get("PLAZA_KAFKA__TOPIC_PREFIX", Names().topic_prefix))
    for scaled in of_kind("ScaledObject"):
        target = named("Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        models = host_models(target)
        watched = []
        for trigger in scaled["spec"]["triggers"]:
            assert trigger["type"] == "kafka"
            meta = trigger["metadata"]
            model = next(
                (m for m in models if names.consumer_group(m) == meta["consumerGroup"]), None
            )
            assert model is not None, f"{meta['consumerGroup']} is no group of {models}"
            assert meta["topic"] == names.request_topic(model)
            assert meta["bootstrapServers"] == data["PLAZA_KAFKA__BOOTSTRAP_SERVERS"]
            watched.append(model)
        assert sorted(watched) == sorted(models), "one trigger per model the hosts serve"
        # members beyond a topic's partitions sit idle: never scale past them
        assert scaled["spec"]["maxReplicaCount"] <= int(data["PLAZA_KAFKA__PARTITIONS"])
        assert scaled["spec"]["minReplicaCount"] >= 1


def test_the_gateway_service_probes_and_settings() -> None:
    service = named("Service", "plaza-gateway")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == GATEWAY_PORTS
    gateway = named("Deployment", "plaza-gateway")
    selector = gateway["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    main = container(gateway)
    assert main["command"] == ["plaza", "gateway"]
    assert {p["name"]: p["containerPort"] for p in main["ports"]} == GATEWAY_PORTS
    assert main["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert main["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["PLAZA_GATEWAY__HOST"] == "0.0.0.0"  # a pod's port is reached from outside it


def test_every_pod_has_resources_and_the_gpu_host_a_gpu() -> None:
    for deployment in of_kind("Deployment"):
        resources = container(deployment)["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), deployment["metadata"]["name"]
        assert {"cpu", "memory"} <= set(resources["limits"]), deployment["metadata"]["name"]
        assert container(deployment)["envFrom"] == [{"configMapRef": {"name": "plaza-settings"}}]
    gpu = named("Deployment", "plaza-host-gpu")
    assert container(gpu)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert host_models(gpu) and host_models(named("Deployment", "plaza-host"))
    cpu_limits = container(named("Deployment", "plaza-host"))["resources"]["limits"]
    assert "nvidia.com/gpu" not in cpu_limits


def test_the_gateway_serves_the_models_the_hosts_serve() -> None:
    """Readiness needs a live worker for every model the gateway serves: a model it serves
    that no host does would keep every gateway out of its Service."""
    served = configmap().get("PLAZA_GATEWAY__MODELS", "")
    assert served, "the gateway would serve the whole repository, hosts serve a few models"
    hosts = {
        m
        for d in of_kind("Deployment")
        if "host.models" in str(container(d)["command"])
        for m in host_models(d)
    }
    assert sorted(served.split(",")) == sorted(hosts)
