#!/usr/bin/env bash
# Runs a command next to N busy loops (default 2, HOG=N to change), so tests that only pass on an
# idle machine fail here first: bash scripts/cpu-hog.sh npx ava dist/test/e2e/tenants.test.js
# The loops are stopped by pid when the command ends, fails, or is interrupted (Ctrl-C, SIGTERM).
set -u

if [ "$#" -eq 0 ]; then
  echo "usage: [HOG=N] bash scripts/cpu-hog.sh COMMAND [ARG...]" >&2
  exit 2
fi
n="${HOG:-2}"
case "$n" in
  '' | *[!0-9]*)
    echo "HOG must be a number of busy loops, got '$n'" >&2
    exit 2
    ;;
esac

pids=()
stop_hogs() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null
  done
  pids=()
}
cmd=''
# A background job of a script ignores the terminal's SIGINT, so a signal is passed on to the command.
on_signal() {
  [ -n "$cmd" ] && kill -TERM "$cmd" 2>/dev/null
  exit "$1"
}
trap stop_hogs EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

for ((i = 0; i < n; i++)); do
  # A subshell spinning on a builtin: no fork per turn, one full core each.
  (trap - INT TERM; while :; do :; done) &
  pids+=("$!")
done
echo "cpu-hog: $n busy loop(s), pids ${pids[*]}" >&2

"$@" &
cmd=$!
# `wait` returns early when a trapped signal arrives; the EXIT trap then stops the hogs.
wait "$cmd"
