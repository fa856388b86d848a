#!/usr/bin/env bash
# What `make test` runs (CONTRIBUTING.md, "Running the tests"): the whole suite as two pytest processes
# side by side. The main part holds every test of a real server (the session's vLLM stack, the shared
# end-to-end stacks, Phoenix, the run-last servers) and the folders; the side part the top-level files
# that use none (tests/conftest.py `in_side_part`). Run in one process, the side part's tests came last,
# mostly waiting for fake engines' heartbeats and steps with one core idle; beside the main part they
# take that core's idle time instead. The side part's output follows the main part's; the exit status
# is the first non-zero of the two.
#
#   scripts/run-tests.sh [--junit-dir DIR] [PYTEST_ARGS...]
#
#   --junit-dir DIR  write each part's JUnit XML there (main.xml, side.xml; scripts/flake-hunt.sh)
#   PYTEST_ARGS      run just these, in one process (e.g. tests/service -k capture), instead of both parts
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
junit_dir=""
if [ "${1:-}" = "--junit-dir" ]; then
  junit_dir="${2:?--junit-dir needs a folder}"; shift 2
  mkdir -p "$junit_dir"
fi
# The JUnit option as an array, so a folder with a space in its name stays one argument.
junit() { junit_args=(); [ -z "$junit_dir" ] || junit_args=("--junitxml=$junit_dir/$1.xml"); }

if [ $# -gt 0 ]; then
  junit main
  exec $PY -m pytest -q -ra --durations=25 "${junit_args[@]}" "$@"
fi

side_log="$(mktemp "${TMPDIR:-/tmp}/sidecar-tests-side.XXXXXX")"
# Its own cache off: two processes writing .pytest_cache at once would lose one's last-failed list.
junit side
$PY -m pytest -q -ra --durations=25 -p no:cacheprovider --part=side "${junit_args[@]}" >"$side_log" 2>&1 &
side_pid=$!
trap 'kill "$side_pid" 2>/dev/null; rm -f "$side_log"' EXIT
trap 'exit 130' INT TERM

junit main
$PY -m pytest -q -ra --durations=25 --part=main "${junit_args[@]}"
main_rc=$?
wait "$side_pid"
side_rc=$?
echo
echo "=============== the side part (top-level files using no session server), run beside it ==============="
cat "$side_log"
[ "$main_rc" = 0 ] || exit "$main_rc"
exit "$side_rc"
