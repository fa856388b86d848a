#!/usr/bin/env bash
# Finds the tests that fail only sometimes, before CI does (CONTRIBUTING.md, "Flaky tests").
#
# Clones the current commit into a fresh folder (nothing installed by hand: the project's own install
# scripts build its .venv there, as CI's clone does), then runs the suite, or the part given after
# `--`, RUNS times in a row, optionally with a CPU hog busy on one core the whole time (a loaded CI
# runner). Prints every test that failed in any run, how often, and its first failure message.
#
#   scripts/flake-hunt.sh [-n RUNS] [--hog] [--dir DIR] [--keep] [-- PYTEST_ARGS...]
#
#   -n RUNS     how many runs (default 3)
#   --hog       keep one core busy (stress-ng --cpu 1 where installed, else a Python busy loop)
#   --dir DIR   the clone to use (default: a new temporary folder); an existing clone is updated
#               to this commit and its .venv reused, which skips the ~12-minute install
#   --keep      leave the clone (default: removed at the end unless --dir was given)
#   PYTEST_ARGS what to run (default: what `make test` runs), e.g. -- tests/service -k capture
#
# Exit status: 0 when every run passed, 1 when some test failed in some run, 2 on a usage error.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
runs=3 hog=0 dir="" keep=0 pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) runs="${2:?-n needs a number}"; shift 2 ;;
    --hog) hog=1; shift ;;
    --dir) dir="${2:?--dir needs a folder}"; keep=1; shift 2 ;;
    --keep) keep=1; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "flake-hunt: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
case "$runs" in ''|*[!0-9]*|0) echo "flake-hunt: -n must be a positive number, not '$runs'" >&2; exit 2 ;; esac

commit="$(git -C "$here" rev-parse HEAD)"
[ -n "$dir" ] || dir="$(mktemp -d /tmp/flake-hunt.XXXXXX)/clone"
if [ -d "$dir/.git" ]; then
  git -C "$dir" fetch --quiet "$here" "$commit" && git -C "$dir" checkout --quiet --detach "$commit"
else
  git clone --quiet "$here" "$dir" && git -C "$dir" checkout --quiet --detach "$commit"
fi
# The recorded traces the analysis tests read lie in shared/ beside the repository (as CI's copy does).
if [ -d "$here/../shared" ] && [ ! -e "$(dirname "$dir")/shared" ]; then
  ln -s "$(cd "$here/../shared" && pwd)" "$(dirname "$dir")/shared"
fi
results="$dir/.cache/flake-hunt"
rm -rf "$results" && mkdir -p "$results"
hog_pid=""
cleanup() {
  [ -z "$hog_pid" ] || kill "$hog_pid" 2>/dev/null || true
  if [ "$keep" = 0 ]; then rm -rf "$(dirname "$dir")"; fi
}
trap cleanup EXIT

cd "$dir"
echo "flake-hunt: $commit in $dir; installing (the project's own scripts; skipped where done)" >&2
make --no-print-directory install >/dev/null
bash scripts/install-test-backends.sh >/dev/null
bash scripts/install-browser.sh >/dev/null
bash scripts/install-sglang.sh >/dev/null
if [ "$hog" = 1 ]; then
  if command -v stress-ng >/dev/null 2>&1; then
    stress-ng --cpu 1 --quiet & hog_pid=$!
  else
    python3 -c 'while True: pass' & hog_pid=$!
  fi
  echo "flake-hunt: CPU hog on one core (pid $hog_pid)" >&2
fi

for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  set +e
  # What `make test` runs (both parts side by side), or just PYTEST_ARGS in one process.
  CI=true bash scripts/run-tests.sh --junit-dir "$results/run-$i" "${pytest_args[@]}" >"$results/run-$i.log" 2>&1
  rc=$?
  set -e
  echo "flake-hunt: run $i of $runs: exit $rc, $(( $(date +%s) - start )) s; $(grep -E ' in [0-9.]+s( \(|$)' "$results/run-$i.log" | paste -sd ';')" >&2
done

.venv/bin/python scripts/flake_report.py "$results"/run-*/
