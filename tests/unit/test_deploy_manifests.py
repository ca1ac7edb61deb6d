"""The Kubernetes manifests under deploy/, validated offline and checked against the code.

Every document of every YAML file under deploy/ is validated: Kubernetes kinds against the
schemas ``kubernetes-validate`` ships (strict: unknown fields are errors), KEDA's
ScaledObject against the schema vendored in deploy/schemas/. Then the manifests are held
to the code: every PLAZA_* variable is a real setting with a value that parses, and each
KEDA trigger watches the consumer group and topic ``plaza.naming.Names`` gives its model.
"""

from __future__ import annotations

import json
import re
import shlex
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
KUBERNETES = DEPLOY / "kubernetes"
GPU_SET = KUBERNETES / "gpu"
"""Applied on its own, on a cluster with GPUs (docs/deploy.md)."""
DOCKERFILE = ROOT / "Dockerfile"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
GATEWAY_MODELS = "PLAZA_GATEWAY__MODELS"
KUBERNETES_VERSIONS = ("1.29", "1.37")
"""The oldest Kubernetes the manifests are written for, and the newest the pinned
kubernetes-validate knows."""
GATEWAY_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}


def load_documents(files: list[Path] | None = None) -> list[tuple[str, dict[str, Any]]]:
    if files is None:
        files = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    docs = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((str(path.relative_to(ROOT)), doc))
    return docs


DOCUMENTS = load_documents()


def apply_set(folder: Path) -> list[dict[str, Any]]:
    """What ``kubectl apply -f <folder>/`` applies: its files, not its subfolders'."""
    files = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
    assert files, f"no manifests in {folder}"
    return [doc for _, doc in load_documents(files)]


