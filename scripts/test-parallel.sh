#!/usr/bin/env bash
# Runs every test binary of the workspace, several at once (scripts/test.sh calls it when
# given no arguments). The integration tests spend most of their time waiting on real
# apiservers, nodes and timers: one binary at a time left the 2-core CI machine ~75 %
# idle (vmstat over tests/federated.rs), so binaries run side by side, longest first.
# Each binary is its own process with its own clusters; everything the harness creates on
# the host is named by pid (network namespaces, the fabric's 198.19.K.0/24, cgroup roots,
# work dirs), so binaries do not meet.
#
# SERVICE_MIRROR_TEST_JOBS: how many binaries at once (default 3; 1 runs them in turn).
# The binaries listed in HEAVY (real nodes, thousands of objects) run one after another
# in a lane of their own; the others share the remaining JOBS - 1 lanes.
# A binary's output is printed whole when it ends (its name first); a failed one's last
# too, in the summary. Doc tests run as one more job.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs=${SERVICE_MIRROR_TEST_JOBS:-3}
# Longest first (seconds in the last CI runs), so the long poles start at once.
ORDER="scale nodes chaos demo data_plane crash wire mirrors links hostile idle
  least_privilege federated mcs run gateways cli smoke harness"
HEAVY=" nodes scale demo chaos data_plane crash "

work=$(mktemp -d "${TMPDIR:-/tmp}/sm-tests.XXXXXX")
# Stopped before the end (CI's watchdog, ^C): the output of every binary that had not
# ended, so a hang names itself.
unfinished() {
  for log in "$work"/*.log; do
    [ -e "$log" ] || continue
    name=$(basename "$log" .log)
    grep -q " $name " "$work/summary" 2>/dev/null && continue
    echo "=== $name: did not end; its output so far:"
    tail -n 100 "$log"
  done
  rm -rf "$work"
}
trap unfinished EXIT

# The binaries as cargo built them: name, package dir, executable (one per line).
cargo test --workspace --no-run --message-format=json 2>"$work/build.err" >"$work/build.json" || {
  cat "$work/build.err" >&2
  exit 101
}
sed -n 's/.*"manifest_path":"\([^"]*\)\/Cargo.toml".*"target":{"kind":\[[^]]*\],"crate_types":\[[^]]*\],"name":"\([^"]*\)".*"profile":{[^}]*"test":true}.*"executable":"\([^"]*\)".*/\2 \1 \3/p' \
  "$work/build.json" >"$work/all"
[ -s "$work/all" ] || { echo "error: no test binary found in cargo's output" >&2; exit 101; }
{
  for name in $ORDER; do grep "^$name " "$work/all" || true; done
  grep -v -E "^($(echo $ORDER | tr ' ' '|')) " "$work/all" || true
  echo "doc-tests - -"
} >"$work/queue"
heavy_re="^($(echo $HEAVY | tr ' ' '|')) "
grep -E "$heavy_re" "$work/queue" >"$work/heavy" || true
grep -v -E "$heavy_re" "$work/queue" >"$work/light" || true
echo "running $(wc -l <"$work/queue") test jobs, $jobs at a time (logs in $work)"

# One job: runs the binary in its package's directory, as cargo test does, and prints
# its output when it ends.
run_one() {
  local name=$1 dir=$2 exe=$3 log="$work/$1.log" start=$SECONDS rc=0
  if [ "$name" = doc-tests ]; then
    cargo test --workspace --doc >"$log" 2>&1 || rc=$?
  else
    (cd "$dir" && CARGO_MANIFEST_DIR=$dir "$exe") >"$log" 2>&1 || rc=$?
  fi
  local took=$((SECONDS - start))
  {
    flock 9
    echo "=== $name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)") in ${took} s"
    cat "$log"
    echo "$took $name $rc" >>"$work/summary"
  } 9>"$work/print.lock"
}
export -f run_one
export work

start=$SECONDS
rc=0
if [ "$jobs" -le 1 ]; then
  xargs -P 1 -L 1 bash -c 'run_one "$@"' _ <"$work/queue" || rc=$?
else
  xargs -P 1 -L 1 bash -c 'run_one "$@"' _ <"$work/heavy" &
  heavy_lane=$!
  xargs -P "$((jobs - 1))" -L 1 bash -c 'run_one "$@"' _ <"$work/light" || rc=$?
  wait "$heavy_lane" || rc=$?
fi
echo "=== all test jobs ended in $((SECONDS - start)) s; the longest:"
sort -rn "$work/summary" | head -12 | awk '{printf "  %5d s  %s%s\n", $1, $2, ($3 == 0 ? "" : "  FAILED")}'
failed=$(awk '$3 != 0 {print $2}' "$work/summary")
ran=$(wc -l <"$work/summary")
queued=$(wc -l <"$work/queue")
if [ -n "$failed" ] || [ "$rc" != 0 ] || [ "$ran" != "$queued" ]; then
  echo "error: failed test binaries: ${failed:-none} ($ran of $queued ended)" >&2
  exit 101
fi
