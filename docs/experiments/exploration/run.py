#!/usr/bin/python3
"""Exploring batch sizes that do not fit in memory, through more vnodes.

One worker with a memory cap (`resources.memory_limit_mb`: the worker's data
memory is capped with RLIMIT_DATA, and a step that needs more ends the job
with "out of memory" and exit code 6) trains the default ConvNet job on
Fashion-MNIST (`resources.threads: 2`). A global batch B processed at once
(N = 1 vnode) needs activation memory for all B examples; split into
N = B / 128 vnodes it needs memory for 128 examples at a time, whatever B.

1. Probe: B = b as N = 1 vnode for 2 steps under the cap, for each b of
   --probe and --batches; records which fail with "out of memory".
2. For each B of --batches: N = B / --vnode-size under the cap, trained for
   --epochs with the linear scaling rule: SGD with Nesterov momentum 0.9,
   lr = 0.05 * B / 256, cosine schedule whose warmup covers as many examples
   as 50 steps at B = 256 (at least 5 steps).

Writes report.md (the cap, the probe table, a table per B: N, vnode size,
whether N = 1 fits and its error, final test accuracy, time, fingerprint)
and curves.png (training loss and test accuracy of the runs against epochs)
into the output directory, by default next to this script. The full run
(about 20 minutes on 2 cores):

    docs/experiments/exploration/run.py

A smoke test (4 steps, B = 256, 1024), written elsewhere so that it never
overwrites the committed report:

    docs/experiments/exploration/run.py --quick --out /tmp/exploration-quick

Cap modes (--cap-mode): `engine` passes resources.memory_limit_mb to
vflow-train; `rlimit` sets RLIMIT_DATA on the vflow-train process from this
script (for a vflow-train that does not know the key yet: the same limit, but
the engine then fails with its allocator's message and exit code 1); `none`
(or --no-cap) applies no cap and only reports the sampled peak data memory;
`auto` (default) is `engine` when `vflow-train --check` accepts the key,
else `rlimit`.

A run that makes no progress (no output, no metrics) for --probe-stall or
--train-stall seconds is killed and counted as hung: under RLIMIT_DATA,
Debian 12's OpenBLAS retries a failed buffer allocation forever instead of
failing (OpenMathLib/OpenBLAS#5289), so a batch that does not fit may hang
rather than end with "out of memory".

Exit status: 0 when every vnode run finished, 1 when one failed, 2 on a
usage error or an unexpected failure (a probe failing with anything but out
of memory).
"""
import argparse
import datetime
import json
import math
import os
import re
import resource
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
MIB = 1 << 20
OOM_EXIT_CODE = 6
OOM_TEXT = re.compile(r"out of memory|can't allocate memory|bad_alloc",
                      re.IGNORECASE)
BASE_LR = 0.05
BASE_BATCH = 256
BASE_WARMUP_STEPS = 50
MIN_WARMUP_STEPS = 5
SAMPLE_S = 0.05


class ExperimentError(Exception):
    """An unexpected failure; ends the script with exit status 2."""


def warmup_steps(batch):
    """Warmup over as many examples as 50 steps at B = 256, >= 5 steps."""
    return max(MIN_WARMUP_STEPS,
               math.ceil(BASE_WARMUP_STEPS * BASE_BATCH / batch))


def cap_sets(args):
    if args.cap_mode == "engine":
        return ["resources.memory_limit_mb=%d" % args.cap_mb]
    return []


