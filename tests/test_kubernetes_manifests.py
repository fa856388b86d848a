"""The Kubernetes manifests in deploy/kubernetes/ (docs/install.md, "Kubernetes").

Every document validates, offline, against the Kubernetes API's schemas (kubernetes-validate, strict:
an unknown field fails) for the oldest and the newest Kubernetes version named below. The
ServiceMonitor is a custom resource, which those schemas do not cover: it is checked against the
subset of the Prometheus Operator's monitoring.coreos.com/v1 schema that the manifest may use
(SERVICE_MONITOR_SCHEMA, written here), whose Kubernetes types (ObjectMeta, LabelSelector,
SecretKeySelector) are the API's own definitions.

The rest checks the manifests against the code, for the mistakes a schema cannot see: a variable the
code does not read, a port or trace folder that differs between the sidecar and the engine, a health
check on a path that is no route or that needs the token, a token that is missing where the sidecar
refuses to start without one, Secret names and keys that differ from one container to the next.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest
import yaml

from sidecar.common import auth, config
from sidecar.cli import build_parser
from sidecar.service.app import ServiceSettings, make_app
from sidecar.cli.serve import _is_loopback
from sidecar.service.openapi import build_document

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(K8S.glob("*.yaml"))
EXPECTED_FILES = {"sidecar-in-pod.yaml", "sidecar-in-pod-loopback.yaml", "node-sidecar.yaml",
                  "servicemonitor.yaml", "token-secret.yaml"}
# The oldest Kubernetes the manifests are meant for, and the newest the schema package knows.
OLDEST_K8S = "1.29"

# Where the code names the environment variables it reads, one constant each (ENV_*, OTEL_*).
ENV_MODULES = ("sidecar.common.config", "sidecar.telemetry.settings", "sidecar.probe.request_capture",
               "sidecar.syncs.settings")
# Variables a manifest may set that no code reads: each must be used as $(NAME) by a later variable.
MANIFEST_VARIABLES = {"HOST_IP": "the node's IP (downward API), in SIDECAR_ENDPOINT of the node form"}
METRICS_PATH = "/metrics"
TOKEN_VARIABLES = {config.ENV_TOKEN}
POD_KINDS = {"Deployment", "DaemonSet", "StatefulSet"}

_DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
# What servicemonitor.yaml may use of monitoring.coreos.com/v1 ServiceMonitor (names and types as the
# Prometheus Operator documents them); anything else fails, as an unknown field fails the API's schemas.
_DURATION = {"type": "string", "pattern": r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"}
SERVICE_MONITOR_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"$ref": _DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"$ref": _DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"},
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "jobLabel": {"type": "string"},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "scheme": {"enum": ["http", "https"]},
                        "interval": _DURATION,
                        "scrapeTimeout": _DURATION,
                        "honorLabels": {"type": "boolean"},
                        "authorization": {"type": "object", "additionalProperties": False, "properties": {
                            "type": {"type": "string"},
                            "credentials": {"$ref": _DEFS + "io.k8s.api.core.v1.SecretKeySelector"}}},
                    },
                }},
            },
        },
    },
}


# -- reading the manifests ------------------------------------------------------------------------------
def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


DOCUMENTS = [(path, doc) for path in MANIFESTS for doc in _load(path)]


def _id(path: Path, doc: dict) -> str:
    return f"{path.name}:{doc['kind']}/{doc['metadata']['name']}"


def _of_kind(*kinds: str) -> list[tuple[Path, dict]]:
    return [(path, doc) for path, doc in DOCUMENTS if doc["kind"] in kinds]


def _pod(doc: dict) -> dict:
    return doc["spec"]["template"]


def _is_sidecar(container: dict) -> bool:
    return container.get("command", [])[:2] == ["sidecar", "serve"]


def _sidecars(pod: dict) -> list[dict]:
    return [c for c in pod["spec"]["containers"] if _is_sidecar(c)]


def _engines(pod: dict) -> list[dict]:
    """The containers with the engine's probes in them: every other one that names the sidecar."""
    return [c for c in pod["spec"]["containers"] if not _is_sidecar(c) and config.ENV_ENDPOINT in _env(c)]


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _value(container: dict, name: str) -> str | None:
    entry = _env(container).get(name)
    return None if entry is None else entry.get("value")


