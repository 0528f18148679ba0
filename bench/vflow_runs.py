"""Timed vflow-train runs for the benchmarks: one intra-op thread per worker, no
evaluation, a metrics record every step."""
import json
import os
import subprocess
import tempfile


def timed_steps(build, args, steps, warmup):
    """Runs vflow-train with `args` for warmup + steps steps; returns the step records of
    the metrics file after the first `warmup`."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [os.path.join(build, "vflow-train"), *args,
               "--set", "semantic.epochs=null", "--set", f"semantic.steps={warmup + steps}",
               "--set", "resources.threads=1", "--set", "output.evaluation.enabled=false",
               "--set", "output.logging.progress=off", "--set", "output.logging.every_steps=1",
               "--set", f"output.logging.metrics={metrics}"]
        subprocess.run(cmd, check=True, capture_output=True)
        records = [json.loads(line) for line in open(metrics)]
    return [r for r in records if r["event"] == "step" and r["step"] > warmup]
