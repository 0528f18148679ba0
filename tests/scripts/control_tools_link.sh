#!/usr/bin/env bash
# The control tools (vflow-ctl, vflow-agent, vflow-sched) load no LibTorch: each must
# resolve all its libraries, and none of them may be LibTorch's (libtorch*, libc10*).
# Usage: control_tools_link.sh PROGRAM...
set -euo pipefail
status=0
for program in "$@"; do
  libraries="$(ldd "$program")"
  if grep -q "not found" <<<"$libraries"; then
    echo "$program: a library is not found:"; grep "not found" <<<"$libraries"; status=1
  fi
  if grep -E "lib(torch|c10)[^ ]*\.so" <<<"$libraries"; then
    echo "$program loads LibTorch (above): it must link vflow_control, not vflow"; status=1
  else
    echo "$program: $(wc -l <<<"$libraries") libraries, no LibTorch"
  fi
done
exit "$status"
