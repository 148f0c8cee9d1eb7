"""The deployment examples parse, and say what the docs say (one GPU per runner, the token from a secret)."""

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_compose_gives_each_runner_its_own_gpu_and_no_inline_token():
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    gpus = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in doc["services"].values()]
    assert gpus == [["0"], ["1"]]
    for svc in doc["services"].values():
        assert svc["environment"]["FUSEBOT_WORKER_TOKEN"].startswith("${")


def test_kubernetes_runner_has_one_gpu_a_secret_token_and_a_liveness_probe():
    doc = yaml.safe_load((DEPLOY / "kubernetes.yml").read_text())
    pod = doc["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    token = next(e for e in c["env"] if e["name"] == "FUSEBOT_WORKER_TOKEN")
    assert "secretKeyRef" in token["valueFrom"]
    assert "FUSEBOT_WORKER_ALIVE_FILE" in " ".join(c["livenessProbe"]["exec"]["command"])
    assert pod["securityContext"]["runAsNonRoot"] is True
