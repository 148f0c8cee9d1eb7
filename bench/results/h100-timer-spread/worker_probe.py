"""Where does the harness's short-kernel spread come from? The same Timer on MinGPT's GELU (eager and
torch.compile, the judge's own calls) in four settings, one after the other on the GPU:
  plain     this process;
  idle6     this process with six other processes alive that hold a CUDA context and sleep (the harness keeps a
            batch's loaded candidates alive while one is timed);
  confined  a child process that calls runner.sandbox.confine first (what every worker does);
  harness   Evaluator.baselines(): the judge worker itself.
Each figure is one Timer measurement: median, IQR, min and max of its samples in ms; host and lead in us."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from runner.evaluate import HarnessConfig
from runner.problem import build_model, load, make_inputs, strict_fp32
from runner.timing import Timer, TimerConfig

from runner.cli import problem_from_file

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # (cpu: a smoke test of this script)
PROBLEM = Path(os.environ.get("PROBE_PROBLEM", "out/kb-suite/level1_88_MinGPTNewGelu.py"))


def row(setting, name, t):
    s = sorted(t.samples_ms)
    sys.stdout.write(f"| {setting} | {name} | {t.median_ms:.4f} | {t.iqr_ms:.4f} | {s[0]:.4f} | {s[-1]:.4f} | "
                     f"{t.n} | {(t.host_ms or 0) * 1e3:.0f} | {t.lead_ms * 1e3:.0f} |\n")


def local(setting, reps=3):
    strict_fp32()
    spec = problem_from_file(PROBLEM)
    problem = load(spec)
    model = build_model(problem, problem.model_cls, 0, DEV)
    cfg = TimerConfig(**HarnessConfig().timer)
    with torch.no_grad():
        inputs = make_inputs(problem, 7, shape_set=0, randn=None, device=DEV)
        compiled = torch.compile(model)
        compiled(*inputs)
        for _ in range(reps):
            row(setting, "eager", Timer(DEV, cfg).measure(lambda: model(*inputs)))
            row(setting, "torch.compile", Timer(DEV, cfg).measure(lambda: compiled(*inputs)))


def main():
    if sys.argv[1:] == ["confined"]:
        from runner.sandbox import confine
        confine(Path(os.environ["HOME"]))  # confined_env points HOME and every cache there
        local("confined")
        return
    if sys.argv[1:] == ["idle"]:
        _held = torch.ones(1 << 20, device=DEV)  # a context with memory of its own
        torch.cuda.synchronize()
        sys.stdin.read()
        return
    sys.stdout.write((torch.cuda.get_device_name() if DEV == "cuda" else "cpu") + "\n| setting | call | median ms | IQR ms | min ms | max ms | n "
                     "| host us | lead us |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    local("plain")
    idle = [subprocess.Popen([sys.executable, __file__, "idle"], stdin=subprocess.PIPE) for _ in range(6)]
    import time
    time.sleep(20 if DEV == "cuda" else 2)
    local("idle6")
    for p in idle:
        p.stdin.close()
        p.wait()
    from runner.sandbox import confined_env
    wd = Path(tempfile.mkdtemp())
    env = confined_env(wd)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(wd / "inductor")  # (this process's compile set it to its own)
    subprocess.run([sys.executable, __file__, "confined"], check=True, env=env)
    from runner.evaluate import Evaluator
    for _ in range(2):
        with Evaluator(problem_from_file(PROBLEM), backend=DEV) as ev:
            b = ev.baselines()
            row("harness", "eager", b.eager)
            row("harness", "torch.compile", b.compile)


if __name__ == "__main__":
    main()
