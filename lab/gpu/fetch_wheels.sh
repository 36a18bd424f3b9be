#!/usr/bin/env bash
# Put the wheels lab/gpu/check.sh may need on the GPU machine into .whl/ (ignored by git), for a
# session to carry with its device call: that machine reaches no package index. Its image has
# torch 2.11 on Python 3.12 and most of ddpbench's needs, but not ruptures (ddpbench history), and
# pytest / pytest-benchmark / setuptools of versions not checked here: check.sh's install part
# compares each with pyproject's range and installs the carried wheel only where the image's is
# missing or out of range. Versions: constraints.txt's pins, and for their own needs the versions
# the dev environment uses. About 3 MB.
#
#   lab/gpu/fetch_wheels.sh          # then carry [".whl", ...] in the device call (lab/gpu/README.md)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST="$ROOT/.whl"
PYTHON=${PYTHON:-python3}
pin() { sed -n "s/^$1==//p" "$ROOT/constraints.txt"; }
WANTED=(
  "pytest==$(pin pytest)" "pytest-benchmark==$(pin pytest-benchmark)" "pytest-xdist==$(pin pytest-xdist)"
  "pytest-timeout==$(pin pytest-timeout)" "ruptures==$(pin ruptures)"
  # what those need, beyond what the image has (numpy, scipy, packaging, pygments)
  "pluggy==1.7.0" "iniconfig==2.3.1" "py-cpuinfo2==10.1.1" "execnet==2.1.2"
  # pyproject's build backend needs setuptools >= 77 (PEP 639's license field)
  "setuptools==84.2.1"
)
mkdir -p "$DEST"
for spec in "${WANTED[@]}"; do
  case "$spec" in *==) echo "fetch_wheels: no pin for ${spec%==} in constraints.txt" >&2; exit 2;; esac
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "$spec"
done
ls -l "$DEST"
du -sh "$DEST"