def _secret_ref(container: dict, name: str) -> tuple[str, str] | None:
    ref = _env(container).get(name, {}).get("valueFrom", {}).get("secretKeyRef")
    return None if ref is None else (ref["name"], ref["key"])


def _serve_args(container: dict):
    """``sidecar serve``'s own reading of the container's command line."""
    args = build_parser("serve").parse_args(container["command"][1:])
    if "--trace-dir" not in container["command"]:  # the CLI's default: $SIDECAR_TRACE_DIR, else ./traces
        args.trace_dir = Path(_value(container, config.ENV_TRACE_DIR) or "traces")
    return args


def _container_port(pod: dict, port: int | str) -> int | None:
    """The number a Service's targetPort or a probe's port names in ``pod`` (None: no such port)."""
    for container in pod["spec"]["containers"]:
        for p in container.get("ports", []):
            if port in (p["containerPort"], p.get("name")):
                return p["containerPort"]
    return None


def _probes(container: dict) -> Iterator[tuple[str, dict]]:
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in container:
            yield kind, container[kind]


def _mount(pod: dict, container: dict, path: str) -> dict | None:
    """The volume ``container`` mounts at ``path``, or at a folder holding it."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    target = PurePosixPath(path)
    for m in container.get("volumeMounts", []):
        mount = PurePosixPath(m["mountPath"])
        if target == mount or mount in target.parents:
            return volumes[m["name"]]
    return None


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _workloads() -> list[tuple[Path, dict]]:
    return _of_kind(*POD_KINDS)


def _sidecar_workloads() -> list[tuple[Path, dict, dict]]:
    return [(path, doc, c) for path, doc in _workloads() for c in _sidecars(_pod(doc))]


def _engine_workloads() -> list[tuple[Path, dict, dict]]:
    return [(path, doc, c) for path, doc in _workloads() for c in _engines(_pod(doc))]


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> dict:
    """The sidecar's OpenAPI document, built from the app's routes, of a sidecar with a token."""
    settings = ServiceSettings(trace_dir=tmp_path_factory.mktemp("k8s") / "traces", probe_token="p" * 32,
                               http_token="h" * 32, max_steps=config.DEFAULT_MAX_STEPS,
                               max_capture_bytes=1 << 30, keep=5)
    return build_document(make_app(settings))


def _open_get(api: dict, path: str) -> bool:
    """``GET path`` is a route that needs no token (the kubelet's probes send none)."""
    op = api["paths"].get(path, {}).get("get")
    return op is not None and op.get("security") == []


# -- the files and the schemas --------------------------------------------------------------------------
def test_the_folder_holds_both_forms_the_secret_and_the_service_monitor():
    assert EXPECTED_FILES <= {p.name for p in MANIFESTS}
    for path in MANIFESTS:
        docs = _load(path)
        assert docs, f"{path.name} holds no document"
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{path.name}: {doc}"


def test_names_are_unique_so_that_both_forms_can_share_a_namespace():
    seen: dict[tuple[str, str], str] = {}
    for path, doc in DOCUMENTS:
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in seen, f"{key[0]}/{key[1]} is in {seen[key]} and {path.name}"
        seen[key] = path.name


@pytest.fixture(scope="module")
def kubernetes_validate():
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: it is in the test extra "
                    "(`pip install kubernetes-validate`, which ships the Kubernetes schemas)")
    return kubernetes_validate


def _versions(kv) -> list[str]:
    return sorted({OLDEST_K8S, kv.latest_version()})


