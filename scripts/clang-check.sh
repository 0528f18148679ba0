#!/usr/bin/env bash
# Every C++ source of the project compiles with clang as well as with GCC: clang-14 parses
# each translation unit of a clang configuration (library, programs, tests, benchmarks, the
# NCCL backend where CUDA's headers are present) with -fsyntax-only, after building the
# precompiled headers once, so that the check costs a few minutes, not a second build.
#   scripts/clang-check.sh        configure in build-clang/ (VFLOW_CLANG_BUILD_DIR) and check
# Prints each failing source's errors and exits 1 if any source fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${VFLOW_CLANG_BUILD_DIR:-$ROOT/build-clang}"
JOBS="${VFLOW_JOBS:-$(nproc)}"

log() { printf '\033[1m[clang]\033[0m %s\n' "$*" >&2; }

"$ROOT/scripts/dev.sh" deps clang-14 libomp-14-dev

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
# The precompiled headers (and the layering check they depend on), compiled for real.
mapfile -t PCH < <(ninja -C "$BUILD" -t targets all | sed -n 's/^\(.*cmake_pch\.hxx\.pch\): .*/\1/p')
log "building ${#PCH[@]} precompiled header(s) in $BUILD"
ninja -C "$BUILD" -j "$JOBS" "${PCH[@]}" >/dev/null

exec /usr/bin/python3 - "$BUILD" "$JOBS" <<'PY'
import concurrent.futures, json, shlex, subprocess, sys, time

build, jobs = sys.argv[1], int(sys.argv[2])
entries = [e for e in json.load(open(f"{build}/compile_commands.json"))
           if not e["file"].endswith("cmake_pch.hxx.cxx")]

def check(entry):
    args = shlex.split(entry["command"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        out.append("-fsyntax-only" if a == "-c" else a)
    r = subprocess.run(out, cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], r.returncode, r.stderr

start = time.time()
failed = []
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    for path, code, err in pool.map(check, entries):
        if code != 0:
            failed.append(path)
            sys.stderr.write(err)
print(f"[clang] {len(entries) - len(failed)} of {len(entries)} sources compile with clang++-14 "
      f"({time.time() - start:.0f} s)")
for path in failed:
    print(f"[clang] fails: {path}")
sys.exit(1 if failed else 0)
PY
