"""Kubernetes manifests: Deployment, Service, NetworkPolicy, HorizontalPodAutoscaler,
PodDisruptionBudget, Secret.

Written as plain dicts dumped to YAML, each file with a header that says why its values are what
they are; `python -m deployment --check` validates them against the Kubernetes schemas (strict).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from deployment.inputs import Inputs
from deployment.layout import IMAGE, KEY_FILE, PROBE, UID
from deployment.plan import Plan

NAME = "torchserve-mix"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "predictor"}
IMAGE_REF = "REGISTRY/torchserve-mix:TAG"  # placeholder: the image built from deploy/Dockerfile
# Memory when the mix record has no measured RSS, and the margin over a measured one (page cache,
# a worker restarting next to its old self, allocator growth over days).
DEFAULT_MEMORY_MIB = 4096
MEMORY_HEADROOM = 1.5
# Start-up: the launcher gives the same archives 300 s on 2 cores (workers load, then warm up one
# batch per batch size): the startup probe allows as long before the kubelet restarts the pod.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 30


def memory_mib(inputs: Inputs) -> int:
    measured = inputs.mix.memory_mib
    if measured is None:
        return DEFAULT_MEMORY_MIB
    return int(math.ceil(measured * MEMORY_HEADROOM / 64) * 64)


def resources(inputs: Inputs) -> dict[str, dict[str, str]]:
    """Requests = limits, a whole number of CPUs: Guaranteed QoS, so with the kubelet's static CPU
    manager the pod gets exclusive cores, which is what the thread plan (workers x threads = cores)
    was measured on. A CPU limit below the budget would throttle every worker."""
    amount = {"cpu": str(inputs.mix.cores), "memory": f"{memory_mib(inputs)}Mi"}
    if inputs.gpus:  # an extended resource: requests, when given, must equal limits
        amount["nvidia.com/gpu"] = str(inputs.gpus)
    return {"requests": dict(amount), "limits": dict(amount)}


def probe_exec(port: int) -> dict[str, Any]:
    return {"exec": {"command": ["python", PROBE, str(port)]}}


def security_context() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": UID, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def container(inputs: Inputs) -> dict[str, Any]:
    ports = IMAGE.ports
    return {
        "name": "torchserve",
        "image": IMAGE_REF,
        # Management listens on the pod's loopback only (image.py): no containerPort for it.
        "ports": [{"name": "inference", "containerPort": ports.inference},
                  {"name": "metrics", "containerPort": ports.metrics}],
        "env": [{"name": "TS_CONFIG_FILE", "value": IMAGE.config}],
        "resources": resources(inputs),
        # Token auth covers /ping (400 without the key) and the keys are random per start: the probes
        # that need /ping run probe.py, which reads key_file.json; liveness only needs the port.
        "startupProbe": {**probe_exec(ports.inference), "periodSeconds": STARTUP_PERIOD_S,
                         "timeoutSeconds": 5, "failureThreshold": STARTUP_FAILURES},
        "readinessProbe": {**probe_exec(ports.inference), "periodSeconds": 10, "timeoutSeconds": 5,
                           "failureThreshold": 3},
        "livenessProbe": {"tcpSocket": {"port": "inference"}, "periodSeconds": 20, "timeoutSeconds": 5,
                          "failureThreshold": 3},
        "securityContext": security_context(),
    }


def deployment(inputs: Inputs) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "labels": dict(LABELS)},
        "spec": {
            # No replicas: the HPA owns the count (kubectl apply would reset it on every apply).
            "selector": {"matchLabels": dict(LABELS)},
            "template": {
                "metadata": {"labels": dict(LABELS),
                             "annotations": {"prometheus.io/scrape": "true",
                                             "prometheus.io/port": str(IMAGE.ports.metrics)}},
                "spec": {
                    # torchserve --stop waits up to 60 s for in-flight batches; give it as long.
                    "terminationGracePeriodSeconds": 60,
                    "containers": [container(inputs)],
                },
            },
        },
    }


def service() -> dict[str, Any]:
    ports = IMAGE.ports
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "labels": dict(LABELS)},
        "spec": {
            "selector": dict(LABELS),
            # Inference only. Metrics are scraped from each pod (its prometheus.io annotations: a Service
            # would hand a scraper one pod at random); management listens on the pod's loopback.
            "ports": [{"name": "inference", "port": ports.inference, "targetPort": "inference"}],
        },
    }


# The namespace whose pods may scrape metrics (its kubernetes.io/metadata.name label, which Kubernetes
# sets on every namespace): where your Prometheus runs.
MONITORING_NAMESPACE = "monitoring"


def network_policy() -> dict[str, Any]:
    """Ingress to the pods: the inference port from anywhere in the cluster (a gateway, the Service),
    the metrics port from the monitoring namespace only; nothing else (management is on loopback
    anyway; the kubelet's exec and TCP probes are not subject to NetworkPolicy)."""
    ports = IMAGE.ports
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": NAME, "labels": dict(LABELS)},
        "spec": {
            "podSelector": {"matchLabels": dict(LABELS)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": ports.inference}]},
                {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}}}],
                 "ports": [{"protocol": "TCP", "port": ports.metrics}]},
            ],
        },
    }