@pytest.mark.parametrize("path,doc", [d for d in DOCUMENTS if d[1]["kind"] != "ServiceMonitor"],
                         ids=[_id(*d) for d in DOCUMENTS if d[1]["kind"] != "ServiceMonitor"])
def test_every_document_validates_against_the_kubernetes_schemas(kubernetes_validate, path, doc):
    for version in _versions(kubernetes_validate):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{_id(path, doc)} against Kubernetes {exc.version}: {where}: {exc.message}")


def test_the_service_monitor_validates_against_its_schema(kubernetes_validate):
    import jsonschema
    from referencing import Registry, Resource

    monitors = _of_kind("ServiceMonitor")
    assert monitors, "servicemonitor.yaml holds a ServiceMonitor"
    for version in _versions(kubernetes_validate):
        major_minor = kubernetes_validate.utils.major_minor
        full = [v for v in kubernetes_validate.utils.all_versions() if major_minor(v) == major_minor(version)][-1]
        definitions = kubernetes_validate.utils.schema_contents(
            f"kubernetes-json-schema/v{full}-local-strict/_definitions.json", full)
        registry = Resource.from_contents(definitions) @ Registry()
        validator = jsonschema.Draft202012Validator(SERVICE_MONITOR_SCHEMA, registry=registry)
        for path, doc in monitors:
            errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
            assert not errors, [f"{_id(path, doc)}: {'.'.join(map(str, e.path))}: {e.message}" for e in errors]
        # The schema does catch a misspelt field.
        bad = {**monitors[0][1], "spec": {**monitors[0][1]["spec"], "endpoint": []}}
        assert list(validator.iter_errors(bad))


# -- environment variables ------------------------------------------------------------------------------
def _variables_the_code_reads() -> set[str]:
    from opentelemetry.sdk import environment_variables as otel_sdk

    names = {value for value in vars(otel_sdk).values() if isinstance(value, str) and value.startswith("OTEL_")}
    for module in ENV_MODULES:
        names |= {value for key, value in vars(importlib.import_module(module)).items()
                  if key.startswith(("ENV_", "OTEL_")) and isinstance(value, str)}
    return names


def test_every_variable_the_manifests_set_is_one_the_code_reads():
    known = _variables_the_code_reads()
    assert {config.ENV_ENDPOINT, config.ENV_TOKEN, config.ENV_TRACE_DIR, "OTEL_SERVICE_NAME"} <= known
    for path, doc in _workloads():
        for container in _pod(doc)["spec"]["containers"]:
            names = [e["name"] for e in container.get("env", [])]
            assert len(names) == len(set(names)), f"{_id(path, doc)} {container['name']}: a variable twice"
            for i, name in enumerate(names):
                where = f"{_id(path, doc)} container {container['name']}: {name}"
                if name in MANIFEST_VARIABLES:
                    later = " ".join(str(e.get("value", "")) for e in container["env"][i + 1:])
                    assert f"$({name})" in later, f"{where} is used by no variable after it"
                    continue
                assert name in known, (f"{where} is read by no code (a typo?); if a new module reads it, "
                                       f"add that module to ENV_MODULES")


def test_no_token_is_written_into_a_manifest_or_onto_a_command_line():
    for path, doc in _workloads():
        for container in _pod(doc)["spec"]["containers"]:
            for name in TOKEN_VARIABLES & set(_env(container)):
                assert _secret_ref(container, name), f"{_id(path, doc)} {container['name']}: {name} not from a Secret"
            assert "--token" not in container.get("command", []) + container.get("args", []), (
                f"{_id(path, doc)} {container['name']}: --token shows in ps; use {config.ENV_TOKEN}")


