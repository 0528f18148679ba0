"""Aggregates vflow-sched outputs (see run_experiments.sh) into CSV tables, markdown and PNGs."""
import csv
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RUNS, DOCS = sys.argv[1], sys.argv[2]


def summary(path):
    with open(os.path.join(path, "summary.json")) as f:
        return {s["policy"]: s for s in json.load(f)}


def jobs(path, policy, window=None):
    with open(os.path.join(path, f"jobs_{policy}.csv")) as f:
        rows = list(csv.DictReader(f))
    if window:
        rows = [r for r in rows if window[0] <= int(r["id"]) < window[1]]
    return [float(r["jct_s"]) for r in rows]


def timeline(path, policy):
    with open(os.path.join(path, f"timeline_{policy}.csv")) as f:
        rows = list(csv.DictReader(f))
    return [float(r["time_s"]) for r in rows], [int(r["allocated"]) / int(r["total"]) for r in rows]


def cdf(ax, values, label):
    values = sorted(values)
    ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=label)


def paper():
    rows = []
    for f in ("f1", "f2"):
        for rate in (6, 12, 18, 24):
            seeds = [summary(os.path.join(RUNS, "paper", f, f"r{rate}", f"s{s}")) for s in range(1, 11)]
            for policy in seeds[0]:
                rows.append({
                    "max_workers": "demand" if f == "f1" else "2x demand", "rate_per_h": rate,
                    "policy": policy,
                    "mean_jct_s": statistics.mean(s[policy]["jct"]["mean_s"] for s in seeds),
                    "median_jct_s": statistics.mean(s[policy]["jct"]["median_s"] for s in seeds),
                    "p99_jct_s": statistics.mean(s[policy]["jct"]["p99_s"] for s in seeds),
                    "makespan_s": statistics.mean(s[policy]["makespan_s"] for s in seeds),
                    "utilization": statistics.mean(s[policy]["utilization"] for s in seeds),
                    "queueing_s": statistics.mean(s[policy]["mean_queueing_s"] for s in seeds),
                    "resizes": statistics.mean(s[policy]["resizes"] for s in seeds),
                })
    write_csv("paper_results.csv", rows)
    print("### paper: WFS elastic vs priority (10 seeds each)")
    print("| max workers | rate (jobs/h) | mean JCT WFS / priority (s) | dJCT | util WFS / priority | dUtil | best policy (mean JCT) |")
    print("|---|---|---|---|---|---|---|")
    for f in ("demand", "2x demand"):
        for rate in (6, 12, 18, 24):
            by = {r["policy"]: r for r in rows if r["max_workers"] == f and r["rate_per_h"] == rate}
            w, p = by["wfs-elastic"], by["priority"]
            best = min(by.values(), key=lambda r: r["mean_jct_s"])
            print(f"| {f} | {rate} | {w['mean_jct_s']:.0f} / {p['mean_jct_s']:.0f} | "
                  f"{100 * (w['mean_jct_s'] / p['mean_jct_s'] - 1):+.1f}% | "
                  f"{w['utilization']:.3f} / {p['utilization']:.3f} | "
                  f"{100 * (w['utilization'] / p['utilization'] - 1):+.1f}% | "
                  f"{best['policy']} {best['mean_jct_s']:.0f} |")
    print()
    print_policy_table([r for r in rows if r["max_workers"] == "demand" and r["rate_per_h"] == 12],
                       "paper, rate 12/h, max workers = demand, mean of 10 seeds")
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in ("marginal", "wfs-elastic", "wfs-srtf", "priority", "srtf", "fifo", "las"):
        values = []
        for s in range(1, 11):
            values += jobs(os.path.join(RUNS, "paper", "f1", "r12", f"s{s}"), policy)
        cdf(ax, values, policy)
    finish(ax, fig, "JCT (s)", "paper-style workload, 12 jobs/h, 8 GPUs, 10 seeds", "paper_jct_cdf.png")
    fig, ax = plt.subplots(figsize=(6, 3))
    for policy in ("wfs-elastic", "priority"):
        t, u = timeline(os.path.join(RUNS, "paper", "f1", "r12", "s1"), policy)
        ax.step(t, u, where="post", label=policy)
    finish(ax, fig, "time (s)", "devices allocated, 12 jobs/h, seed 1", "paper_utilization.png",
           ylabel="fraction allocated", log=False)