NETWORK_POLICY_HEADER = f"""\
Only the inference port ({IMAGE.ports.inference}) is admitted from the cluster; the metrics port
({IMAGE.ports.metrics}) from the namespace named {MONITORING_NAMESPACE!r} only (edit it to where Prometheus
runs); management ({IMAGE.ports.management}) and gRPC listen on the pod's loopback and are admitted from
nowhere. To admit the inference port from your gateway alone, add a `from:` to the first rule.
Needs a network plugin that enforces NetworkPolicy (Calico, Cilium, ...): without one it is ignored."""


def hpa(plan: Plan) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": NAME, "labels": dict(LABELS)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
            "minReplicas": plan.replicas,
            "maxReplicas": plan.max_replicas,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": plan.cpu_target_percent}}}],
        },
    }


HPA_HEADER = """\
The custom-metric alternative (needs the Prometheus adapter exposing TorchServe's per-pod queue
latency; scales on what the SLO feels rather than on CPU):
  metrics:
  - type: Pods
    pods:
      metric: {name: ts_queue_latency_microseconds_per_second}
      target: {type: AverageValue, averageValue: "50000"}   # 50 ms of queueing per second per pod
with an adapter rule such as
  seriesQuery: 'ts_queue_latency_microseconds{namespace!="",pod!=""}'
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)'
  name: {as: ts_queue_latency_microseconds_per_second}"""


def pdb() -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": NAME, "labels": dict(LABELS)},
        # maxUnavailable, not minAvailable: with one replica minAvailable 1 would block every node drain.
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(LABELS)}},
    }


def secret() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{NAME}-gateway-key", "labels": dict(LABELS)},
        "type": "Opaque",
        "stringData": {"bearer-key": "REPLACE_ME_WITH_A_GATEWAY_KEY"},
    }


SECRET_HEADER = f"""\
TorchServe 0.12 cannot be given its keys: TokenAuthorization.init() draws the inference, management
and API keys from SecureRandom at every start and writes them to key_file.json in the working
directory ({KEY_FILE}); it reads no key from a file, a property or the environment. So no Secret
is mounted into the pods, and every replica has its own keys. Clients read a pod's keys with
  kubectl exec <pod> -- cat {KEY_FILE}
(they expire after token_expiration_min, 60 by default; POST /token?type=inference with the API key
renews them). Behind a Service with several replicas one key does not fit all pods: put an
authenticating gateway in front, whose shared key this Secret template holds (placeholder only;
create the real one with kubectl create secret generic ... --from-literal), and send the pod's own
key from the gateway, or set disable_token_authorization=true with a NetworkPolicy that admits the
gateway alone."""


def _dump(path: Path, header: str, doc: dict[str, Any]) -> Path:
    lines = ["Generated by python -m deployment (make deploy / make plan): do not edit.", *header.splitlines()]
    text = "\n".join(f"# {line}" if line else "#" for line in lines) + "\n"
    path.write_text(text + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def write_hpa(out: Path, inputs: Inputs, plan: Plan) -> Path:
    header = (f"Plan: {plan.explain(inputs.mix)}\n"
              f"CPU target {plan.cpu_target_percent}% = 1 - headroom: a replica at the target runs at the "
              f"usable rate.\n{HPA_HEADER}")
    return _dump(out / "k8s" / "hpa.yaml", header, hpa(plan))


def write(out: Path, inputs: Inputs, plan: Plan) -> list[Path]:
    (out / "k8s").mkdir(parents=True, exist_ok=True)
    k8s = out / "k8s"
    cpu = inputs.mix.cores
    mem = ("a stated default (the mix record has no measured RSS)" if inputs.mix.memory_mib is None
           else f"the measured RSS {inputs.mix.memory_mib:.0f} MiB x {MEMORY_HEADROOM:g}")
    return [
        _dump(k8s / "deployment.yaml",
              f"CPU {cpu} = the mix's cores budget (sum of workers x threads); memory {memory_mib(inputs)} Mi = {mem}.\n"
              "No replicas field: the HPA (hpa.yaml, sized by make plan) owns the count.", deployment(inputs)),
        _dump(k8s / "service.yaml", "Inference only: metrics are scraped per pod, management stays on each pod's "
              "loopback.", service()),
        _dump(k8s / "networkpolicy.yaml", NETWORK_POLICY_HEADER, network_policy()),
        write_hpa(out, inputs, plan),
        _dump(k8s / "pdb.yaml", "At most one replica down at a time for voluntary disruptions.", pdb()),
        _dump(k8s / "secret.yaml", SECRET_HEADER, secret()),
    ]
