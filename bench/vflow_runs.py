"""Timed vflow-train runs for the benchmarks: one intra-op thread per worker unless told,
no evaluation, a metrics record every step."""
import json
import os
import statistics
import subprocess
import tempfile


def timing_args(steps, warmup, metrics, threads=1):
    """vflow-train settings of a timed run: warmup + steps steps, `threads` intra-op threads
    per worker, no evaluation, a record of every step in `metrics`."""
    return ["--set", "semantic.epochs=null", "--set", f"semantic.steps={warmup + steps}",
            "--set", f"resources.threads={threads}", "--set", "output.evaluation.enabled=false",
            "--set", "output.logging.progress=off", "--set", "output.logging.every_steps=1",
            "--set", f"output.logging.metrics={metrics}"]


def step_records(metrics, warmup):
    """The step records of a metrics file after the first `warmup`."""
    records = [json.loads(line) for line in open(metrics)]
    return [r for r in records if r["event"] == "step" and r["step"] > warmup]


def summary(steps):
    """Examples/s over the steps (of one global batch size: all examples over all step
    time) and their mean compute, sync and update times."""
    seconds_per_example = sum(1.0 / r["examples_per_second"] for r in steps)
    return {"examples_per_second": len(steps) / seconds_per_example,
            "compute_ms": statistics.mean(r["compute_ms"] for r in steps),
            "sync_ms": statistics.mean(r["sync_ms"] for r in steps),
            "update_ms": statistics.mean(r["update_ms"] for r in steps)}


def timed_steps(build, args, steps, warmup, threads=1):
    """Runs vflow-train with `args` for warmup + steps steps, `threads` intra-op threads per
    worker; returns the step records of the metrics file after the first `warmup`."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [os.path.join(build, "vflow-train"), *args,
               *timing_args(steps, warmup, metrics, threads)]
        subprocess.run(cmd, check=True, capture_output=True)
        return step_records(metrics, warmup)