# -- the sidecar's address, port, health check and token -----------------------------------------------
def test_every_sidecar_that_is_reachable_beyond_loopback_has_a_token_from_the_secret():
    assert _sidecar_workloads()
    for path, doc, sidecar in _sidecar_workloads():
        args = _serve_args(sidecar)
        where = f"{_id(path, doc)} {sidecar['name']}"
        if _is_loopback(args.host):
            assert not sidecar.get("ports"), f"{where}: a port declared for a loopback listener reaches nothing"
        else:  # `sidecar serve` refuses to start without one
            assert _secret_ref(sidecar, config.ENV_TOKEN), f"{where} binds {args.host} without ${config.ENV_TOKEN}"
            assert any(p["containerPort"] == args.port for p in sidecar.get("ports", [])), (
                f"{where}: no containerPort {args.port} (--port)")


def test_health_checks_ask_a_route_that_needs_no_token_on_the_sidecars_port(api):
    assert _open_get(api, "/healthz")
    for path, doc, sidecar in _sidecar_workloads():
        args = _serve_args(sidecar)
        probes = dict(_probes(sidecar))
        assert {"readinessProbe", "livenessProbe"} <= set(probes), f"{_id(path, doc)}: both health checks"
        for kind, probe in probes.items():
            where = f"{_id(path, doc)} {sidecar['name']} {kind}"
            if "httpGet" in probe:
                get = probe["httpGet"]
                assert _container_port(_pod(doc), get["port"]) == args.port, f"{where}: port {get['port']}"
                url_path = get["path"]
            else:  # a loopback listener: the check runs in the container
                command = " ".join(probe["exec"]["command"])
                found = re.search(r"http://(127\.0\.0\.1|localhost):(\d+)(/[^'\"\s]*)", command)
                assert found, f"{where}: no http://127.0.0.1:<port>/<path> in {command!r}"
                assert int(found[2]) == args.port, f"{where}: port {found[2]}, the sidecar's is {args.port}"
                url_path = found[3]
            assert _open_get(api, url_path), f"{where}: GET {url_path} is no route, or needs the token"


def test_every_sidecar_has_resource_requests_and_limits():
    for path, doc, sidecar in _sidecar_workloads():
        resources = sidecar.get("resources", {})
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources.get(part, {})), f"{_id(path, doc)}: {part}"


def _node_sidecar_port(endpoint_port: int) -> dict:
    """The DaemonSet sidecar container that listens on ``endpoint_port`` of its node."""
    for path, doc, sidecar in _sidecar_workloads():
        if doc["kind"] == "DaemonSet":
            for p in sidecar.get("ports", []):
                if p.get("hostPort") == endpoint_port and p["containerPort"] == _serve_args(sidecar).port:
                    return sidecar
    raise AssertionError(f"no DaemonSet sidecar has hostPort {endpoint_port} on its --port")


def _sidecar_of(path: Path, doc: dict, engine: dict) -> dict:
    """The sidecar ``engine``'s probes connect to: in its pod, else its node's (DaemonSet)."""
    pod = _pod(doc)
    endpoint = urlsplit(_value(engine, config.ENV_ENDPOINT) or "")
    where = f"{_id(path, doc)} {engine['name']} {config.ENV_ENDPOINT}"
    assert endpoint.scheme == "http" and endpoint.port, f"{where}: {endpoint.geturl()!r}"
    if _sidecars(pod):
        (sidecar,) = _sidecars(pod)
        assert _is_loopback(endpoint.hostname or ""), f"{where}: the pod's sidecar is on loopback"
        assert endpoint.port == _serve_args(sidecar).port, f"{where}: port {endpoint.port}"
        return sidecar
    # The node form: the node's IP from the downward API, defined before it (for $(HOST_IP) to expand).
    names = [e["name"] for e in engine["env"]]
    variable = re.fullmatch(r"\$\((\w+)\)", endpoint.hostname or "")
    assert variable, f"{where}: the node's sidecar is reached at $(HOST_IP), not {endpoint.hostname!r}"
    var = variable[1].upper()  # urlsplit lower-cases the host
    source = _env(engine)[var]["valueFrom"]["fieldRef"]["fieldPath"]
    assert source == "status.hostIP", f"{where}: {var} is {source}"
    assert names.index(var) < names.index(config.ENV_ENDPOINT), f"{where}: {var} must come before it"
    return _node_sidecar_port(endpoint.port)


