#!/usr/bin/python3
"""Reproducibility report: the same job spec on K = 1, 2, 3, 4 workers.

Trains each selected job with every worker count K, in the default mode and
with `semantic.deterministic: true`, and writes report.md (per job: the
fingerprints, final test accuracy and the largest training-loss difference to
K = 1) and loss_<job>.png (two panels, default and deterministic, the K runs
overlaid) into the output directory, by default next to this script. Only
`--workers` changes between the runs of a job.

Jobs (--jobs, default both):

    convnet  ConvNet with batch norm and dropout on Fashion-MNIST (the job of
             the former docs/reproducibility/make_report.py)
    bert     BERT-tiny encoder on fortunes-langid (language identification)

Both use global batch 96 as N = 12 vnodes, a cosine schedule with 10 warmup
steps and one intra-op thread per worker. The full report (16 runs of 120
steps, one after another; about 10 minutes on 2 cores):

    docs/experiments/reproducibility/make_report.py

A smoke test (6 steps, K = 1, 2), written elsewhere so that it never
overwrites the committed report:

    docs/experiments/reproducibility/make_report.py --quick --out /tmp/repro

Exit status: 0 when every job's deterministic runs share one fingerprint,
1 when they do not, 2 on a usage error or a failed training run. Metrics
files live in a temporary directory and are removed afterwards.
"""
import argparse
import datetime
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from report_common import check_out_and_train, command_line, revision  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
WORKERS = [1, 2, 3, 4]
QUICK_WORKERS = [1, 2]
QUICK_STEPS = 6
STYLES = ["-", "--", ":", "-."]

# The semantic part of each job; resources.threads is part of the job too
# because the deterministic contract holds for equal thread counts.
JOBS = {
    "convnet": {
        "title": "ConvNet + batch norm + dropout on Fashion-MNIST",
        "describe": "`convnet` with channels [16, 32], hidden 64, dropout "
                    "0.25 and batch norm on Fashion-MNIST; SGD with Nesterov "
                    "momentum, lr 0.05 (the defaults)",
        "sets": [
            "semantic.model.options={channels: [16, 32], hidden: 64, "
            "dropout: 0.25, batch_norm: true}",
            "semantic.global_batch=96",
            "semantic.virtual_nodes=12",
            "semantic.schedule={name: cosine, warmup_steps: 10}",
            "resources.threads=1",
        ],
    },
    "bert": {
        "title": "BERT-tiny on fortunes-langid",
        "describe": "`bert` preset tiny (2 layers, 128 wide, 2 heads, "
                    "dropout 0.1) on `fortunes-langid` with max_length 48; "
                    "AdamW lr 0.001",
        "sets": [
            "semantic.model={name: bert, options: {preset: tiny}}",
            "semantic.data={name: fortunes-langid, "
            "options: {max_length: 48}}",
            "semantic.global_batch=96",
            "semantic.virtual_nodes=12",
            "semantic.optimizer={name: adamw, lr: 0.001}",
            "semantic.schedule={name: cosine, warmup_steps: 10}",
            "resources.threads=1",
        ],
    },
}

# Output settings shared by every run: a loss record per step, and only the
# final evaluation (output keys never change the trajectory).
OUTPUT_SETS = [
    "output.logging.every_steps=1",
    "output.logging.progress=lines",
    "output.evaluation.every_epochs=0",
]


class RunError(Exception):
    """A training run failed; ends the script with exit status 2."""


def job_args(job, steps):
    sets = JOBS[job]["sets"] + [
        "semantic.epochs=null", f"semantic.steps={steps}"] + OUTPUT_SETS
    return [arg for value in sets for arg in ("--set", value)]


def read_metrics(path):
    """Per-step training losses of a metrics file, {step: loss or nan},
    and the training seconds (sum of the per-step wall times)."""
    losses, seconds = {}, 0.0
    with open(path) as f:
        for line in f:
            # The engine writes a non-finite loss as null (docs/job-spec.md).
            record = json.loads(line)
            if record.get("event") == "step":
                loss = record["loss"]
                losses[record["step"]] = math.nan if loss is None else loss
                seconds += sum(record.get(key, 0.0) for key in (
                    "compute_ms", "sync_ms", "update_ms")) / 1e3
    return losses, seconds


