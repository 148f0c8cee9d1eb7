"""The timer's sample is own (start -> end on the caller's stream) plus what the device-wide sync waited for beyond a
no-op's. Which tail leaks the host's speed into short calls? Per sample, in one loop: own; the GPU-event tail (end ->
an event recorded after the sync returns: the timer before session 14) less its no-op floor; the host-timed tail (the
sync's own duration after the end event has fired) less its no-op floor; and the host-timed tail less that of a
call that does nothing queued right after behind the same lead (paired). torch.compile's MinGPT GELU, in this
process (plain) and in a child that runs the judge's own init first (in-judge: the slow host time of
worker_probe.py); and a 0.2 ms spin that leaves 50 us of spin on another stream (escape: the tails must see it).
Figures: medians of 60 samples in us (p10-p90 for own and the paired tail)."""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from runner import timing

PROBLEM = Path(os.environ.get("PROBE_PROBLEM", "out/kb-suite/level1_88_MinGPTNewGelu.py")).resolve()


def sample(timer, fn, lead_cycles):
    start, end, after = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    h0 = time.perf_counter_ns()
    timer.flush()
    if lead_cycles:
        torch.cuda._sleep(lead_cycles)
    start.record()
    fn()
    host = (time.perf_counter_ns() - h0) / 1e3
    end.record()
    end.synchronize()
    t1 = time.perf_counter_ns()
    torch.cuda.synchronize()
    t2 = time.perf_counter_ns()
    after.record()
    after.synchronize()
    e2 = torch.cuda.Event(enable_timing=True)
    timer.flush()
    if lead_cycles:
        torch.cuda._sleep(lead_cycles)
    e2.record()
    e2.synchronize()
    t3 = time.perf_counter_ns()
    torch.cuda.synchronize()
    t4 = time.perf_counter_ns()
    return (start.elapsed_time(end) * 1e3, end.elapsed_time(after) * 1e3, (t2 - t1) / 1e3, host, (t4 - t3) / 1e3)


def med(xs):
    s = sorted(xs)
    return s[len(s) // 2]


def run(setting, model, inputs):
    compiled = torch.compile(model)
    timer = timing.Timer("cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(*inputs)
        nothing = [sample(timer, lambda: None, 0) for _ in range(20)]
        gpu_floor, host_floor = min(x[1] for x in nothing), min(x[2] for x in nothing)
        timer.lead_us = 1000.0
        cyc = timer._lead_cycles()
        xs = [sample(timer, lambda: compiled(*inputs), cyc) for _ in range(60)]
    report(setting, xs, gpu_floor, host_floor)


def report(setting, xs, gpu_floor, host_floor):
    own = sorted(x[0] for x in xs)
    paired = sorted(x[2] - x[4] for x in xs)
    sys.stdout.write(f"| {setting} | {med(own):.1f} ({own[6]:.1f}-{own[53]:.1f}) | {med([x[1] for x in xs]) - gpu_floor:.1f} "
                     f"| {med([x[2] for x in xs]) - host_floor:.1f} | {med(paired):.1f} ({paired[6]:.1f}-{paired[53]:.1f}) "
                     f"| {gpu_floor:.1f} | {host_floor:.1f} | {med([x[3] for x in xs]):.0f} |\n")


def escape(timer):
    side = torch.cuda.Stream()
    spin = int(timer._cycles_per_us * 200)
    tail = int(timer._cycles_per_us * 250)

    def fn():
        torch.cuda._sleep(spin)
        with torch.cuda.stream(side):
            torch.cuda._sleep(tail)  # starts with the call, ends ~50 us after it
    return fn


def main():
    from runner.problem import build_model, load, make_inputs, strict_fp32

    from runner.cli import problem_from_file

    if sys.argv[1:] == ["in-judge"]:
        from runner.workers import judge
        st = judge.State()
        judge.init(st, {"problem": problem_from_file(PROBLEM).model_dump(), "device": "cuda", "init_seed": 5,
                        "timer": {}, "extra_write": [os.environ["HOME"]]})
        for _ in range(2):
            run("in-judge", st.model, make_inputs(st.problem, 11, shape_set=0, randn=None, device="cuda"))
        return
    sys.stdout.write(torch.cuda.get_device_name() + "\n| setting | own us (p10-p90) | GPU-event tail over floor us "
                     "| host-timed tail over floor us | host-timed tail over the paired no-op's us | GPU-event floor "
                     "| host-timed floor | host us |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    strict_fp32()
    problem = load(problem_from_file(PROBLEM))
    model = build_model(problem, problem.model_cls, 5, "cuda")
    for _ in range(2):
        run("plain", model, make_inputs(problem, 11, shape_set=0, randn=None, device="cuda"))
    timer = timing.Timer("cuda")
    timer.lead_us = 300.0
    cyc = timer._lead_cycles()
    nothing = [sample(timer, lambda: None, 0) for _ in range(20)]
    fn = escape(timer)
    report("escape (50 us on a side stream)", [sample(timer, fn, cyc) for _ in range(60)],
           min(x[1] for x in nothing), min(x[2] for x in nothing))
    from runner.sandbox import confined_env
    wd = Path(tempfile.mkdtemp())
    env = confined_env(wd)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(wd / "inductor")
    subprocess.run([sys.executable, __file__, "in-judge"], check=True, env=env)


if __name__ == "__main__":
    main()