def of_kind(kind: str, docs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    if docs is None:
        docs = [doc for _, doc in DOCUMENTS]
    return [doc for doc in docs if doc["kind"] == kind]


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
    for extra in of_kind("ConfigMap"):
        wrong = sorted(set(extra["data"]) - known)
        assert not wrong, f"{extra['metadata']['name']}: not settings: {wrong}"
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
        sources = container(deployment)["envFrom"]
        assert sources[0] == {"configMapRef": {"name": "plaza-settings"}}
        for later in sources[1:]:  # each optional: the pod starts without it
            assert later["configMapRef"]["optional"] is True
            named("ConfigMap", later["configMapRef"]["name"])
    gpu = named("Deployment", "plaza-host-gpu")
    assert container(gpu)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert host_models(gpu) and host_models(named("Deployment", "plaza-host"))
    cpu_limits = container(named("Deployment", "plaza-host"))["resources"]["limits"]
    assert "nvidia.com/gpu" not in cpu_limits


def in_docs(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [doc for doc in of_kind(kind, docs) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"one {kind} {name!r}, found {len(found)}"
    return found[0]


def served_by_gateway(docs: list[dict[str, Any]]) -> list[str]:
    """PLAZA_GATEWAY__MODELS as the gateway of ``docs`` reads it: its ``envFrom`` ConfigMaps
    in order (a later one's value wins; an optional one absent is skipped), then its env."""
    main = container(in_docs(docs, "Deployment", "plaza-gateway"))
    maps = {doc["metadata"]["name"]: doc["data"] for doc in of_kind("ConfigMap", docs)}
    value = ""
    for source in main["envFrom"]:
        ref = source["configMapRef"]
        if ref["name"] not in maps:
            assert ref.get("optional") is True, f"ConfigMap {ref['name']} is not applied"
            continue
        value = maps[ref["name"]].get(GATEWAY_MODELS, value)
    for env in main.get("env", []):
        value = env.get("value", value) if env["name"] == GATEWAY_MODELS else value
    return [m.strip() for m in value.split(",") if m.strip()]


def served_by_hosts(docs: list[dict[str, Any]]) -> set[str]:
    return {
        m
        for d in of_kind("Deployment", docs)
        if "--host.models" in container(d)["command"]
        for m in host_models(d)
    }


@pytest.mark.parametrize(
    "folders", [(KUBERNETES,), (KUBERNETES, GPU_SET)], ids=["default", "with-gpu"]
)
def test_the_gateway_serves_the_models_the_hosts_serve(folders: tuple[Path, ...]) -> None:
    """Readiness needs a live worker for every model the gateway serves: a model it serves
    that no host of the same apply set does would keep every gateway out of its Service."""
    docs = [doc for folder in folders for doc in apply_set(folder)]
    served = served_by_gateway(docs)
    assert served, "the gateway would serve the whole repository, hosts serve a few models"
    assert sorted(served) == sorted(served_by_hosts(docs))


def test_the_default_set_asks_for_no_gpu() -> None:
    """``kubectl apply -f deploy/kubernetes/`` works on a cluster without GPUs: no pod of it
    waits for one, so the gateways become ready once the CPU hosts run."""
    deployments = of_kind("Deployment", apply_set(KUBERNETES))
    assert {d["metadata"]["name"] for d in deployments} >= {"plaza-gateway", "plaza-host"}
    for deployment in deployments:
        assert "nvidia.com" not in json.dumps(deployment), deployment["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in container(deployment).get("env", [])}
        assert env.get("PLAZA_WORKER__DEVICE", "cpu") == "cpu", deployment["metadata"]["name"]
    assert of_kind("Deployment", apply_set(GPU_SET)), "the GPU hosts are in deploy/kubernetes/gpu/"


# -- the manifests against the Dockerfile and docs/deploy.md -----------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def shell_commands(run: str) -> list[list[str]]:
    """A RUN line's commands (split at ``&&`` and ``;``), each as its words."""
    commands: list[list[str]] = [[]]
    for word in shlex.split(run, comments=True):
        if word in ("&&", ";"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def default_extras() -> str:
    args = [rest for word, rest in dockerfile() if word == "ARG" and rest.startswith("EXTRAS=")]
    assert len(args) == 1, "the Dockerfile takes its extras as ARG EXTRAS=<default>"
    return args[0].removeprefix("EXTRAS=")


def docs_builds() -> dict[str, set[str]]:
    """Each image tag a ``docker build`` of docs/deploy.md makes, with the extras it has."""
    builds = {}
    for line in DEPLOY_DOC.read_text().splitlines():
        if not line.strip().startswith("docker build "):
            continue
        words = shlex.split(line, comments=True)
        extras, tag = default_extras(), None
        for word, after in zip(words, [*words[1:], ""], strict=True):
            if word in ("-t", "--tag"):
                tag = after
            elif word == "--build-arg" and after.startswith("EXTRAS="):
                extras = after.removeprefix("EXTRAS=")
        assert tag is not None, line
        builds[tag] = set(extras.split(","))
    return builds


def uses_torch(model: str) -> bool:
    config = (ROOT / "model_repository" / model / "config.pbtxt").read_text()
    return "pytorch" in config


def test_every_image_is_one_deploy_md_builds_with_the_extras_it_needs() -> None:
    installs = [
        c
        for word, rest in dockerfile()
        if word == "RUN"
        for c in shell_commands(rest)
        if c[:2] == ["pip", "install"]
    ]
    assert [".[${EXTRAS}]"] in [c[2:] for c in installs], "pip install the ARG's extras"
    builds = docs_builds()
    assert "plaza:dev" in builds
    for deployment in of_kind("Deployment"):
        name, main = deployment["metadata"]["name"], container(deployment)
        assert main["image"] in builds, f"{name}: docs/deploy.md builds no {main['image']}"
        extras = builds[main["image"]]
        assert "models" in extras, name  # the sample repository needs onnx and tokenizers
        env = {e["name"]: e.get("value") for e in main.get("env", [])}
        if env.get("PLAZA_WORKER__DEVICE") == "cuda":
            assert "gpu" in extras, f"{name} runs on cuda: onnxruntime-gpu (the gpu extra)"
        if "--host.models" in main["command"] and any(map(uses_torch, host_models(deployment))):
            assert "torch" in extras, f"{name} serves a PyTorch model: the torch extra"


def default_var_paths() -> list[Path]:
    """The settings' default paths under var/ (relative: under the working directory)."""
    found = []
    for field in PlazaSettings.model_fields.values():
        section = field.annotation
        is_section = isinstance(section, type) and issubclass(section, BaseModel)
        for sub in section.model_fields.values() if is_section else [field]:  # type: ignore[union-attr]
            default = sub.default
            if isinstance(default, Path) and not default.is_absolute():
                found += [default] if default.parts[0] == "var" else []
    return found


def owned_folders(commands: list[list[str]], user: str) -> set[Path]:
    """The folders ``install -d -o <user>`` makes or ``chown <user>`` gives to ``user``."""
    owned: set[Path] = set()
    for words in commands:
        if words[0] == "install" and "-d" in words and "-o" in words:
            if words[words.index("-o") + 1] == user:
                skip = {i + 1 for i, w in enumerate(words) if w in ("-o", "-g", "-m")}
                owned |= {
                    Path(w)
                    for i, w in enumerate(words[1:], 1)
                    if i not in skip and not w.startswith("-")
                }
        elif words[0] == "chown":
            spec, *paths = [w for w in words[1:] if not w.startswith("-")]
            if spec.split(":")[0] == user:
                owned |= {Path(p) for p in paths}
    return owned


def test_the_image_user_can_write_var() -> None:
    """The image runs as a user of its own in a root-owned WORKDIR: the default paths the
    processes write (gateway.trace_dir, var/traces) must be under a folder it owns."""
    instructions = dockerfile()
    words = [w for w, _ in instructions]
    assert words.count("USER") == 1
    user = instructions[words.index("USER")][1]
    before = instructions[: words.index("USER")]
    workdir = Path([rest for w, rest in before if w == "WORKDIR"][-1])
    commands = [c for w, rest in before if w == "RUN" for c in shell_commands(rest)]
    useradd = next(c for c in commands if c[0] == "useradd" and c[-1] == user)
    uid = int(useradd[useradd.index("--uid") + 1])
    owned = owned_folders(commands, user)
    paths = default_var_paths()
    assert Path("var/traces") in paths
    for path in paths:
        folder = workdir / path
        assert any(folder == o or o in folder.parents for o in owned), f"{folder}: {owned}"
    for deployment in of_kind("Deployment"):  # the pods run as that user
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == uid, deployment["metadata"]["name"]
