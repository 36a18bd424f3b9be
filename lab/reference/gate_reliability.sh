#!/usr/bin/env bash
# How reliable is the stored-baseline gate? (docs/results.md): false alarms and power of
# `ddpbench compare` on this machine.
#
#   lab/reference/gate_reliability.sh [RERUNS] [TRIALS]      (defaults 10 and 5)
#
# 1. one baseline run of the default collective cases (autosave + raw data);
# 2. RERUNS unchanged reruns, each compared with the baseline (false alarms: any flagged case);
# 3. TRIALS runs with all_reduce slowed by 10% (DDPBENCH_INJECT_SLOWDOWN=all_reduce:10%), each
#    compared with the baseline (power: were all all_reduce cases flagged?).
# Runs go to $GATE_DIR/.benchmarks (default /tmp/ddpbench-gate), compare outputs (JSON) next to them.
# Extra pytest arguments: PYTEST_ARGS, extra compare arguments: COMPARE_ARGS.
# PHASE=compare redoes only the comparisons of runs already saved in $GATE_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
RERUNS=${1:-10}
TRIALS=${2:-5}
GATE_DIR=${GATE_DIR:-/tmp/ddpbench-gate}
PY=${PY:-.venv/bin/python}
STORAGE="$GATE_DIR/.benchmarks"
mkdir -p "$GATE_DIR"
run() {  # run LABEL [env...]
  local label=$1; shift
  env "$@" "$PY" -m pytest benchmarks/test_collectives.py -q -p no:cacheprovider -p ddpbench.testing \
    --benchmark-autosave --benchmark-save-data --benchmark-storage="file://$STORAGE" \
    --benchmark-save="$label" ${PYTEST_ARGS:-} > "$GATE_DIR/$label.log" 2>&1
}
compare() {  # compare BASE CUR OUT
  local rc=0
  "$PY" -m ddpbench.cli compare "$1" "$2" --json ${COMPARE_ARGS:-} > "$3" || rc=$?
  echo "$rc"
}
saved() { ls -t "$STORAGE"/*/*_"$1".json | head -1; }
if [ "${PHASE:-all}" != compare ]; then
  # KEEP=1 keeps runs already saved (resume after an interruption); reruns and injected trials
  # alternate so that a slow machine's changing load hits both kinds alike.
  [ "${KEEP:-0}" = 1 ] || rm -rf "$STORAGE"
  have() { ls "$STORAGE"/*/*_"$1".json > /dev/null 2>&1; }
  have baseline || run baseline
  for i in $(seq 1 $(( RERUNS > TRIALS ? RERUNS : TRIALS ))); do
    if [ "$i" -le "$RERUNS" ] && ! have "rerun$i"; then run "rerun$i"; fi
    if [ "$i" -le "$TRIALS" ] && ! have "inject$i"; then run "inject$i" DDPBENCH_INJECT_SLOWDOWN=all_reduce:10%; fi
  done
fi
BASE=$(saved baseline)
echo "baseline: $BASE"
false_alarms=0
for i in $(seq 1 "$RERUNS"); do
  CUR=$(saved "rerun$i")
  rc=$(compare "$BASE" "$CUR" "$GATE_DIR/rerun$i.compare.json")
  flagged=$("$PY" -c "
import json,sys
d=json.load(open(sys.argv[1]))
gate=[c['name'] for c in d['cases'] if c['verdict']=='regression']
# pytest-benchmark's --benchmark-compare-fail=median:10% on the same runs: current median > 1.1 x baseline
native=[c['name'] for c in d['cases'] if c['current_median_s'] and c['baseline_median_s'] and c['current_median_s'] > 1.1*c['baseline_median_s']]
print(f'{len(gate)} cases flagged ({\" \".join(gate) or \"-\"}); native median:10% gate would flag {len(native)}; {d[\"notes\"][0] if d[\"notes\"] else \"\"}')
" "$GATE_DIR/rerun$i.compare.json")
  [ "$rc" = 0 ] || false_alarms=$((false_alarms + 1))
  echo "unchanged rerun $i: exit $rc, $flagged"
done
caught=0
for i in $(seq 1 "$TRIALS"); do
  CUR=$(saved "inject$i")
  rc=$(compare "$BASE" "$CUR" "$GATE_DIR/inject$i.compare.json")
  summary=$("$PY" -c "
import json,sys
d=json.load(open(sys.argv[1]))
ar=[c for c in d['cases'] if c['name'].startswith('test_all_reduce')]
hit=[c for c in ar if c['verdict']=='regression']
other=[c['name'] for c in d['cases'] if c['verdict']=='regression' and c not in ar]
print(f'all_reduce flagged {len(hit)}/{len(ar)} ratios ' + ' '.join(f\"{c['ratio']:.3f}\" for c in ar) + f'; other cases flagged: {other or \"-\"}')
print('ALL' if ar and len(hit)==len(ar) else 'MISSED')" "$GATE_DIR/inject$i.compare.json")
  echo "injected 10% trial $i: exit $rc, $(echo "$summary" | head -1)"
  [ "$(echo "$summary" | tail -1)" = ALL ] && caught=$((caught + 1))
done
echo "SUMMARY: false alarms $false_alarms/$RERUNS unchanged reruns; injected 10% all_reduce slowdown fully flagged in $caught/$TRIALS trials"
