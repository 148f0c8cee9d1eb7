"""What `fusebot worker` writes down: its log (one line per unit leased, one per target with its verdict, polling
quiet unless -v), and the lease it holds (FUSEBOT_WORKER_LEASE_FILE), so that a worker killed mid-unit hands that
unit back when it starts again instead of leaving it "running" until its lease expires."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx

from runner.contract import JobResult

log = logging.getLogger(__name__)


def result_lines(job_id: str, result: JobResult) -> list[str]:
    """One line per target of a finished unit: what a person reading the worker's log wants to know."""
    lines = []
    for t in result.targets:
        verdict = "faster kernel" if t.improved else "no faster kernel"
        lines.append(f"job {job_id} target {t.target}: {verdict}" + (f": {t.message}" if t.message else ""))
    return lines or [f"job {job_id}: done"]


def quiet_polling(verbose: bool) -> None:
    """httpx logs every request at INFO, a line per poll: only with -v."""
    logging.getLogger("httpx").setLevel(logging.INFO if verbose else logging.WARNING)


class HeldLease:
    """The unit this worker holds, in a file of its own (none: not recorded)."""

    def __init__(self, path: Path | None):
        self.path = path

    def note(self, unit_id: str, lease: str) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch(mode=0o600)
            self.path.write_text(json.dumps({"unit": unit_id, "lease": lease}))

    def clear(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def give_back(self, client: httpx.Client, lease_header: str) -> bool:
        """Release the unit a previous run of this worker held when it was killed. True when the bot took it back."""
        if self.path is None or not self.path.exists():
            return False
        try:
            held = json.loads(self.path.read_text())
            r = client.post(f"/runner/v1/jobs/{held['unit']}/release", headers={lease_header: held["lease"]})
            released = r.status_code == 200 and bool(r.json().get("released"))
        except (ValueError, KeyError, TypeError, httpx.HTTPError) as e:
            log.warning("could not hand back the unit a previous run of this worker held: %s", e)
            return False
        log.info("unit %s, held by this worker when it stopped, %s", held["unit"],
                 "is back in the queue" if released else "was no longer ours (finished or expired)")
        self.clear()
        return released