def run(train, job, workers, deterministic, steps, workdir):
    mode = "det" if deterministic else "default"
    metrics = os.path.join(workdir, f"{job}-k{workers}-{mode}.jsonl")
    cmd = [train, *job_args(job, steps), "--workers", str(workers),
           "--set", "semantic.deterministic="
           + ("true" if deterministic else "false"),
           "--set", f"output.logging.metrics={metrics}"]
    print("$", shlex.join(cmd), flush=True)
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - start
    text = out.stdout + out.stderr
    if out.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise RunError(f"exit code {out.returncode}: {shlex.join(cmd)}\n"
                       f"{tail}")
    fingerprints = sorted(set(re.findall(r"fingerprint ([0-9a-f]{16})",
                                         text)))
    accuracy = re.findall(r"test accuracy ([0-9.]+)%", text)
    losses, train_seconds = read_metrics(metrics)
    result = {"fingerprints": fingerprints,
              "losses": losses,
              "accuracy": accuracy[-1] if accuracy else None,
              "seconds": seconds}
    print(f"  {seconds:.1f} s ({train_seconds:.1f} s in "
          f"{len(losses)} steps), fingerprint {', '.join(fingerprints)}, "
          f"test accuracy {result['accuracy']}%", flush=True)
    return result


def max_loss_difference(base, other):
    """Largest |loss difference| over the steps both runs logged."""
    steps = sorted(set(base) & set(other))
    if not steps or set(base) != set(other):
        return math.nan
    return max(abs(base[s] - other[s]) for s in steps)


def plot_job(job, results, workers, path):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, deterministic in zip(axes, (False, True)):
        for k, style in zip(workers, STYLES * len(workers)):
            losses = results[(deterministic, k)]["losses"]
            steps = sorted(losses)
            ax.plot(steps, [losses[s] for s in steps], style,
                    label=f"K = {k} worker{'s' if k > 1 else ''}",
                    linewidth=1.2)
        ax.set_title("deterministic: "
                     + ("true" if deterministic else "false"))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("training loss (global batch mean)")
    fig.suptitle(f"Same job spec ({JOBS[job]['title']}, N = 12 vnodes) "
                 f"on {workers[0]}-{workers[-1]} workers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def job_section(job, results, workers, steps, plot_name):
    """Markdown lines of one job's section; returns (lines, identical)."""
    lines = [f"## {JOBS[job]['title']}", "",
             f"{JOBS[job]['describe']}; global batch 96 as 12 vnodes of 8, "
             f"cosine schedule with 10 warmup steps, {steps} steps, "
             "`resources.threads: 1` per worker.", "",
             f"![{job} loss curves]({plot_name})", "",
             "| mode | K | fingerprint (every rank) | test accuracy "
             "| max abs loss difference to K = 1 | wall s |",
             "|---|---:|---|---:|---:|---:|"]
    for deterministic in (False, True):
        base = results[(deterministic, workers[0])]["losses"]
        for k in workers:
            r = results[(deterministic, k)]
            diff = max_loss_difference(base, r["losses"])
            accuracy = ("-" if r["accuracy"] is None
                        else f"{float(r['accuracy']):.2f}%")
            lines.append("| %s | %d | %s | %s | %.3g | %.0f |" % (
                "deterministic" if deterministic else "default", k,
                ", ".join(f"`{f}`" for f in r["fingerprints"]) or "-",
                accuracy, diff, r["seconds"]))
    det = [tuple(results[(True, k)]["fingerprints"]) for k in workers]
    identical = len(set(det)) == 1 and len(det[0]) == 1
    lines += ["", "Deterministic fingerprints identical across K = %s: "
              "**%s**." % (", ".join(map(str, workers)),
                           "yes" if identical else "NO"), ""]
    return lines, identical


def parse_list(text, choices=None, convert=str):
    values = [convert(v.strip()) for v in text.split(",") if v.strip()]
    if not values or (choices and any(v not in choices for v in values)):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(choices)}"
            if choices else "expected a comma-separated list")
    return values


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__[__doc__.index("Jobs"):])
    parser.add_argument("--train",
                        default=os.path.join(ROOT, "build", "vflow-train"),
                        help="the vflow-train binary (default: %(default)s)")
    parser.add_argument("--jobs", default=list(JOBS),
                        type=lambda t: parse_list(t, list(JOBS)),
                        help="comma-separated jobs to run (default: "
                             "convnet,bert)")
    parser.add_argument("--steps", type=int,
                        help=f"optimizer steps per run (default 120; "
                             f"{QUICK_STEPS} with --quick)")
    parser.add_argument("--workers", type=lambda t: parse_list(t, None, int),
                        help="comma-separated worker counts, the first is "
                             "the reference (default 1,2,3,4; 1,2 with "
                             "--quick)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 6 steps, K = 1, 2; needs --out "
                             "outside this directory")
    parser.add_argument("--out", default=HERE,
                        help="directory for report.md and the plots "
                             "(default: next to this script)")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else 120
    if args.workers is None:
        args.workers = QUICK_WORKERS if args.quick else WORKERS
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if any(k < 1 or k > 12 for k in args.workers):
        parser.error("--workers: each K must be in 1..12 (N = 12 vnodes)")
    check_out_and_train(parser, args, HERE)
    return args