def data_memory_mib(pid):
    """The process's current VmData (what RLIMIT_DATA limits), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


def run_train(args, sets, log_path, stall_s, watch=()):
    """Runs vflow-train with --set `sets` (one process, no --workers).

    Kills the run (SIGKILL: a worker stuck inside an allocation does not
    reach the step boundary where SIGTERM is handled) when neither its
    output nor the files in `watch` grew for `stall_s` seconds. In rlimit
    mode the cap is set on the child before it starts. Returns a dict:
    code (exit code, negative for a signal), text (the output), seconds,
    peak (sampled peak VmData in MiB), hung (killed for a stall).
    """
    cmd = [args.train] + [a for s in sets for a in ("--set", s)]
    print("$", shlex.join(cmd), flush=True)
    limit = args.cap_mb * MIB if args.cap_mode == "rlimit" else None

    def set_limit():
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    def progress():
        return sum(os.path.getsize(p) for p in (log_path, *watch)
                   if os.path.exists(p))

    peak, hung = 0.0, False
    start = last_change = time.monotonic()
    last_size = 0
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=set_limit if limit else None)
        while process.poll() is None:
            peak = max(peak, data_memory_mib(process.pid) or 0.0)
            now, size = time.monotonic(), progress()
            if size != last_size:
                last_size, last_change = size, now
            elif now - last_change > stall_s:
                process.kill()
                process.wait()
                hung = True
                break
            time.sleep(SAMPLE_S)
    seconds = time.monotonic() - start
    with open(log_path, errors="replace") as f:
        text = f.read()
    if hung:
        text += (f"\nhung: no output for {stall_s:.0f} s, killed after "
                 f"{seconds:.0f} s\n")
    return {"code": process.returncode, "text": text, "seconds": seconds,
            "peak": peak, "hung": hung}


def error_line(text):
    """The line that says why a run failed (without C++ backtraces)."""
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("frame #")]
    for line in lines:
        if OOM_TEXT.search(line) or line.startswith("hung: "):
            return line
    errors = [line for line in lines if line.startswith("error")]
    return errors[-1] if errors else (lines[-1] if lines else "")


def is_out_of_memory(result, mode):
    """Whether a failed run ran out of memory under the cap. A run that
    hung under a cap counts: Debian 12's OpenBLAS (0.3.21) retries a failed
    buffer allocation forever (OpenMathLib/OpenBLAS#5289)."""
    code, text = result["code"], result["text"]
    if code == 0 or mode == "none":
        return False
    if result["hung"]:
        return True
    if mode == "engine":
        return code == OOM_EXIT_CODE
    return code == OOM_EXIT_CODE or bool(OOM_TEXT.search(text))


def common_sets(args):
    return ["resources.threads=2", "output.logging.progress=lines"] \
        + cap_sets(args)


def probe(args, batch, workdir):
    """B = batch as one vnode for --probe-steps steps under the cap."""
    sets = [f"semantic.global_batch={batch}", "semantic.virtual_nodes=1",
            "semantic.epochs=null", f"semantic.steps={args.probe_steps}",
            "output.evaluation.enabled=false"] + common_sets(args)
    run = run_train(args, sets, os.path.join(workdir, f"probe-{batch}.log"),
                    args.probe_stall)
    code, peak = run["code"], run["peak"]
    if code != 0 and not is_out_of_memory(run, args.cap_mode):
        raise ExperimentError(f"probe B = {batch} failed with exit code "
                              f"{code}: {error_line(run['text'])}")
    fits = code == 0
    if args.cap_mode == "none":
        fits = peak < args.cap_mb
    result = {"batch": batch, "code": code, "fits": fits, "peak": peak,
              "hung": run["hung"],
              "error": error_line(run["text"]) if code != 0 else "",
              "seconds": run["seconds"]}
    print(f"  exit {code}, {run['seconds']:.1f} s, peak VmData {peak:.0f} "
          "MiB" + (f": {result['error']}" if code else ""), flush=True)
    return result


def read_metrics(path):
    """Step records {step: loss}, eval records [(step, accuracy)], and
    the training seconds (sum of per-step compute + sync + update)."""
    losses, evals, seconds = {}, [], 0.0
    if not os.path.exists(path):
        return losses, evals, seconds
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a last line cut short by a failure
            if record.get("event") == "step":
                loss = record["loss"]
                losses[record["step"]] = math.nan if loss is None else loss
                seconds += sum(record.get(key, 0.0) for key in (
                    "compute_ms", "sync_ms", "update_ms")) / 1e3
            elif record.get("event") == "eval":
                evals.append((record["step"], record["accuracy"]))
    return losses, evals, seconds


def train(args, batch, workdir, metrics_dir):
    """B = batch as B / vnode-size vnodes, with the linear scaling rule."""
    vnodes = batch // args.vnode_size
    lr = BASE_LR * batch / BASE_BATCH
    warmup = warmup_steps(batch)
    metrics = os.path.join(metrics_dir, f"b{batch}-n{vnodes}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)  # the engine appends
    length = (["semantic.epochs=null", f"semantic.steps={args.steps}"]
              if args.steps else [f"semantic.epochs={args.epochs}"])
    sets = [f"semantic.global_batch={batch}",
            f"semantic.virtual_nodes={vnodes}",
            f"semantic.optimizer={{name: sgd, lr: {lr:g}, momentum: 0.9, "
            "nesterov: true}",
            f"semantic.schedule={{name: cosine, warmup_steps: {warmup}}}",
            *length,
            # Evaluation batches of one vnode's size stay within the cap.
            f"output.evaluation.batch={args.vnode_size}",
            "output.logging.every_steps=1",
            f"output.logging.metrics={metrics}"] + common_sets(args)
    run = run_train(args, sets, os.path.join(workdir, f"train-{batch}.log"),
                    args.train_stall, watch=(metrics,))
    code, text, seconds, peak = (run["code"], run["text"], run["seconds"],
                                 run["peak"])
    losses, evals, train_seconds = read_metrics(metrics)
    accuracy = re.findall(r"test accuracy ([0-9.]+)% after (\d+) steps",
                          text)
    fingerprint = re.findall(r"fingerprint ([0-9a-f]{16})", text)
    per_epoch = re.search(r"\((\d+) per epoch\)", text)
    result = {
        "batch": batch, "vnodes": vnodes, "lr": lr, "warmup": warmup,
        "code": code, "error": error_line(text) if code else "",
        "accuracy": accuracy[-1][0] if accuracy else None,
        "steps": int(accuracy[-1][1]) if accuracy else max(losses,
                                                           default=0),
        "fingerprint": fingerprint[-1] if fingerprint else None,
        "steps_per_epoch": int(per_epoch.group(1)) if per_epoch else None,
        "seconds": seconds, "train_seconds": train_seconds, "peak": peak,
        "losses": losses, "evals": evals, "hung": run["hung"],
    }
    print(f"  exit {code}, {seconds:.1f} s ({train_seconds:.1f} s in "
          f"{len(losses)} steps), peak VmData {peak:.0f} MiB, test accuracy "
          f"{result['accuracy']}%"
          + (f": {result['error']}" if code else ""), flush=True)
    return result


def plot(runs, path):
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        if not run["losses"] or not run["steps_per_epoch"]:
            continue
        label = f"B = {run['batch']} (N = {run['vnodes']})"
        per_epoch = run["steps_per_epoch"]
        steps = sorted(run["losses"])
        line, = left.plot([s / per_epoch for s in steps],
                          [run["losses"][s] for s in steps],
                          linewidth=1, label=label)
        if run["evals"]:
            right.plot([s / per_epoch for s, _ in run["evals"]],
                       [100 * a for _, a in run["evals"]], marker="o",
                       color=line.get_color(), label=label)
    left.set_ylabel("training loss (global batch mean)")
    right.set_ylabel("test accuracy (%)")
    for ax, heading in ((left, "training loss"),
                        (right, "test accuracy")):
        ax.set_title(heading)
        ax.set_xlabel("epochs (optimizer steps / steps per epoch)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("ConvNet on Fashion-MNIST, one worker under a memory cap: "
                 "global batch B as vnodes of 128, linear lr scaling")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cell(text):
    return str(text).replace("|", "\\|") if text else "-"


def fits_cell(result, mode):
    if result.get("hung"):
        return "no (hung)"
    if mode == "none":
        return "yes*" if result["fits"] else "no*"
    return "yes" if result["fits"] else "no"


def write_report(args, path, command, started, probes, runs, plot_name):
    mode_text = {
        "engine": f"`resources.memory_limit_mb: {args.cap_mb}` (the engine "
                  "caps the worker's data memory with RLIMIT_DATA; a step "
                  "that needs more fails with \"out of memory\" and exit "
                  f"code {OOM_EXIT_CODE})",
        "rlimit": f"RLIMIT_DATA = {args.cap_mb} MiB set by this script on "
                  "the vflow-train process (this vflow-train does not know "
                  "`resources.memory_limit_mb` yet; an allocation beyond the "
                  "cap fails in LibTorch's allocator)",
        "none": f"**none** (--no-cap): nothing was capped; \"fits\" "
                f"(marked *) compares the sampled peak data memory with "
                f"{args.cap_mb} MiB",
    }[args.cap_mode]
    commit = revision()
    length = (f"{args.steps} steps" if args.steps
              else f"{args.epochs} epochs")
    lines = [
        "# Exploring batch sizes that do not fit in memory", "",
        f"Produced by `{command}` on {started:%Y-%m-%d %H:%M %Z} "
        f"({os.cpu_count()} cores"
        + (f", commit `{commit}`" if commit else "") + ").", "",
        "One worker (`resources.threads: 2`) trains the built-in default "
        "job, a ConvNet with batch norm and dropout on Fashion-MNIST, under "
        f"a memory cap: {mode_text}. Processed as one vnode, a global batch "
        "B needs activation memory for all B examples at once; as "
        f"N = B / {args.vnode_size} vnodes, the worker runs the vnodes one "
        "after another into one gradient buffer and needs memory for "
        f"{args.vnode_size} examples at a time, so the same global batch "
        "(the same optimizer step) fits.", "",
        "## Which single-vnode batches fit", "",
        f"B = b as N = 1 vnode, {args.probe_steps} steps, no evaluation.", "",
        "| b | fits under the cap | exit code | error | peak VmData (MiB) "
        "| wall s |",
        "|---:|---|---:|---|---:|---:|"]
    for p in probes:
        lines.append("| %d | %s | %d | %s | %.0f | %.0f |" % (
            p["batch"], fits_cell(p, args.cap_mode), p["code"],
            cell(p["error"]), p["peak"], p["seconds"]))
    lines += [
        "", "## Training through vnodes", "",
        f"Each B trained as N = B / {args.vnode_size} vnodes for {length}: "
        f"SGD with Nesterov momentum 0.9, lr = {BASE_LR} × B / {BASE_BATCH} "
        "(linear scaling rule), cosine schedule with a linear warmup over as "
        f"many examples as {BASE_WARMUP_STEPS} steps at B = {BASE_BATCH} "
        f"(at least {MIN_WARMUP_STEPS} steps), weight decay 0.0005, seed 1; "
        f"evaluation batches of {args.vnode_size}.", "",
        f"![training loss and test accuracy]({plot_name})", "",
        "| B | N | vnode size | lr | warmup steps | fits at N = 1? "
        "| N = 1 error | steps | final test accuracy | wall s | training s "
        "| peak VmData (MiB) | fingerprint |",
        "|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---|"]
    by_batch = {p["batch"]: p for p in probes}
    for r in runs:
        single = by_batch[r["batch"]]
        accuracy = (f"{float(r['accuracy']):.2f}%" if r["code"] == 0 else
                    f"failed (exit {r['code']}): {cell(r['error'])}")
        lines.append(
            "| %d | %d | %d | %g | %d | %s | %s | %d | %s | %.0f | %.0f "
            "| %.0f | %s |" % (
                r["batch"], r["vnodes"], args.vnode_size, r["lr"],
                r["warmup"], fits_cell(single, args.cap_mode),
                cell(single["error"]), r["steps"], accuracy, r["seconds"],
                r["train_seconds"], r["peak"],
                f"`{r['fingerprint']}`" if r["fingerprint"] else "-"))
    lines += [
        "",
        "Peak VmData: the process's data memory (what RLIMIT_DATA counts: "
        "heap and private writable mappings, LibTorch and the loaded data "
        f"set included), sampled every {SAMPLE_S * 1000:.0f} ms, so a lower "
        "bound of the true peak. Wall s: the whole run, start-up and "
        "evaluations included; training s: the sum of the per-step times "
        "(compute, sync, update) from the metrics file."]
    if any(p["hung"] for p in probes) or any(r["hung"] for r in runs):
        lines += [
            "", "Runs marked hung made no progress for "
            f"{args.probe_stall:.0f} s (probes) or {args.train_stall:.0f} s "
            "(vnode runs) and were killed. Debian 12's OpenBLAS (0.3.21) "
            "retries a failed allocation of its GEMM buffer forever instead "
            "of failing (OpenMathLib/OpenBLAS#5289, fixed upstream by PR "
            "#5303); that was the cause when this script was written, seen "
            "with gdb in the B = 1024 probe under RLIMIT_DATA. Which "
            "allocation fails first, LibTorch's (a clean error) or "
            "OpenBLAS's (a hang), depends on the cap."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def engine_knows_cap(train, cap_mb):
    out = subprocess.run([train, "--check", "--set",
                          f"resources.memory_limit_mb={cap_mb}"],
                         capture_output=True, text=True)
    return out.returncode == 0


def int_list(text):
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(
            "expected a comma-separated list of positive integers")
    return values


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__[__doc__.index("Cap modes"):])
    parser.add_argument("--train",
                        default=os.path.join(ROOT, "build", "vflow-train"),
                        help="the vflow-train binary (default: %(default)s)")
    parser.add_argument("--cap-mb", type=int, default=1000,
                        help="memory cap M in MiB (default %(default)s: "
                             "B = 256 as one vnode fits, 512 does not)")
    parser.add_argument("--cap-mode", default="auto",
                        choices=["auto", "engine", "rlimit", "none"],
                        help="how the cap is applied (default: auto)")
    parser.add_argument("--no-cap", action="store_const", const="none",
                        dest="cap_mode", help="same as --cap-mode none")
    parser.add_argument("--batches", type=int_list,
                        help="global batch sizes to train (default "
                             "256,1024,4096; 256,1024 with --quick)")
    parser.add_argument("--probe", type=int_list,
                        help="extra single-vnode batch sizes to probe "
                             "(default 128,512,2048; 128 with --quick)")
    parser.add_argument("--probe-steps", type=int, default=2,
                        help="steps of each probe (default %(default)s)")
    parser.add_argument("--vnode-size", type=int, default=128,
                        help="examples per vnode (default %(default)s)")
    parser.add_argument("--epochs", type=int, default=2,
                        help="epochs of each vnode run (default "
                             "%(default)s)")
    parser.add_argument("--steps", type=int,
                        help="steps of each vnode run instead of --epochs "
                             "(4 with --quick)")
    parser.add_argument("--probe-stall", type=float, default=60,
                        help="kill a probe without output for this many "
                             "seconds (default %(default)s)")
    parser.add_argument("--train-stall", type=float, default=300,
                        help="kill a vnode run without output for this "
                             "many seconds (default %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 4 steps, B = 256, 1024; needs "
                             "--out outside this directory")
    parser.add_argument("--out", default=HERE,
                        help="directory for report.md and curves.png "
                             "(default: next to this script)")
    parser.add_argument("--metrics-dir",
                        help="keep the metrics files and logs here "
                             "(default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.batches is None:
        args.batches = [256, 1024] if args.quick else [256, 1024, 4096]
    if args.probe is None:
        args.probe = [128] if args.quick else [128, 512, 2048]
    if args.steps is None and args.quick:
        args.steps = 4
    if args.cap_mb < 1 or args.probe_steps < 1 or args.epochs < 1 or (
            args.steps is not None and args.steps < 1):
        parser.error("--cap-mb, --probe-steps, --epochs and --steps must "
                     "be positive")
    bad = [b for b in args.batches if b % args.vnode_size]
    if args.vnode_size < 1 or bad:
        parser.error(f"--batches: {bad} not multiples of --vnode-size "
                     f"{args.vnode_size}")
    check_out_and_train(parser, args, HERE)
    return args


def main(argv):
    args = parse_args(argv)
    command = command_line()
    started = datetime.datetime.now().astimezone()
    if args.cap_mode == "auto":
        if engine_knows_cap(args.train, args.cap_mb):
            args.cap_mode = "engine"
        else:
            args.cap_mode = "rlimit"
            print("vflow-train does not know resources.memory_limit_mb: "
                  "the cap is set with RLIMIT_DATA by this script",
                  flush=True)
    elif args.cap_mode == "engine" and not engine_knows_cap(
            args.train, args.cap_mb):
        raise ExperimentError("--cap-mode engine: vflow-train rejects "
                              "resources.memory_limit_mb")
    os.makedirs(args.out, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="vflow-explore-") as workdir:
        metrics_dir = args.metrics_dir or workdir
        os.makedirs(metrics_dir, exist_ok=True)
        logs = args.metrics_dir or workdir
        probes = [probe(args, b, logs)
                  for b in sorted(set(args.probe) | set(args.batches))]
        runs = [train(args, b, logs, metrics_dir) for b in args.batches]

    plot_name = "curves.png"
    plot(runs, os.path.join(args.out, plot_name))
    report = os.path.join(args.out, "report.md")
    lines = write_report(args, report, command, started, probes, runs,
                         plot_name)
    print("\n".join(lines))
    print(f"wrote {report} and {os.path.join(args.out, plot_name)}")
    return 0 if all(r["code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ExperimentError as error:
        sys.stderr.write(f"run.py: error: {error}\n")
        sys.exit(2)
