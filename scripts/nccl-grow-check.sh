#!/usr/bin/env bash
# Compiles the NCCL backend's grow path (ncclCommGrow, NCCL 2.29) where only an older
# NCCL is installed: a copy of the installed nccl.h that says 2.29 and declares
# ncclCommGetUniqueId and ncclCommGrow as NCCL documents them stands in front of the
# real one, and the backend's source is compiled with the build's own flags (no object
# is linked or kept). It checks that the code compiles cleanly, not that it runs.
#
#   scripts/nccl-grow-check.sh [BUILD_DIR]   # default: build (configured with Ninja)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(realpath "${1:-$ROOT/build}")"
OBJECT=src/comm/nccl/CMakeFiles/vflow_nccl.dir/nccl_communicator.cpp.o

COMMAND="$(cd "$BUILD" && ninja -t commands "$OBJECT" 2>/dev/null | tail -n 1 || true)"
[[ "$COMMAND" == *nccl_communicator.cpp* ]] || {
  echo "nccl-grow-check: $BUILD (a Ninja build) has no NCCL backend to compile" >&2
  exit 1
}
HEADER=""
for include in $(grep -oE -- '-(isystem |I)[^ ]*' <<<"$COMMAND" | sed -E 's/^-(isystem |I)//'); do
  [[ -f "$include/nccl.h" ]] && HEADER="$include/nccl.h" && break
done
# NCCL from a distribution package sits in the compiler's own include directory.
[[ -n "$HEADER" || ! -f /usr/include/nccl.h ]] || HEADER=/usr/include/nccl.h
[[ -f "$HEADER" ]] || { echo "nccl-grow-check: no nccl.h among the build's includes" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
INSTALLED="$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$HEADER")"
[[ "$INSTALLED" =~ ^[0-9]+$ ]] || { echo "nccl-grow-check: $HEADER has no NCCL_VERSION_CODE" >&2; exit 1; }
if (( INSTALLED >= 22900 )); then
  echo "nccl-grow-check: $HEADER is NCCL $INSTALLED, which has ncclCommGrow; the normal build compiles it"
  exit 0
fi
sed -e 's/^#define NCCL_MINOR .*/#define NCCL_MINOR 29/' \
    -e 's/^#define NCCL_PATCH .*/#define NCCL_PATCH 0/' \
    -e 's/^#define NCCL_VERSION_CODE .*/#define NCCL_VERSION_CODE 22900/' "$HEADER" >"$WORK/nccl.h"
cat >>"$WORK/nccl.h" <<'EOF'
#ifdef __cplusplus
extern "C" {
#endif
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                          ncclComm_t* newcomm, ncclConfig_t* config);
#ifdef __cplusplus
}
#endif
EOF
grep -q '^#define NCCL_VERSION_CODE 22900' "$WORK/nccl.h" || {
  echo "nccl-grow-check: could not make $HEADER say 2.29" >&2
  exit 1
}

# The build's command, with the stand-in header before the real one (which the build
# names with -isystem, searched after every -I), errors on warnings, no output.
COMMAND="${COMMAND/ -c / -I$WORK -Werror -fsyntax-only -c }"
COMMAND="$(sed -e 's/ -MD -MT [^ ]* -MF [^ ]*//' -e 's/ -o [^ ]*//' <<<"$COMMAND")"
echo "nccl-grow-check: compiling the backend against NCCL $INSTALLED's header as 2.29"
(cd "$BUILD" && eval "$COMMAND")
echo "nccl-grow-check: the grow path compiles without a warning"