def test_every_engine_reaches_a_sidecar_on_its_port():
    assert _engine_workloads()
    for path, doc, engine in _engine_workloads():
        _sidecar_of(path, doc, engine)


def test_engine_and_sidecar_share_the_token():
    """One Secret and key on both sides; on loopback with no token, one token file on one volume."""
    for path, doc, engine in _engine_workloads():
        sidecar = _sidecar_of(path, doc, engine)
        where = f"{_id(path, doc)} {engine['name']}"
        ref = _secret_ref(sidecar, config.ENV_TOKEN)
        assert _secret_ref(engine, config.ENV_TOKEN) == ref, f"{where}: not the sidecar's {ref}"
        if ref is None:  # the probes read the token file the sidecar writes
            token_file = _value(sidecar, config.ENV_TOKEN_FILE)
            assert token_file and _value(engine, config.ENV_TOKEN_FILE) == token_file, (
                f"{where}: no token, so both need one {config.ENV_TOKEN_FILE}")
            pod = _pod(doc)
            volume = _mount(pod, sidecar, token_file)
            assert volume is not None and volume is _mount(pod, engine, token_file), (
                f"{where}: {token_file} is not on a volume both containers mount")


def test_one_secret_and_key_hold_the_token_and_its_placeholder_cannot_serve():
    refs = {_secret_ref(c, config.ENV_TOKEN) for _, doc in _workloads() for c in _pod(doc)["spec"]["containers"]}
    refs |= {(e["authorization"]["credentials"]["name"], e["authorization"]["credentials"]["key"])
             for _, doc in _of_kind("ServiceMonitor") for e in doc["spec"]["endpoints"] if "authorization" in e}
    refs.discard(None)
    assert len(refs) == 1, f"the token comes from several Secrets or keys: {sorted(refs)}"
    ((name, key),) = refs
    secrets = [doc for _, doc in _of_kind("Secret") if doc["metadata"]["name"] == name]
    assert len(secrets) == 1, f"one Secret {name} (the placeholder, token-secret.yaml)"
    data = {**secrets[0].get("data", {}), **secrets[0].get("stringData", {})}
    assert key in data, f"Secret {name} has no key {key}"
    # Applied by mistake, the placeholder stops the sidecar rather than serving with a published token.
    assert auth.token_problem(str(data[key])), f"the placeholder {data[key]!r} would be accepted as a token"


def test_engine_and_sidecar_share_the_trace_folder():
    """A probe reports the path of its raw trace; the sidecar reads that very path."""
    for path, doc, engine in _engine_workloads():
        sidecar = _sidecar_of(path, doc, engine)
        where = f"{_id(path, doc)} {engine['name']}"
        trace_dir = str(_serve_args(sidecar).trace_dir)
        assert _value(engine, config.ENV_TRACE_DIR) == trace_dir, f"{where}: not the sidecar's {trace_dir}"
        ours = _mount(_pod(doc), engine, trace_dir)
        sidecar_doc = next(d for _, d, c in _sidecar_workloads() if c is sidecar)
        theirs = _mount(_pod(sidecar_doc), sidecar, trace_dir)
        assert ours is not None and theirs is not None, f"{where}: {trace_dir} is on no volume"
        if sidecar_doc is doc:
            assert ours is theirs, f"{where}: {trace_dir} is not one volume in the pod"
        else:
            assert "hostPath" in ours and ours["hostPath"]["path"] == theirs.get("hostPath", {}).get("path"), (
                f"{where}: {trace_dir} is not the node folder the sidecar mounts there")


def test_one_image_on_both_sides_of_the_probe_channel():
    for path, doc, engine in _engine_workloads():
        sidecar = _sidecar_of(path, doc, engine)
        assert engine["image"] == sidecar["image"], f"{_id(path, doc)}: one inference-sidecar version on both sides"


