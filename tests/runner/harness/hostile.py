"""A child that runs whatever Python it is sent, confined as a candidate is (bubblewrap, then confine()): the
hostile side of the sandbox tests. `{"cmd": "run", "code": ...}` executes the code; its `result` is the reply."""

import os
from pathlib import Path

from runner.harness.procs.process import serve
from runner.harness.sandbox import confine


def _init(state: dict, msg: dict) -> dict:
    if not msg.get("confine", True):  # bubblewrap alone: as where the kernel has no Landlock
        return {"confinement": {}}
    extra = [Path(p) for p in msg.get("extra_write", [])]
    return {"confinement": confine(Path(os.getcwd()), extra_write=extra).as_dict()}


def _run(state: dict, msg: dict) -> dict:
    scope: dict = {"result": None}
    exec(msg["code"], scope)  # noqa: S102 - the point: arbitrary code, as a candidate's
    return {"result": scope["result"]}


if __name__ == "__main__":
    serve({"init": _init, "run": _run}, {})
