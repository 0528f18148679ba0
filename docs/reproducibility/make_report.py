#!/usr/bin/python3
"""Reproducibility report: the same job spec on K = 1, 2, 3, 4 workers.

Trains a ConvNet with batch norm and dropout (N = 12 vnodes) on Fashion-MNIST
with each worker count, in the default mode and with deterministic: true, and
writes loss_curves.png (the K runs overlaid) and report.md (fingerprints and the
largest loss difference) next to this script.

    docs/reproducibility/make_report.py [--train build/vflow-train] [--steps 120]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKERS = [1, 2, 3, 4]


def job_args(steps):
    return [
        "--set", "semantic.model.options={channels: [16, 32], hidden: 64, dropout: 0.25, batch_norm: true}",
        "--set", "semantic.global_batch=96",
        "--set", "semantic.virtual_nodes=12",
        "--set", "semantic.epochs=null",
        "--set", f"semantic.steps={steps}",
        "--set", "semantic.schedule={name: cosine, warmup_steps: 10}",
        "--set", "resources.threads=1",
        "--set", "output.logging.every_steps=1",
        "--set", "output.logging.progress=lines",
        "--set", "output.evaluation.every_epochs=0",
    ]


def run(train, workers, deterministic, steps, workdir):
    metrics = os.path.join(workdir, f"k{workers}-{'det' if deterministic else 'default'}.jsonl")
    cmd = [train, *job_args(steps), "--workers", str(workers),
           "--set", f"semantic.deterministic={'true' if deterministic else 'false'}",
           "--set", f"output.logging.metrics={metrics}"]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    text = out.stdout + out.stderr
    fingerprints = sorted(set(re.findall(r"fingerprint ([0-9a-f]{16})", text)))
    accuracy = re.findall(r"test accuracy ([0-9.]+)%", text)
    losses = []
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if record["event"] == "step":
                losses.append((record["step"], record["loss"]))
    return {"fingerprints": fingerprints, "losses": losses, "accuracy": accuracy[-1] if accuracy else "?"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", default=os.path.join(ROOT, "build", "vflow-train"))
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()

    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for deterministic in (False, True):
            for k in WORKERS:
                results[(deterministic, k)] = run(args.train, k, deterministic, args.steps, workdir)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, deterministic in zip(axes, (False, True)):
        for k, style in zip(WORKERS, ["-", "--", ":", "-."]):
            steps, losses = zip(*results[(deterministic, k)]["losses"])
            ax.plot(steps, losses, style, label=f"K = {k} workers", linewidth=1.2)
        ax.set_title(f"deterministic: {'true' if deterministic else 'false'}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("training loss (global batch mean)")
    fig.suptitle("Same job spec (ConvNet + batch norm + dropout, N = 12 vnodes, Fashion-MNIST) on 1-4 workers")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "loss_curves.png"), dpi=110)

    lines = ["# Reproducibility report", "",
             "Produced by `docs/reproducibility/make_report.py --steps %d` on a 2-core machine." % args.steps,
             "Each run trains the same job spec; only `--workers` changes.", "",
             "![loss curves](loss_curves.png)", "",
             "| mode | K | fingerprint (every rank) | test accuracy | max abs loss difference to K = 1 |",
             "|---|---|---|---|---|"]
    for deterministic in (False, True):
        base = [loss for _, loss in results[(deterministic, 1)]["losses"]]
        for k in WORKERS:
            r = results[(deterministic, k)]
            diff = max(abs(a - b) for a, b in zip(base, (loss for _, loss in r["losses"])))
            lines.append("| %s | %d | %s | %s%% | %.3g |" % (
                "deterministic" if deterministic else "default", k, ", ".join(r["fingerprints"]),
                r["accuracy"], diff))
    same = len({tuple(results[(True, k)]["fingerprints"]) for k in WORKERS}) == 1 and all(
        len(results[(True, k)]["fingerprints"]) == 1 for k in WORKERS)
    lines += ["", "Deterministic fingerprints identical across K: **%s**." % ("yes" if same else "NO")]
    with open(os.path.join(HERE, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
