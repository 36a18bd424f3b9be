#!/usr/bin/env bash
# Put NVIDIA/nccl-tests' source into lab/gpu/nccl-tests/ (ignored by git, never committed), for
# lab/gpu/check.sh to build on the GPU machine, which cannot download anything: a session carries
# the folder with its device call. Writes lab/gpu/nccl-tests/COMMIT (the commit it holds, for
# docs/results.md) and leaves no .git in it, so the carried folder stays small (~1 MB).
#
#   lab/gpu/fetch_nccl_tests.sh                      # clone from GitHub (needs the network)
#   lab/gpu/fetch_nccl_tests.sh GIT_DIR              # from a local clone or bare mirror instead,
#                                                    # e.g. the directory a session's `fetch` tool
#                                                    # returns for github:NVIDIA/nccl-tests
#   NCCL_TESTS_REF=v2.19.6 lab/gpu/fetch_nccl_tests.sh [GIT_DIR]   # another commit or tag
#
# The default ref is a0b82b2 (nccl-tests 2.19.6), the commit docs/results.md's GPU figures used.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST="$ROOT/lab/gpu/nccl-tests"
REF=${NCCL_TESTS_REF:-a0b82b2260cf5152b9f8c061bbf7eaf0ba096432}
URL=https://github.com/NVIDIA/nccl-tests.git
SOURCE=${1:-}

if [ -e "$DEST" ]; then
  echo "fetch_nccl_tests: $DEST already exists (commit $(cat "$DEST/COMMIT" 2>/dev/null || echo unknown));" \
       "remove it first to fetch again" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -n "$SOURCE" ]; then
  if ! git --git-dir="$SOURCE" rev-parse --verify --quiet "$REF^{commit}" >/dev/null \
     && ! git -C "$SOURCE" rev-parse --verify --quiet "$REF^{commit}" >/dev/null; then
    echo "fetch_nccl_tests: $SOURCE is not a git directory holding $REF; give a clone or mirror" \
         "of NVIDIA/nccl-tests, or set NCCL_TESTS_REF to a commit it holds" >&2
    exit 1
  fi
  if git --git-dir="$SOURCE" rev-parse --verify --quiet "$REF^{commit}" >/dev/null; then
    gitdir=(--git-dir="$SOURCE")
  else
    gitdir=(-C "$SOURCE")
  fi
  commit=$(git "${gitdir[@]}" rev-parse "$REF^{commit}")
  mkdir -p "$tmp/src"
  git "${gitdir[@]}" archive --format=tar "$commit" | tar -x -C "$tmp/src"
else
  if ! git clone --quiet --no-checkout "$URL" "$tmp/clone" 2>"$tmp/err"; then
    echo "fetch_nccl_tests: cannot clone $URL ($(tail -1 "$tmp/err"))." >&2
    echo "Without the network: get a clone or mirror of NVIDIA/nccl-tests some other way (a session" \
         "with the search tools: fetch github:NVIDIA/nccl-tests, which returns a git directory) and" \
         "run: lab/gpu/fetch_nccl_tests.sh GIT_DIR" >&2
    exit 1
  fi
  commit=$(git -C "$tmp/clone" rev-parse "$REF^{commit}")
  mkdir -p "$tmp/src"
  git -C "$tmp/clone" archive --format=tar "$commit" | tar -x -C "$tmp/src"
fi
echo "$commit" > "$tmp/src/COMMIT"
mv "$tmp/src" "$DEST"
echo "nccl-tests $commit in $DEST ($(du -sh "$DEST" | cut -f1)); carry lab/gpu/nccl-tests with the device call"
