"""The example Kubernetes manifests (``deploy/kubernetes``): nothing runs them here, so they are checked offline.

Every document parses and validates against the Kubernetes OpenAPI schemas (``kubernetes-validate`` bundles
them: strict, so a misspelt field fails); the kustomization lists every file; and what the manifests say about
callbridge is checked against callbridge itself — the probe paths are routes of the app, every
``CALLBRIDGE_*`` env var is a settings key, the ConfigMap's TOML loads, the grace period outlasts the
preStop sleep and the drain, and each Service's ports are ports of the pods it selects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from callbridge.bridge.app import create_app
from callbridge.config import CONFIG_FILE_ENV, Settings, load_settings

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30"
"""The oldest Kubernetes the manifests target (autoscaling/v2 and policy/v1 are GA well before it)."""

Resource = dict[str, Any]


def _documents(path: Path) -> list[Resource]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _resources() -> list[Resource]:
    return [
        doc
        for path in sorted(MANIFESTS.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in _documents(path)
    ]


def _one(kind: str, name: str) -> Resource:
    (found,) = [r for r in _resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    return found


def _containers(workload: Resource) -> list[Resource]:
    containers: list[Resource] = workload["spec"]["template"]["spec"]["containers"]
    return containers


BRIDGE = "callbridge"


def _bridge() -> Resource:
    (container,) = _containers(_one("Deployment", BRIDGE))
    return container


def test_every_file_parses_into_named_resources() -> None:
    files = sorted(MANIFESTS.glob("*.y*ml"))
    assert {p.suffix for p in files} == {".yaml"}
    for path in files:
        for doc in _documents(path):
            assert isinstance(doc, dict), path
            assert doc.get("apiVersion") and doc.get("kind"), path
            if doc["kind"] != "Kustomization":
                assert doc["metadata"]["name"], path
                assert "namespace" not in doc["metadata"], f"{path}: namespace-less, kustomize or -n sets it"


def test_the_kustomization_lists_every_manifest() -> None:
    (kustomization,) = _documents(MANIFESTS / "kustomization.yaml")
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(p.name for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")
    assert len(set(listed)) == len(listed)


@pytest.mark.parametrize("resource", _resources(), ids=lambda r: f"{r['kind']}/{r['metadata']['name']}")
def test_each_resource_is_valid_against_the_kubernetes_schema(resource: Resource) -> None:
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_names_are_unique_per_kind() -> None:
    keys = [(r["kind"], r["metadata"]["name"]) for r in _resources()]
    assert len(keys) == len(set(keys))


def test_services_and_controllers_select_the_pods_they_mean() -> None:
    workloads = [r for r in _resources() if r["kind"] in ("Deployment", "StatefulSet")]
    for workload in workloads:
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
    for kind in ("Service", "PodDisruptionBudget"):
        for resource in (r for r in _resources() if r["kind"] == kind):
            spec = resource["spec"]
            selector = spec["selector"] if kind == "Service" else spec["selector"]["matchLabels"]
            pods = [w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
            assert pods, f"{kind}/{resource['metadata']['name']} selects no pods"
            if kind == "Service":
                names = {p["name"] for w in pods for c in _containers(w) for p in c.get("ports", [])}
                numbers = {p["containerPort"] for w in pods for c in _containers(w) for p in c.get("ports", [])}
                for port in spec["ports"]:
                    target = port["targetPort"]
                    assert target in names if isinstance(target, str) else target in numbers, (
                        resource["metadata"],
                        port,
                    )
    for stateful in (w for w in workloads if w["kind"] == "StatefulSet"):
        _one("Service", stateful["spec"]["serviceName"])


def test_the_autoscaler_scales_the_bridge_deployment() -> None:
    hpa = _one("HorizontalPodAutoscaler", BRIDGE)
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", BRIDGE)
    assert hpa["spec"]["minReplicas"] >= 2  # a drain needs somewhere to move calls to
    assert all(
        _bridge()["resources"]["requests"].get(m["resource"]["name"])
        for m in hpa["spec"]["metrics"]
        if m["type"] == "Resource"
    )


def test_probes_are_routes_of_the_bridge() -> None:
    routes = {getattr(route, "path", None) for route in create_app(Settings()).routes}
    container = _bridge()
    probes = {name: container[name]["httpGet"]["path"] for name in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    assert set(probes.values()) <= routes
    annotations = _one("Deployment", BRIDGE)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in routes and annotations["prometheus.io/scrape"] == "true"
    http = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert int(annotations["prometheus.io/port"]) == http


def _env_names(resources: list[Resource]) -> list[str]:
    return [
        env["name"]
        for r in resources
        if r["kind"] in ("Deployment", "StatefulSet")
        for c in _containers(r)
        for env in c.get("env", [])
        if env["name"].startswith("CALLBRIDGE_")
    ]


def test_every_callbridge_env_var_is_a_settings_key() -> None:
    names = _env_names(_resources())
    assert names
    for name in names:
        if name == CONFIG_FILE_ENV:
            continue
        section, sep, key = name.removeprefix("CALLBRIDGE_").lower().partition("__")
        assert sep, name
        model = Settings.model_fields[section].annotation
        assert model is not None and key in model.model_fields, name  # type: ignore[union-attr]


def test_secret_references_name_the_secret_and_its_required_keys() -> None:
    secret = _one("Secret", "callbridge-secrets")
    keys = set(secret["stringData"])
    for workload in (r for r in _resources() if r["kind"] in ("Deployment", "StatefulSet")):
        for container in _containers(workload):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["name"] == "callbridge-secrets"
                    assert ref.get("optional") or ref["key"] in keys, ref


def _bridge_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    """The settings a bridge pod runs with: the ConfigMap's file at the mounted path, the Deployment's env (the
    Secret's values where it has them, optional ones absent) over it."""
    config_map = _one("ConfigMap", "callbridge-config")
    container = _bridge()
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    (volume,) = [v for v in _one("Deployment", BRIDGE)["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    secret = _one("Secret", "callbridge-secrets")["stringData"]
    for name in list(os.environ):
        if name.startswith("CALLBRIDGE_"):
            monkeypatch.delenv(name)
    for env in container["env"]:
        value = env.get("value")
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            value = secret.get(ref["key"])
        if value is None:
            continue
        if env["name"] == CONFIG_FILE_ENV:
            (file_name,) = config_map["data"]
            assert value == f"{mount['mountPath']}/{file_name}"
            value = str(tmp_path / file_name)
            (tmp_path / file_name).write_text(config_map["data"][file_name])
        monkeypatch.setenv(env["name"], value)
    return load_settings()


def test_the_config_map_loads_as_the_bridge_would(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _bridge_settings(monkeypatch, tmp_path)
    ports = {p["name"]: p["containerPort"] for p in _bridge()["ports"]}
    assert settings.server.host == "0.0.0.0" and settings.server.port == ports["http"]
    assert settings.server.workers == 1  # per-pod /readyz and /metrics
    assert settings.registry.backend == "redis" and settings.registry.redis_url is not None
    redis_host = urlsplit(settings.registry.redis_url.get_secret_value()).hostname
    assert redis_host == _one("Service", "callbridge-redis")["metadata"]["name"]
    assert settings.audiosocket.port == ports["audiosocket"] and settings.sip.port == ports["sip"]


def test_termination_grace_outlasts_the_pre_stop_sleep_and_the_drain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = _bridge_settings(monkeypatch, tmp_path)
    pod = _one("Deployment", BRIDGE)["spec"]["template"]["spec"]
    container = _bridge()
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    sleep_s = int(command[1])
    assert sleep_s > container["readinessProbe"]["periodSeconds"]  # the endpoints drop the pod before it refuses
    assert pod["terminationGracePeriodSeconds"] > sleep_s + settings.server.drain_timeout_s + 5


def test_the_bridge_runs_as_the_dockerfile_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = next(line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER "))
    uid, _, gid = user.partition(":")
    pod = _one("Deployment", BRIDGE)["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and (str(pod["runAsUser"]), str(pod["runAsGroup"])) == (uid, gid)
    assert _bridge()["securityContext"]["allowPrivilegeEscalation"] is False


def test_engine_urls_name_the_engine_servers_one_by_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _bridge_settings(monkeypatch, tmp_path)
    engine = _one("StatefulSet", "callbridge-engine")
    service = _one("Service", engine["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"  # headless: a stable name per server, for resumes
    (container,) = _containers(engine)
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["ws"]
    pods = {
        f"{engine['metadata']['name']}-{i}.{service['metadata']['name']}" for i in range(engine["spec"]["replicas"])
    }
    assert settings.engine.kind == "realtime"
    assert {(urlsplit(url).hostname, urlsplit(url).port) for url in settings.engine.urls} == {
        (pod, port) for pod in pods
    }
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "vllm serve" in " ".join(container["args"]) and "--omni" in " ".join(container["args"])


def test_images_are_release_tags_never_latest() -> None:
    """``:latest`` with ``IfNotPresent`` runs whichever image a node pulled first; the bridge's tag is this release."""
    from callbridge import __version__

    for workload in (r for r in _resources() if r["kind"] in ("Deployment", "StatefulSet")):
        for container in _containers(workload):
            _, _, tag = container["image"].rpartition(":")
            assert tag and tag != "latest" and "/" not in tag, container["image"]
    assert _bridge()["image"].endswith(f":{__version__}")


def test_sip_is_exposed_on_udp_and_tcp() -> None:
    sip_ports = {(p["containerPort"], p["protocol"]) for p in _bridge()["ports"] if p["name"].startswith("sip")}
    assert sip_ports == {(Settings().sip.port, "UDP"), (Settings().sip.port, "TCP")}


def test_the_vonage_private_key_is_mounted_where_the_config_map_points(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Secret's key is mounted as a file (optional: absent, the pod still starts), at the path the ConfigMap's
    commented ``private_key_path`` names; with it uncommented and the key in place the settings load."""
    import re

    pod = _one("Deployment", BRIDGE)["spec"]["template"]["spec"]
    (mount,) = [m for m in _bridge()["volumeMounts"] if m["name"] == "vonage-key"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "vonage-key"]
    assert volume["secret"]["secretName"] == "callbridge-secrets" and volume["secret"]["optional"] is True
    (item,) = volume["secret"]["items"]
    assert item["key"] == "vonage-private-key.pem" and item["key"] in (ROOT / "deploy/kubernetes/secret.yaml").read_text()
    toml = _one("ConfigMap", "callbridge-config")["data"]["callbridge.toml"]
    (path,) = re.findall(r'^\s*# private_key_path = "([^"]+)"', toml, flags=re.MULTILINE)
    assert path == f"{mount['mountPath']}/{item['path']}"

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = tmp_path / "private.key"
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    _bridge_settings(monkeypatch, tmp_path)  # the pod's env
    settings = load_settings(overrides={"vonage": {"private_key_path": str(key_file)}})
    assert settings.vonage.private_key_path == key_file
