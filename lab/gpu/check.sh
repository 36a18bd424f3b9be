#!/usr/bin/env bash
# ddpbench on a lent GPU, in one device call (issue 48): install, the GPU suite and its gates, the
# transformer family (MFU, census, exposed communication), default buckets vs one bucket, the
# memory census against the allocator, nccl-tests side by side, the A/B gate on NCCL. Each part
# runs under its own `timeout`; all of them fit 540 s. Logs, JSON, summary.md and summary.json go
# to $OUT (a new temporary folder when unset). Exit 0 with the summary whatever the parts did.
#
#   bash lab/gpu/check.sh                 # on the GPU machine (the device tool sets $OUT)
#   bash lab/gpu/check.sh --dry-run       # anywhere: nothing installed, built or run on a GPU;
#                                         # every part says why it skipped and what it would run
#   bash lab/gpu/check.sh --parts suite,suite_gates --budget suite=300    # a rerun of some parts
#
# Before the device call: lab/gpu/fetch_nccl_tests.sh (source into lab/gpu/nccl-tests/, carried
# with the call). lab/gpu/README.md has the one device call; lab/gpu/gpu_check.py the parts.
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