def test_a_node_sidecar_serves_one_engine_pod_per_node():
    """Pods have their own pid namespaces: two on one node would repeat pids in one sidecar."""
    for path, doc, engine in _engine_workloads():
        pod = _pod(doc)
        if _sidecars(pod):
            continue
        terms = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert any(t["topologyKey"] == "kubernetes.io/hostname"
                   and _selects(t["labelSelector"]["matchLabels"], pod["metadata"]["labels"]) for t in terms), (
            f"{_id(path, doc)}: no required anti-affinity per node against its own pods")


# -- Services, scraping ---------------------------------------------------------------------------------
def _pods_of(selector: dict[str, str]) -> list[tuple[Path, dict]]:
    return [(path, doc) for path, doc in _workloads() if _selects(selector, _pod(doc)["metadata"]["labels"])]


def test_every_service_reaches_a_declared_port_of_the_pods_it_selects():
    for path, service in _of_kind("Service"):
        pods = _pods_of(service["spec"]["selector"])
        assert pods, f"{_id(path, service)} selects no pod of these manifests"
        for _, doc in pods:
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                assert _container_port(_pod(doc), target) is not None, (
                    f"{_id(path, service)} port {port.get('name')}: {_id(path, doc)} declares no port {target}")


def test_scrape_annotations_name_the_sidecars_metrics_port(api):
    assert METRICS_PATH in api["paths"] and "get" in api["paths"][METRICS_PATH]
    annotated = 0
    for path, doc in _workloads():
        annotations = _pod(doc)["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") != "true":
            continue
        annotated += 1
        (sidecar,) = _sidecars(_pod(doc))
        args = _serve_args(sidecar)
        assert not _is_loopback(args.host), f"{_id(path, doc)}: Prometheus cannot reach a loopback sidecar"
        assert annotations["prometheus.io/port"] == str(args.port), f"{_id(path, doc)}: prometheus.io/port"
        assert annotations["prometheus.io/path"] == METRICS_PATH, f"{_id(path, doc)}: prometheus.io/path"
    assert annotated >= 2, "both forms' sidecars carry the scrape annotations"


def test_the_service_monitor_scrapes_metrics_of_every_sidecar_service_with_the_token(api):
    # /metrics needs the token whenever the sidecar has one: the scrape must send it.
    assert api["paths"][METRICS_PATH]["get"].get("security") != []
    monitors = _of_kind("ServiceMonitor")
    sidecar_services = set()  # the Services that lead to a sidecar's port
    for path, doc in _of_kind("Service"):
        for _, workload in _pods_of(doc["spec"]["selector"]):
            ports = {_serve_args(c).port for c in _sidecars(_pod(workload))}
            if any(_container_port(_pod(workload), p.get("targetPort", p["port"])) in ports
                   for p in doc["spec"]["ports"]):
                sidecar_services.add(doc["metadata"]["name"])
    assert sidecar_services >= {"vllm-sidecar", "inference-sidecar-node"}
    for path, monitor in monitors:
        selected = [s for _, s in _of_kind("Service")
                    if _selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
        assert {s["metadata"]["name"] for s in selected} == sidecar_services, f"{_id(path, monitor)} selects {selected}"
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["path"] == METRICS_PATH
            assert endpoint["authorization"]["type"].lower() == "bearer"
            for service in selected:
                ports = {p.get("name"): p for p in service["spec"]["ports"]}
                assert endpoint["port"] in ports, f"{service['metadata']['name']} has no port {endpoint['port']}"
                for _, doc in _pods_of(service["spec"]["selector"]):
                    (sidecar,) = _sidecars(_pod(doc))
                    target = _container_port(_pod(doc), ports[endpoint["port"]]["targetPort"])
                    assert target == _serve_args(sidecar).port
                    credentials = endpoint["authorization"]["credentials"]
                    assert (credentials["name"], credentials["key"]) == _secret_ref(sidecar, config.ENV_TOKEN)