def gavel():
    rows = []
    for rate in (1, 1.5, 2):
        for policy, s in summary(os.path.join(RUNS, "gavel", f"r{rate}")).items():
            rows.append({"rate_per_h": rate, "policy": policy, "mean_jct_s": s["jct"]["mean_s"],
                         "median_jct_s": s["jct"]["median_s"], "p99_jct_s": s["jct"]["p99_s"],
                         "makespan_s": s["makespan_s"], "utilization": s["utilization"],
                         "queueing_s": s["mean_queueing_s"], "resizes": s["resizes"],
                         "migrations": s["migrations"], "preemptions": s["preemptions"]})
    write_csv("gavel_results.csv", rows)
    for rate in (1, 1.5, 2):
        print_policy_table([r for r in rows if r["rate_per_h"] == rate],
                           f"Gavel shape, 36 V100 + 36 P100 + 36 K80, {rate} jobs/h, jobs 4000-4999")
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in ("marginal", "wfs-elastic", "wfs-srtf", "priority", "srtf", "las", "gavel", "fifo"):
        cdf(ax, jobs(os.path.join(RUNS, "gavel", "r1.5"), policy, (4000, 5000)), policy)
    finish(ax, fig, "JCT (s)", "Gavel-shape workload, 1.5 jobs/h, 108 GPUs, jobs 4000-4999",
           "gavel_jct_cdf.png")
    fig, ax = plt.subplots(figsize=(6, 3))
    for policy in ("wfs-elastic", "priority", "gavel"):
        t, u = timeline(os.path.join(RUNS, "gavel", "r1.5"), policy)
        ax.step([x / 3600 for x in t], u, where="post", label=policy, linewidth=0.6)
    finish(ax, fig, "time (h)", "devices allocated, 1.5 jobs/h", "gavel_utilization.png",
           ylabel="fraction allocated", log=False)


NON_ELASTIC = ("fifo", "priority", "srtf", "las", "gavel")


def against_baselines():
    """The marginal policy against the best non-elastic policy, setting by setting: the mean
    JCT over seeds, and the worst single seed against the best non-elastic policy of that seed."""
    settings = []
    for f in ("f1", "f2"):
        for rate in (6, 12, 18, 24):
            settings.append((f"paper, {rate} jobs/h, max workers {'= demand' if f == 'f1' else '2x demand'}",
                             [summary(os.path.join(RUNS, "paper", f, f"r{rate}", f"s{s}")) for s in range(1, 11)]))
    for rate in (1, 1.5, 2):
        settings.append((f"Gavel shape, {rate} jobs/h",
                         [summary(os.path.join(RUNS, "gavel-seeds", f"r{rate}", f"s{s}")) for s in range(1, 11)]))
    for name in sorted(os.listdir(os.path.join(RUNS, "philly"))):
        jobs_, devices, load = name.split("-")
        settings.append((f"Philly style, {jobs_[1:]} jobs, {devices[1:]} devices, load {load[1:]}",
                         [summary(os.path.join(RUNS, "philly", name, f"s{s}")) for s in range(1, 11)]))
    rows = []
    print("### marginal against the best non-elastic policy (10 seeds each)")
    print("| setting | marginal mean JCT (s) | best non-elastic, mean JCT (s) | marginal vs it | worst seed | vs priority |")
    print("|---|---|---|---|---|---|")
    for label, seeds in settings:
        mean = {p: statistics.mean(s[p]["jct"]["mean_s"] for s in seeds) for p in seeds[0]}
        best = min((p for p in NON_ELASTIC if p in mean), key=lambda p: mean[p])
        worst = max(s["marginal"]["jct"]["mean_s"] / min(s[p]["jct"]["mean_s"] for p in NON_ELASTIC if p in s)
                    for s in seeds)
        rows.append({"setting": label, "marginal_mean_jct_s": mean["marginal"], "best_non_elastic": best,
                     "best_mean_jct_s": mean[best], "change": mean["marginal"] / mean[best] - 1,
                     "worst_seed_change": worst - 1, "change_vs_priority": mean["marginal"] / mean["priority"] - 1})
        print(f"| {label} | {mean['marginal']:.0f} | {best} {mean[best]:.0f} | "
              f"{100 * (mean['marginal'] / mean[best] - 1):+.1f}% | {100 * (worst - 1):+.1f}% | "
              f"{100 * (mean['marginal'] / mean['priority'] - 1):+.1f}% |")
    print()
    write_csv("marginal_results.csv", rows)


def print_policy_table(rows, title):
    base = next(r for r in rows if r["policy"] == "priority")
    print(f"### {title}")
    print("| policy | mean JCT (s) | median | p99 | makespan | util | queueing | resizes | dJCT vs priority |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['mean_jct_s']:.0f} | {r['median_jct_s']:.0f} | {r['p99_jct_s']:.0f} | "
              f"{r['makespan_s']:.0f} | {r['utilization']:.3f} | {r['queueing_s']:.0f} | "
              f"{r['resizes']:.0f} | {100 * (r['mean_jct_s'] / base['mean_jct_s'] - 1):+.1f}% |")
    print()


def write_csv(name, rows):
    with open(os.path.join(DOCS, name), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})


def finish(ax, fig, xlabel, title, name, ylabel="fraction of jobs", log=True):
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, name), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    paper()
    gavel()
    against_baselines()
