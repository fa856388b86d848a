"""Kubernetes discovery against a recorded API answer: a pod list built with the official client's own
models (``V1PodList``), serialised as the API server sends it, served on the API's path by a tiny HTTP
server that a kubeconfig points at, so the client is configured, authenticates and decodes exactly as
it does against a cluster. Then ``sidecar fleet status --k8s-selector`` reaches the one running pod's
sidecar (a real one, on this host) and names the pods that are no target."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client as k8s

from sidecar.devtools.stack import Stack
from sidecar.fleet.k8s import selector_targets
from sidecar.fleet.targets import TargetError

API_TOKEN = "kube-api-token-of-the-test"
NAMESPACE = "inference"


def _pod(name: str, phase: str, ip: str | None, deleting: bool = False) -> k8s.V1Pod:
    return k8s.V1Pod(
        api_version="v1", kind="Pod",
        metadata=k8s.V1ObjectMeta(name=name, namespace=NAMESPACE, labels={"app": "vllm"}, uid=f"uid-{name}",
                                  deletion_timestamp=datetime.datetime(2026, 11, 28, tzinfo=datetime.timezone.utc)
                                  if deleting else None),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="sidecar", image="inference-sidecar:0.1.0")]),
        status=k8s.V1PodStatus(phase=phase, pod_ip=ip, pod_ips=[k8s.V1PodIP(ip=ip)] if ip else None))


def pod_list(running_ip: str = "127.0.0.1") -> dict:
    pods = k8s.V1PodList(api_version="v1", kind="PodList", metadata=k8s.V1ListMeta(resource_version="4711"),
                         items=[_pod("vllm-0", "Running", running_ip), _pod("vllm-1", "Pending", None),
                                _pod("vllm-2", "Running", "10.1.2.3", deleting=True),
                                _pod("vllm-3", "Running", "fd00::7")])
    return k8s.ApiClient().sanitize_for_serialization(pods)


async def _api_server(seen: list) -> TestServer:
    async def pods(request: web.Request) -> web.Response:
        seen.append({"path": request.path, "query": dict(request.query),
                     "authorization": request.headers.get("Authorization")})
        if request.headers.get("Authorization") != f"Bearer {API_TOKEN}":
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "Unauthorized", "code": 401},
                                     status=401)
        return web.json_response(pod_list())

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{namespace}/pods", pods)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def _kubeconfig(tmp_path, server: TestServer, token: str = API_TOKEN):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{server.port}"}}],
        "users": [{"name": "tester", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "tester", "namespace": NAMESPACE}}]}))
    return path


async def test_the_pods_of_a_selector_are_the_targets(tmp_path):
    seen: list = []
    server = await _api_server(seen)
    try:
        pods = await asyncio.to_thread(selector_targets, "app=vllm", port=8787, kubeconfig=str(_kubeconfig(tmp_path, server)))
        assert [(t.url, t.name) for t in pods.targets] == [("http://127.0.0.1:8787", f"{NAMESPACE}/vllm-0"),
                                                           ("http://[fd00::7]:8787", f"{NAMESPACE}/vllm-3")]
        assert dict(pods.not_ready) == {f"{NAMESPACE}/vllm-1": "pod Pending, no IP yet",
                                        f"{NAMESPACE}/vllm-2": "being deleted"}
        # The context's namespace, the selector as the API's labelSelector, the kubeconfig's token.
        assert seen[-1]["path"] == f"/api/v1/namespaces/{NAMESPACE}/pods"
        assert seen[-1]["query"]["labelSelector"] == "app=vllm"
        assert seen[-1]["authorization"] == f"Bearer {API_TOKEN}"

        refused = _kubeconfig(tmp_path, server, token="not-the-token")
        with pytest.raises(TargetError, match="refused to list pods.*HTTP 401"):
            await asyncio.to_thread(selector_targets, "app=vllm", port=8787, kubeconfig=str(refused))
    finally:
        await server.close()


async def test_fleet_status_through_a_selector_names_the_pods_that_are_no_target(tmp_path):
    seen: list = []
    server = await _api_server(seen)
    stack = Stack(model_dir=tmp_path, work_dir=tmp_path / "sidecar",
                  base_env={k: v for k, v in os.environ.items() if k != "SIDECAR_TOKEN"})
    await asyncio.to_thread(stack.start_sidecar)
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("SIDECAR_TOKEN", "KUBERNETES_SERVICE_HOST")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sidecar.cli", "fleet", "status", "--k8s-selector", "app=vllm",
            "--kubeconfig", str(_kubeconfig(tmp_path, server)), "--port", str(stack.sidecar_port), "--timeout", "3",
            "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 1, (out, err)  # one answered, three not: partial
        answer = json.loads(out)
        [replica] = answer["replicas"]
        assert replica["target"] == stack.sidecar_url and replica["name"] == f"{NAMESPACE}/vllm-0"
        assert replica["healthz"]["status"]
        failed = {f["target"]: f["error"] for f in answer["failed"]}
        assert set(failed) == {f"{NAMESPACE}/vllm-1", f"{NAMESPACE}/vllm-2", f"http://[fd00::7]:{stack.sidecar_port}"}
        assert b"Traceback" not in err and API_TOKEN.encode() not in out + err
    finally:
        await asyncio.to_thread(stack.stop_sidecar)
        await server.close()