def main(argv):
    args = parse_args(argv)
    command = command_line()
    started = datetime.datetime.now().astimezone()
    os.makedirs(args.out, exist_ok=True)

    results = {}
    with tempfile.TemporaryDirectory(prefix="vflow-repro-") as workdir:
        for job in args.jobs:
            for deterministic in (False, True):
                for k in args.workers:
                    results[(job, deterministic, k)] = run(
                        args.train, job, k, deterministic, args.steps,
                        workdir)

    commit = revision()
    lines = ["# Reproducibility report", "",
             f"Produced by `{command}` on {started:%Y-%m-%d %H:%M %Z} "
             f"({os.cpu_count()} cores"
             + (f", commit `{commit}`" if commit else "") + ").", "",
             "Each job is trained with every worker count K "
             "(`vflow-train --workers K`); nothing else changes. In the "
             "default mode the gradient reduction and LibTorch's kernels may "
             "add floating-point rounding in a different order for different "
             "K, so the trajectories differ slightly; with "
             "`semantic.deterministic: true` (deterministic algorithms and an "
             "exact fixed-point gradient reduction) the final model state "
             "must be bitwise the same for every K (docs/job-spec.md).", ""]
    all_identical = True
    for job in args.jobs:
        per_job = {(d, k): results[(job, d, k)]
                   for d in (False, True) for k in args.workers}
        plot_name = f"loss_{job}.png"
        plot_job(job, per_job, args.workers,
                 os.path.join(args.out, plot_name))
        section, identical = job_section(job, per_job, args.workers,
                                         args.steps, plot_name)
        lines += section
        all_identical = all_identical and identical
    lines += ["Fingerprint: FNV-1a over the name, dtype, shape and bytes of "
              "every parameter and buffer of the final model, printed by "
              "each rank. Test accuracy: the evaluation on the test split "
              "after the last step. Loss difference: the largest absolute "
              "difference, over all steps, of the logged training loss to "
              f"the K = {args.workers[0]} run of the same mode (the metrics "
              "files hold 6 significant digits, so differences below about "
              "1e-5 do not show). Wall s: the whole run, start-up and "
              "evaluation included."]
    report = os.path.join(args.out, "report.md")
    with open(report, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {report}")
    return 0 if all_identical else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except RunError as error:
        sys.stderr.write(f"make_report.py: error: a training run failed, "
                         f"{error}\n")
        sys.exit(2)
