"""worker_probe.py found torch.compile's MinGPT GELU ~10% slower when the harness's judge times it (0.221 ms, host
233-251 us) than in a plain or a confined process (0.189-0.204). Which part of the judge's setting does it?
  harness      Evaluator.baselines(), as the harness runs it;
  harness-5s   the same with the parent polling its workers' memory every 5 s instead of every 50 ms;
  in-process   the judge's own init and baselines handlers called in a child process (no request loop, no parent
               polling), then the compiled call's kernels by torch.profiler in that process.
Each figure is one Timer measurement: median, IQR, min and max of its samples in ms; host and lead in us."""
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

PROBLEM = Path(os.environ.get("PROBE_PROBLEM", "out/kb-suite/level1_88_MinGPTNewGelu.py")).resolve()
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # (cpu: a smoke test of this script)


def row(setting, name, t):
    s = sorted(t["samples_ms"])
    sys.stdout.write(f"| {setting} | {name} | {t['median_ms']:.4f} | {t['iqr_ms']:.4f} | {s[0]:.4f} | {s[-1]:.4f} | "
                     f"{t['n']} | {(t['host_ms'] or 0) * 1e3:.0f} | {t['lead_ms'] * 1e3:.0f} |\n")


def in_process():
    from runner.workers import judge

    from runner.cli import problem_from_file

    st = judge.State()
    wd = Path(os.environ["HOME"])
    reply = judge.init(st, {"problem": problem_from_file(PROBLEM).model_dump(), "device": DEV, "init_seed": 5,
                            "timer": {}, "extra_write": [str(wd)]})
    assert "confinement" in reply, reply
    for _ in range(2):
        b = judge.baselines(st, {"seed": 11, "compile": True})
        row("in-process", "eager", b["eager"])
        row("in-process", "torch.compile", b["compile"])
    if DEV == "cuda":
        from runner.problem import make_inputs

        from bench.template_sweep import kernel_times_us
        inputs = make_inputs(st.problem, 12, shape_set=0, randn=None, device=DEV)
        compiled = torch.compile(st.model)
        with torch.no_grad():
            compiled(*inputs)
            for name, us in kernel_times_us(lambda: compiled(*inputs), calls=20).items():
                sys.stdout.write(f"| in-process | kernel {name[:60]} | {us / 1e3:.4f} | | | | 20 | | |\n")


def main():
    if sys.argv[1:] == ["in-process"]:
        in_process()
        return
    sys.stdout.write((torch.cuda.get_device_name() if DEV == "cuda" else "cpu") + "\n| setting | call | median ms | "
                     "IQR ms | min ms | max ms | n | host us | lead us |\n| --- | --- | ---: | ---: | ---: | ---: | "
                     "---: | ---: | ---: |\n")
    from runner import evaluate, proc
    from runner.cli import problem_from_file

    for setting, poll in (("harness", 0.05), ("harness-5s", 5.0), ("harness", 0.05), ("harness-5s", 5.0)):
        evaluate.Limits = functools.partial(proc.Limits, poll_seconds=poll)
        with evaluate.Evaluator(problem_from_file(PROBLEM), backend=DEV) as ev:
            b = ev.baselines()
            row(setting, "eager", json.loads(b.eager.model_dump_json()))
            row(setting, "torch.compile", json.loads(b.compile.model_dump_json()))
    from runner.sandbox import confined_env
    wd = Path(tempfile.mkdtemp())
    env = confined_env(wd)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(wd / "inductor")
    subprocess.run([sys.executable, __file__, "in-process"], check=True, env=env)


if __name__ == "__main__":
    main()
