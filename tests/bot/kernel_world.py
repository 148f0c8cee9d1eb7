"""A repository that holds a real fusebot kernel, and a runner that runs leased jobs for real (CPU backend).

The example module (examples/mlp_epilogue.py) goes into the fake GitHub's repository; the kernel files are the ones
runner/results/files.py writes for the seed proposer's fused kernel, so their manifest names that module. `run_leased`
is a runner over the runner API: lease, download the job's source tarball, `runner.pipeline.run_job` on it (no stubs),
heartbeat its progress, upload the result.
"""

from __future__ import annotations

import tempfile
from datetime import datetime
from pathlib import Path

from runner.cli.worker import safe_extract
from runner.contract import JobResult, Progress
from runner.pipeline import run_job
from runner.results.files import Provenance, slug, target_files
from tests.verdicts import EXAMPLE, SPEC, real_verdicts, seed_candidate

KERNELS = "fusebot_kernels"
FOLDER = slug(SPEC.name)
MODULE_PATH = f"examples/{EXAMPLE.name}"
LEASE = "X-Fusebot-Lease"


def kernel_files(repo: str = "", commit: str = "", now: datetime | None = None) -> dict[str, str]:
    """Path under the kernels dir -> text of the fused kernel's folder, as a fusebot PR adds it."""
    v = real_verdicts()["fused"]
    return target_files(SPEC, seed_candidate(), v, Provenance.for_verdict(SPEC.name, v, repo, commit, now=now))


def merged(files: dict[str, str]) -> dict[str, str]:
    """The same files as repository paths (as they are once the PR is merged)."""
    return {f"{KERNELS}/{path}": text for path, text in files.items()}


def break_kernel(text: str) -> str:
    """A maintainer's edit that makes the kernel wrong: relu with the wrong threshold."""
    edited = text.replace("v < 0.0f ? 0.0f : v", "v > 0.25f ? v : 0.0f")
    assert edited != text
    return edited


def run_leased(world, *, runner: str = "gpu-a", backend: str = "cpu") -> JobResult:
    """Lease the next job, run it for real on this machine and upload its result."""
    leased = world.client.post("/runner/v1/lease", headers=world.runner(runner))
    assert leased.status_code == 200, leased.text
    got = leased.json()
    job_id = got["job"]["id"]
    hdr = {**world.runner(runner), LEASE: got["lease_token"]}

    def progress(p: Progress) -> None:
        r = world.client.post(f"/runner/v1/jobs/{job_id}/heartbeat", json=p.model_dump(mode="json"), headers=hdr)
        assert r.status_code == 200 and r.json()["state"] == "running", r.text

    from runner.contract import Job

    job = Job.model_validate(got["job"])
    with tempfile.TemporaryDirectory(prefix="fusebot-test-runner-") as tmp:
        tarball = Path(tmp) / "source.tar.gz"
        r = world.client.get(f"/runner/v1/jobs/{job_id}/source", headers=hdr)
        assert r.status_code == 200, r.text
        tarball.write_bytes(r.content)
        src = Path(tmp) / "src"
        src.mkdir()
        safe_extract(tarball, src)
        result = run_job(job, src, progress, backend=backend)
    r = world.client.post(f"/runner/v1/jobs/{job_id}/result", json=result.model_dump(mode="json"), headers=hdr)
    assert r.json() == {"recorded": True}, r.text
    return result
