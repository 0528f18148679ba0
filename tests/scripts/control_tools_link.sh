#!/usr/bin/env bash
# Programs that load no LibTorch (the control tools vflow-ctl, vflow-agent, vflow-sched;
# vflow-tokenize, whose SentencePiece brings a protobuf that clashes with LibTorch's): each
# must resolve all its libraries, and none of them may be LibTorch's (libtorch*, libc10*).
# Usage: control_tools_link.sh PROGRAM...
set -euo pipefail
status=0
for program in "$@"; do
  libraries="$(ldd "$program")"
  if grep -q "not found" <<<"$libraries"; then
    echo "$program: a library is not found:"; grep "not found" <<<"$libraries"; status=1
  fi
  if grep -E "lib(torch|c10)[^ ]*\.so" <<<"$libraries"; then
    echo "$program loads LibTorch (above): it must link vflow_control or vflow_data_files, not vflow"
    status=1
  else
    echo "$program: $(wc -l <<<"$libraries") libraries, no LibTorch"
  fi
done
exit "$status"
