#!/usr/bin/env bash
# ab.yml's own flow on this machine: are the PR gate's A/A verdicts decided, and how long does a run
# take? (docs/results.md, *The stop's own error*.) Base and head are identical clones of COMMIT,
# each with its own venv as ab.yml makes them; from head, ab.yml's gate command on its selection
# (AB_FILES / AB_MARKS / AB_SELECT / AB_RUN_BUDGET, read from .github/workflows/ab.yml), RUNS times
# A/A, then INJECTED times with the head's all_reduce rounds slowed by 10% (DDPBENCH_INJECT_SLOWDOWN
# on the candidate's ranks only). The walls are the measurement: run it on a quiet machine, alone.
#
#   lab/reference/ab_flow_check.sh [COMMIT] [RUNS] [INJECTED]     (defaults HEAD, 2, 1)
#
# About 15 minutes at the defaults on the 2-core machine: two venvs (~3 min), then each run 2.5-4
# min. Prints one line per run (wall, exit status, each case's verdict, pairs and looks on borrowed
# time) and a summary:
# decided share of the A/A verdicts, false regressions, injected all_reduce cases flagged, median
# wall per run. Runs and logs go to $FLOW_DIR (default /tmp/ddpbench-ab-flow); LOAD=1 adds
# ab_reliability.py's load (one core busy 3 s, idle 3 s) for the "under load" figures.
# AB_SELECT / AB_RUN_BUDGET in the environment replace ab.yml's (a smoke check: AB_SELECT="test_all_reduce
# and 1MB" AB_RUN_BUDGET=10); CHEAP_VENVS=1 gives each clone a venv of this checkout's .venv's Python
# whose .pth puts the clone's src before this checkout's installed packages, instead of `make venv`
# (as ab_two_venvs.py does: seconds instead of minutes, the same code on each side).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
COMMIT=$(git -C "$ROOT" rev-parse "${1:-HEAD}")
RUNS=${2:-2}
INJECTED=${3:-1}
FLOW_DIR=${FLOW_DIR:-/tmp/ddpbench-ab-flow}
workflow="$ROOT/.github/workflows/ab.yml"
env_of() { sed -n "s/^  $1: *//p" "$workflow" | sed 's/^"\(.*\)"$/\1/'; }
AB_FILES=$(env_of AB_FILES)
AB_MARKS=$(env_of AB_MARKS)
AB_SELECT=${AB_SELECT:-$(env_of AB_SELECT)}
AB_RUN_BUDGET=${AB_RUN_BUDGET:-$(env_of AB_RUN_BUDGET)}
if [ -z "$AB_FILES" ] || [ -z "$AB_MARKS" ] || [ -z "$AB_SELECT" ] || [ -z "$AB_RUN_BUDGET" ]; then
  echo "cannot read AB_FILES / AB_MARKS / AB_SELECT / AB_RUN_BUDGET from $workflow" >&2
  exit 2
fi
rm -rf "$FLOW_DIR"
mkdir -p "$FLOW_DIR"
for side in base head; do
  git clone --quiet --no-checkout "$ROOT" "$FLOW_DIR/$side"
  git -C "$FLOW_DIR/$side" checkout --quiet --detach "$COMMIT"
  if [ "${CHEAP_VENVS:-0}" = 1 ]; then
    "$ROOT/.venv/bin/python" -m venv --without-pip "$FLOW_DIR/$side/.venv"
    purelib=$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n%s\n' "$FLOW_DIR/$side/src" "$purelib" \
      > "$(echo "$FLOW_DIR/$side"/.venv/lib/python3*/site-packages)/checkout.pth"
  else
    make -C "$FLOW_DIR/$side" venv > "$FLOW_DIR/$side-venv.log" 2>&1
  fi
done
PYTEST=.venv/bin/pytest  # ab.yml's; a cheap venv has no pip, so no pytest script
[ "${CHEAP_VENVS:-0}" = 1 ] && PYTEST=".venv/bin/python -m pytest"
load_pid=
if [ "${LOAD:-0}" = 1 ]; then
  "$FLOW_DIR/head/.venv/bin/python" -c "
import os, time
parent = os.getppid()
while os.getppid() == parent:
    end = time.perf_counter() + 3.0
    while time.perf_counter() < end:
        pass
    time.sleep(3.0)" &
  load_pid=$!
  trap 'kill "$load_pid" 2> /dev/null || true' EXIT
fi
gate() {  # gate LABEL [extra pytest args...]: ab.yml's gate step, from head
  local label=$1; shift
  local started rc=0
  started=$(date +%s.%N)
  (cd "$FLOW_DIR/head" && $PYTEST $AB_FILES -m "$AB_MARKS" -k "$AB_SELECT" \
    --dist-baseline-python=../base/.venv/bin/python --dist-baseline-path=../base/src \
    --dist-ab-run-budget="$AB_RUN_BUDGET" --benchmark-json="$FLOW_DIR/$label.json" "$@" \
    > "$FLOW_DIR/$label.log" 2>&1) || rc=$?
  echo "$label $rc $started $(date +%s.%N)" >> "$FLOW_DIR/walls.txt"
}
for i in $(seq 1 "$RUNS"); do gate "aa$i"; done
for i in $(seq 1 "$INJECTED"); do
  gate "injected$i" -p ddpbench.testing --dist-candidate-env=DDPBENCH_INJECT_SLOWDOWN=all_reduce:10%
done
"$FLOW_DIR/head/.venv/bin/python" - "$FLOW_DIR" "$COMMIT" "${LOAD:-0}" <<'EOF'
import json, os, statistics, sys
flow, commit, load = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
decided = verdicts = false_regressions = flagged = injected = 0
walls = []
for line in open(os.path.join(flow, "walls.txt")):
    label, rc, started, ended = line.split()
    wall = float(ended) - float(started)
    path = os.path.join(flow, f"{label}.json")
    cases = json.load(open(path))["benchmarks"] if os.path.exists(path) else []
    print(f"{label}: exit {rc}, {wall:.0f} s; " + "; ".join(
        f"{c['name']} {c['extra_info']['ab']['verdict']} {c['extra_info']['ab']['ratio']:.3f} "
        f"({c['extra_info']['ab']['pairs']} pairs, {c['extra_info']['ab']['wall_s']:.0f} s"
        + (f", {c['extra_info']['ab']['borrowed_looks']} look(s) borrowed"
           if c['extra_info']['ab'].get('borrowed_looks') else "") + ")" for c in cases)
        + ("" if cases else f" no results: see {flow}/{label}.log"))
    for c in cases:
        verdict = c["extra_info"]["ab"]["verdict"]
        if label.startswith("injected") and c["name"].startswith("test_all_reduce"):
            injected += 1
            flagged += verdict == "regression"
            continue
        false_regressions += verdict == "regression"  # every other case is identical on both sides
        if label.startswith("aa"):
            verdicts += 1
            decided += verdict != "inconclusive"
    if label.startswith("aa"):
        walls.append(wall)
median = f"{statistics.median(walls):.0f}" if walls else "-"
print(f"SUMMARY (commit {commit[:10]}, {'with LOAD=1' if load else 'no load added'}): A/A runs' verdicts decided "
      f"{decided} of {verdicts} ({100 * decided / max(1, verdicts):.0f}%); false regressions {false_regressions}; "
      f"injected 10% all_reduce flagged {flagged} of {injected}; A/A wall per run median {median} s "
      f"({', '.join(f'{w:.0f}' for w in walls)})")
EOF
