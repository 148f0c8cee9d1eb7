"""The deployment examples parse, and say what the docs say: one GPU per runner, the token from a secret, probes on
the files the worker writes, and a grace period long enough for the worker's drain on SIGTERM."""

from pathlib import Path

import yaml

from runner.cli.worker import WorkerSettings

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
K8S = DEPLOY / "k8s"


def worker_setting(name: str) -> bool:
    return name.removeprefix("FUSEBOT_WORKER_").lower() in WorkerSettings.model_fields


def test_compose_gives_each_runner_its_own_gpu_and_no_inline_token():
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    gpus = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in doc["services"].values()]
    assert gpus == [["0"], ["1"]]
    for svc in doc["services"].values():
        assert svc["environment"]["FUSEBOT_WORKER_TOKEN"].startswith("${")
        assert all(worker_setting(k) for k in svc["environment"])
        drain_s = float(svc["environment"]["FUSEBOT_WORKER_DRAIN_SECONDS"])
        assert float(svc["stop_grace_period"].removesuffix("s")) >= drain_s + 15
        assert "seccomp=unconfined" in svc["security_opt"]


def k8s_docs() -> dict[str, dict]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = [yaml.safe_load((K8S / name).read_text()) for name in kust["resources"]]
    return {d["kind"]: d for d in docs}


def test_kubernetes_runs_one_worker_per_gpu_with_probes_and_a_drain():
    docs = k8s_docs()
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 == c["resources"]["requests"]["nvidia.com/gpu"]
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    env = {e["name"]: e for e in c["env"]}
    assert all(worker_setting(name) for name in env)  # every variable is one the worker reads
    assert "secretKeyRef" in env["FUSEBOT_WORKER_TOKEN"]["valueFrom"]
    assert c["readinessProbe"]["exec"]["command"][-1] == env["FUSEBOT_WORKER_READY_FILE"]["value"]
    assert "FUSEBOT_WORKER_ALIVE_FILE" in " ".join(c["livenessProbe"]["exec"]["command"])
    drain_s = float(env["FUSEBOT_WORKER_DRAIN_SECONDS"]["value"])
    assert pod["terminationGracePeriodSeconds"] >= drain_s + 15  # the drain, then the release call
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "Unconfined"  # bubblewrap's namespaces
    pdb = docs["PodDisruptionBudget"]["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"] == docs["Deployment"]["spec"]["selector"]


def test_the_single_file_manifest_is_the_k8s_one():
    assert yaml.safe_load((DEPLOY / "kubernetes.yml").read_text()) == k8s_docs()["Deployment"]
