"""Generated drop-ins on a real device: for every example, the seed proposer's kernels through the harness, the
fastest verified one written out as a PR would add it, its generated test run by the runner's own check, and the
drop-in driven through torch.compile and (on CUDA) a captured CUDA graph.

    python bench/dropin_gpu.py --backend cuda --out bench/results/h100-dropin     # on the H100
    python bench/dropin_gpu.py --backend cpu --out /tmp/dropin-cpu                 # anywhere

Writes <out>/results.json (per target: verdict summary, what ships beside the drop-in (a CUDA kernel: its cubin and
PTX), the check's counts, the probes), prints the table, and
exits 1 when any target's drop-in failed its test or a probe. Needs fusebot installed (`make test` sets up .venv).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bot.repo.discovery import marked_targets as discover
from runner.contract import ProblemSpec
from runner.harness.evaluator import Evaluator
from runner.pipeline import kernelbench_aliases
from runner.proposers.catalog import CatalogProposer
from runner.proposers.seed import SeedProposer, Unsupported
from runner.results.files import Provenance, check_dropin, slug, target_files, write_files
from runner.results.proposal import manifest_extra
from runner.results.shapes import verified_inputs
from runner.search.types import History, Idea, ProblemContext

ROOT = Path(__file__).resolve().parents[1]

KERNELS = "fusebot_kernels"
PROBE = r"""
import importlib, sys, torch
mod = importlib.import_module("fusebot_kernels.%(folder)s.dropin")
ref = importlib.import_module("%(module)s")
init = ref.get_init_inputs()
torch.manual_seed(0)
original = mod.Original(*init).to("%(device)s").eval()
fused = mod.%(cls)s(*init).to("%(device)s").eval()
fused.load_state_dict(original.state_dict())
x = [t.to("%(device)s") for t in ref.get_inputs()]
with torch.no_grad():
    want = original(*x)
    compiled = torch.compile(fused, fullgraph=True)
    torch.testing.assert_close(compiled(*x), want, atol=1e-4, rtol=1e-4)
    print("torch.compile: ok")
    if "%(device)s" == "cuda":
        static = [t.clone() for t in x]
        for _ in range(3):
            fused(*static)  # warm up: the build, the output specs
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused(*static)
        for t, s in zip(x, static):
            s.copy_(t * 0.5)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, original(*[t * 0.5 for t in x]), atol=1e-4, rtol=1e-4)
        print("CUDA graph: ok")
"""


def run_target(t, repo: Path, backend: str) -> dict:
    spec = ProblemSpec(name=t.name, root=str(repo), module=t.file.removesuffix(".py").replace("/", "."),
                       class_name=t.class_name, second_inputs=t.second_inputs)
    ctx = ProblemContext(name=t.name, reference_source=(repo / t.file).read_text(), backend=backend)
    try:
        cands = SeedProposer().implement(ctx, Idea(text="fuse"), History(), 2)
    except Unsupported:  # (an example beyond the seed's elementwise chains, e.g. diag(g) @ x): the catalog's first idea
        cat = CatalogProposer()
        ctx = ctx.model_copy(update={"reference_source": ctx.reference_source + kernelbench_aliases(spec)})
        cands = cat.implement(ctx, cat.ideas(ctx, History(), 1)[0], History(), 2)
    with Evaluator(spec, backend=backend) as ev:
        verdicts = ev.evaluate_many(cands)
    ok = sorted((v.timing.median_ms, i) for i, v in enumerate(verdicts) if v.accepted and v.timing)
    row: dict = {"target": t.name, "candidates": [{"id": c.id, "accepted": v.accepted, "reasons": v.reasons[:2],
                                                   "median_ms": v.timing.median_ms if v.timing else None}
                                                  for c, v in zip(cands, verdicts, strict=True)]}
    if not ok:
        row["error"] = "no seed kernel was verified"
        return row
    cand, v = cands[ok[0][1]], verdicts[ok[0][1]]
    row["verdict"] = {"median_ms": v.timing.median_ms, "iqr_ms": v.timing.iqr_ms, "n": v.timing.n,
                      "eager_ms": v.baselines.eager.median_ms if v.baselines and v.baselines.eager else None,
                      "compile_ms": v.baselines.compile.median_ms if v.baselines and v.baselines.compile else None,
                      "trials_passed": sum(tr.passed for tr in v.trials), "trials": len(v.trials),
                      "device": (v.environment.gpu or v.environment.cpu) if v.environment else None}
    row["environment"] = v.environment.model_dump(include={"gpu", "cpu", "driver", "cuda", "torch"}) if v.environment else {}
    extra = manifest_extra(v, backend=backend, verified=verified_inputs(spec))  # the verified calls: launch plans
    files = target_files(spec, cand, v, Provenance.for_verdict(t.name, v, "examples"), extra=extra)
    write_files(repo / KERNELS, files)
    row["shipped"] = sorted(n.rsplit("/", 1)[-1] for n in files if n.endswith((".cubin.b64", ".ptx", ".so.b64")))
    check = check_dropin(repo, KERNELS, t.name)
    row["check"] = check.model_dump(exclude={"output_tail"}) | {"tail": check.output_tail[-1500:]}
    probe = subprocess.run([sys.executable, "-c", PROBE % {"folder": slug(t.name), "module": spec.module,
                                                           "cls": t.class_name, "device": backend}],
                           cwd=repo, capture_output=True, text=True, timeout=900)
    row["probe"] = {"ok": probe.returncode == 0, "output": (probe.stdout + probe.stderr)[-1500:]}
    return row


def git_commit() -> str:
    """The checkout's commit, named in the results: the code that produced them."""
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fusebot-dropins-") as tmp:
        repo = Path(tmp)
        shutil.copytree(ROOT / "examples", repo / "examples")
        rows = [run_target(t, repo, args.backend) for t in discover(repo)]
    env = next((r["environment"] for r in rows if r.get("environment")), {})
    table = {"suite": "dropin", "date": time.strftime("%Y-%m-%d"), "gpu": env.get("gpu"), "driver": env.get("driver"),
             "cuda": env.get("cuda"), "torch": env.get("torch"), "commit": git_commit(), "backend": args.backend,
             "rows": rows}
    (args.out / "results.json").write_text(json.dumps(table, indent=1) + "\n")
    lines = ["| target | fusebot ms | eager ms | compile ms | trials | shipped | drop-in test | compile/graph probe |",
             "| --- | ---: | ---: | ---: | --- | --- | --- | --- |"]
    failed = False
    for r in rows:
        v, c, p = r.get("verdict") or {}, r.get("check") or {}, r.get("probe") or {}
        good = bool(c.get("passed")) and bool(p.get("ok"))
        failed |= not good
        ms = lambda x: f"{x:.4g}" if isinstance(x, float) else "n/a"  # noqa: E731
        lines.append(f"| {r['target']} | {ms(v.get('median_ms'))} | {ms(v.get('eager_ms'))} | {ms(v.get('compile_ms'))} | "
                     f"{v.get('trials_passed')}/{v.get('trials')} | {', '.join(r.get('shipped') or []) or 'none'} | "
                     f"{c.get('passed_tests')} passed, "
                     f"{c.get('failed_tests')} failed | {'ok' if p.get('ok') else 'FAILED'} |")
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
