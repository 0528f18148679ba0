#!/bin/bash
# Pinned fingerprints: short deterministic runs of every example job and of the
# multi-worker jobs the tests train, checked against the fingerprints recorded for this
# kind of machine in tests/pinned-fingerprints.tsv.
#
#   pinned_fingerprints.sh check  BUILD_DIR TORCH_VERSION   # ctest; exit 77 when none pinned
#   pinned_fingerprints.sh record BUILD_DIR TORCH_VERSION   # (re)pins this machine's values
#
# A deterministic fingerprint is a function of the job spec on one device type, but the
# device type includes the CPU's kernels: LibTorch's version, the CPU model (oneDNN picks
# kernels by instruction set) and the BLAS library with its core type. Those make the
# signature a value is pinned under; on a machine with another signature the check is
# reported as skipped, naming the signature, rather than failing. Pinning is how code
# moves are shown not to change behaviour: record before, check after. A change that means
# to change a case's arithmetic re-records it where it can and marks the other machines'
# value `unpinned`: there the case is reported as skipped until someone records it.
set -euo pipefail

mode=${1:?usage: pinned_fingerprints.sh check|record BUILD_DIR TORCH_VERSION}
build=$(cd "${2:?build directory}" && pwd)
torch_version=${3:?LibTorch version}
here=$(cd "$(dirname "$0")/../.." && pwd)
pins=$here/tests/pinned-fingerprints.tsv
train=$build/vflow-train

cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: *//; s/  */ /g')
# awk reads to the end: an early exit would stop ldd with SIGPIPE, which pipefail turns
# into a failure of this script now and then.
blas=$(ldd "$build/libvflow.so" 2>/dev/null | awk '/libblas|libopenblas|libmkl/ && !seen {print $3; seen = 1}')
blas=$(readlink -f "${blas:-none}" 2>/dev/null || echo none)
isa=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|avx512f|avx512_bf16|avx512_vnni|amx_tile' |
      sort | paste -sd, -)
signature="torch $torch_version; $cpu ($isa); $blas; coretype ${OPENBLAS_CORETYPE:-auto}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Every case: a name and vflow-train's arguments. All run with deterministic mode, one
# thread per worker and few steps; the multi-worker ones must equal their one-worker runs.
common="--set semantic.deterministic=true --set resources.threads=1 --set semantic.epochs=null
        --set output.logging.progress=off --set output.evaluation.enabled=false"
small=(--set "semantic.data={name: synthetic, options: {train_size: 600, test_size: 64, shape: [1, 12, 12], classes: 4, noise: 1.5}}"
       --set "semantic.model.options={channels: [4, 8], hidden: 16, dropout: 0.25}"
       --set semantic.global_batch=48 --set semantic.virtual_nodes=12 --set semantic.steps=16
       --set resources.timeout_s=20)
cases=(default-1w default-3w resnet18-fashion fortunes-lm langid-bert torchscript-convnet
       small-1w small-4w langid-bert-finetune fortunes-lm-transformer fashion-large-batch-lamb)
args_of() {
  case $1 in
    default-1w) echo "--set semantic.steps=20" ;;
    default-3w) echo "--set semantic.steps=20 --workers 3" ;;
    resnet18-fashion|fortunes-lm|langid-bert|langid-bert-finetune|fortunes-lm-transformer|fashion-large-batch-lamb)
      echo "$here/examples/jobs/$1.yaml --set semantic.steps=3" ;;
    torchscript-convnet)
      echo "$here/examples/jobs/$1.yaml --set semantic.steps=3 --set semantic.model.torchscript=$work/convnet.pt" ;;
    small-1w) echo "--workers 1" ;;
    small-4w) echo "--workers 4" ;;
  esac
}

fingerprint_of() {  # name -> the run's one fingerprint on stdout
  local name=$1 out=$work/$1.log
  if [[ $name == torchscript-convnet && ! -f $work/convnet.pt ]]; then
    /usr/bin/python3 "$here/scripts/export_torchscript.py" --model convnet --out "$work/convnet.pt" \
      >"$work/export.log" 2>&1 || { cat "$work/export.log" >&2; return 1; }
  fi
  local -a argv=()
  [[ $name == small-* ]] && argv=("${small[@]}")
  # shellcheck disable=SC2046  # split the case's and the common arguments on spaces
  (cd "$work" && "$train" $(args_of "$name") "${argv[@]}" $common) >"$out" 2>&1 || {
    echo "[pin] $name failed:" >&2
    tail -n 30 "$out" >&2
    return 1
  }
  local prints
  prints=$(grep -oE '(^|[^(])fingerprint [0-9a-f]{16}' "$out" | grep -oE '[0-9a-f]{16}$' | sort -u)
  if [[ $(wc -l <<<"$prints") -ne 1 || -z $prints ]]; then
    echo "[pin] $name: expected one fingerprint on every rank, got: $prints" >&2
    return 1
  fi
  echo "$prints"
}

case $mode in
  record)
    tmp=$pins.tmp
    { grep -v -F "$signature	" "$pins" 2>/dev/null || true; } >"$tmp"
    for name in "${cases[@]}"; do
      fp=$(fingerprint_of "$name")
      echo "[pin] $name $fp"
      printf '%s\t%s\t%s\n' "$signature" "$name" "$fp" >>"$tmp"
    done
    mv "$tmp" "$pins"
    echo "[pin] pinned ${#cases[@]} fingerprints for: $signature"
    ;;
  check)
    if ! grep -q -F "$signature	" "$pins" 2>/dev/null; then
      echo "SKIPPED: no fingerprints pinned for this machine ($signature);"
      echo "         record them with: tests/scripts/pinned_fingerprints.sh record BUILD_DIR $torch_version"
      exit 77
    fi
    failed=0
    for name in "${cases[@]}"; do
      want=$(awk -F'\t' -v s="$signature" -v n="$name" '$1 == s && $2 == n {print $3}' "$pins")
      if [[ -z $want ]]; then
        echo "[pin] $name: not pinned for this machine" >&2
        failed=1
        continue
      fi
      if [[ $want == unpinned ]]; then
        echo "[pin] $name: SKIPPED, unpinned for this machine since its arithmetic changed;" \
             "record it with: tests/scripts/pinned_fingerprints.sh record BUILD_DIR $torch_version"
        continue
      fi
      got=$(fingerprint_of "$name") || { failed=1; continue; }
      if [[ $got == "$want" ]]; then
        echo "[pin] $name $got as pinned"
      else
        echo "[pin] $name: fingerprint $got, pinned $want" >&2
        failed=1
      fi
    done
    exit $failed
    ;;
  *)
    echo "usage: pinned_fingerprints.sh check|record BUILD_DIR TORCH_VERSION" >&2
    exit 2
    ;;
esac
