"""The sidecars of a Kubernetes label selector: the pods it selects, through the official client
(``kubernetes``, the ``fleet`` extra), configured in the cluster (a pod's service account) or from a
kubeconfig, as kubectl would be.

Each running pod with an IP is a target, ``http://<pod IP>:<port>`` (the sidecar shares the pod's
network: deploy/kubernetes/sidecar-in-pod.yaml), named ``<namespace>/<pod>``. A pod that is not
running, or has no IP yet, is returned apart so that the command names it among the failures.
"""

from __future__ import annotations

from dataclasses import dataclass

from .targets import Target, TargetError, base_url, unique

IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class PodTargets:
    targets: list[Target]
    not_ready: list[tuple[str, str]]  # (namespace/pod, why it is no target)


def selector_targets(selector: str, *, port: int, namespace: str | None = None, all_namespaces: bool = False,
                     kubeconfig: str | None = None, context: str | None = None, scheme: str = "http",
                     timeout: float = 10.0, api=None) -> PodTargets:
    """The pods ``selector`` selects in ``namespace`` (default: the service account's, in a cluster;
    else the kubeconfig context's; else ``default``), or in every namespace. ``api``: a
    ``CoreV1Api`` already made (tests); else one is configured here. ``TargetError`` for a client
    that is missing or cannot be configured, and for an API that refuses or cannot be reached."""
    try:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise TargetError("--k8s-selector needs the Kubernetes client: pip install 'inference-sidecar[fleet]'") from None
    if api is None:
        try:
            in_cluster = kubeconfig is None and context is None and _load_in_cluster(config)
            if not in_cluster:
                config.load_kube_config(config_file=kubeconfig, context=context)
        except (ConfigException, OSError, TypeError, ValueError) as exc:
            raise TargetError(f"no Kubernetes configuration: {exc}") from None
        if namespace is None and not all_namespaces:
            namespace = _namespace(config, in_cluster, kubeconfig, context)
        api = client.CoreV1Api()
    namespace = namespace or "default"
    try:
        if all_namespaces:
            pods = api.list_pod_for_all_namespaces(label_selector=selector, _request_timeout=timeout)
        else:
            pods = api.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=timeout)
    except ApiException as exc:
        raise TargetError(f"the Kubernetes API refused to list pods ({selector}): HTTP {exc.status} {exc.reason}") from None
    except Exception as exc:  # urllib3's errors: the API server out of reach, a timeout, TLS
        raise TargetError(f"cannot reach the Kubernetes API: {type(exc).__name__}: {exc}") from None
    targets, not_ready = [], []
    for pod in pods.items:
        name = f"{pod.metadata.namespace}/{pod.metadata.name}"
        phase = pod.status.phase if pod.status else None
        ip = pod.status.pod_ip if pod.status else None
        if pod.metadata.deletion_timestamp is not None:
            not_ready.append((name, "being deleted"))
        elif phase != "Running" or not ip:
            not_ready.append((name, f"pod {phase or 'without a phase'}" + ("" if ip else ", no IP yet")))
        else:
            targets.append(Target(base_url(f"{scheme}://{f'[{ip}]' if ':' in ip else ip}:{port}"), name))
    if not targets and not not_ready:
        where = "any namespace" if all_namespaces else f"namespace {namespace}"
        raise TargetError(f"no pod in {where} matches the selector {selector!r}")
    return PodTargets(unique(targets), not_ready)


def _load_in_cluster(config) -> bool:
    """True in a pod with a service account (KUBERNETES_SERVICE_HOST set), configured from it."""
    from kubernetes.config.config_exception import ConfigException

    try:
        config.load_incluster_config()
        return True
    except ConfigException:
        return False


def _namespace(config, in_cluster: bool, kubeconfig: str | None, context: str | None) -> str:
    if in_cluster:
        try:
            with open(IN_CLUSTER_NAMESPACE) as f:
                return f.read().strip() or "default"
        except OSError:
            return "default"
    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context:
            contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
            active = next((c for c in contexts if c.get("name") == context), active)
        return (active or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # the kubeconfig was read once already; a context without a namespace is "default"
        return "default"
