#!/usr/bin/env python3
"""What one vflow-ctl call costs before it speaks to a store: start-up time and size.

Runs `vflow-ctl --help` (parses its flags, prints, exits: the whole start-up of the
program and of every library it loads) in each build, alternating, and prints per build
the median wall and CPU time with min-max, and the size of the program and of the
libraries it loads (ldd). With one build it measures that one.

Usage: bench/ctl_startup.py [--repeats 21] BUILD_BIN_DIR [OTHER_BUILD_BIN_DIR]
"""
import argparse
import os
import resource
import statistics
import subprocess
import time


def run_once(program):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([program, "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def loaded_bytes(program):
    total = os.path.getsize(program)
    count = 0
    for line in subprocess.run(["ldd", program], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split("=>")
        path = (parts[1] if len(parts) > 1 else parts[0]).split("(")[0].strip()
        if path.startswith("/") and os.path.exists(path):
            total += os.path.getsize(os.path.realpath(path))
            count += 1
    return total, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("builds", nargs="+", help="directories holding vflow-ctl")
    a = ap.parse_args()
    programs = [os.path.join(b, "vflow-ctl") for b in a.builds]
    for p in programs:
        run_once(p)  # warm the page cache
    walls = {p: [] for p in programs}
    cpus = {p: [] for p in programs}
    for _ in range(a.repeats):
        for p in programs:  # alternating, so that drift hits each alike
            wall, cpu = run_once(p)
            walls[p].append(wall)
            cpus[p].append(cpu)
    print("| vflow-ctl of | wall (ms), median (min-max) | CPU (ms), median (min-max) "
          "| program + libraries loaded (MB) | libraries |")
    print("|---|---|---|---|---|")
    for p in programs:
        w, c = walls[p], cpus[p]
        size, count = loaded_bytes(p)
        print(f"| {os.path.dirname(p)} | {1e3 * statistics.median(w):.1f} "
              f"({1e3 * min(w):.1f}-{1e3 * max(w):.1f}) | {1e3 * statistics.median(c):.1f} "
              f"({1e3 * min(c):.1f}-{1e3 * max(c):.1f}) | {size / 1e6:.1f} | {count} |")


if __name__ == "__main__":
    main()
