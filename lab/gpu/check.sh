#!/usr/bin/env bash
# ddpbench on a lent GPU, in one device call (issue 48): install, the GPU suite and its gates, the
# transformer family (MFU, census, exposed communication), default buckets vs one bucket, the
# memory census against the allocator, nccl-tests side by side, the A/B gate on NCCL. Each part
# runs under its own `timeout`; all of them fit 540 s. The parts write under a work folder; $OUT (a
# new temporary folder when unset) gets summary.md, summary.json and bundle.tar.gz (every log, JSON
# and chart), and the output ends with a table of at most 2 KB. Exit 0 whatever the parts did.
#
#   bash lab/gpu/check.sh                 # on the GPU machine (the device tool sets $OUT)
#   bash lab/gpu/check.sh --cpu-rehearsal # here: every part's real commands, gloo and the CPU cases
#   bash lab/gpu/check.sh --dry-run       # anywhere: every pytest command collects, every flag exists
#   bash lab/gpu/check.sh --parts suite,suite_gates --budget suite=300    # a rerun of some parts
#
# Before the device call: lab/gpu/fetch_nccl_tests.sh and lab/gpu/fetch_wheels.sh (carried with
# the call: [".whl", "lab/gpu/nccl-tests"]). lab/gpu/README.md has the one device call.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
PYTHON=${PYTHON:-python3}
if [ -z "${OUT:-}" ]; then
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/ddpbench-gpu-check.XXXXXX")
fi
mkdir -p "$OUT"
export OUT PYTHON
"$PYTHON" lab/gpu/gpu_check.py --out "$OUT" --python "$PYTHON" "$@"
status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 2 ]; then
  echo "check.sh: gpu_check.py stopped with exit $status (a bug in the check itself); what it wrote is in $OUT" >&2
fi
exit "$status"
