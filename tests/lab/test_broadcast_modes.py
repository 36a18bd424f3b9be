"""lab/investigations/broadcast_modes.py: the two round times of a large broadcast in a plain script."""

import subprocess
import sys

import pytest

from helpers.lab_scripts import lab_script_path, load_lab_script


@pytest.fixture(scope="module")
def modes_script():
    return load_lab_script("broadcast_modes")


def test_rounds_over_one_and_a_half_times_the_fastest_tenth_count_as_slow(modes_script):
    # (round s, root's voluntary switches, receiver's CPU s): 7 fast rounds, 3 about twice as long.
    rounds = [(0.022, 2, 0.02)] * 7 + [(0.045, 40, 0.04), (0.046, 41, 0.04), (0.044, 39, 0.03)]
    line = modes_script.describe(rounds)
    assert line.startswith("slow share 0.30; round ms fast 22.0 slow 45.0")
    assert "root switches fast 2.0 slow 40.0" in line and "receiver CPU ms fast 20.0 slow 40.0" in line
    assert modes_script.describe([(0.01, 1, 0.0)] * 4).startswith("slow share 0.00; round ms fast 10.0 slow -")


@pytest.mark.pool
def test_a_small_run_prints_a_line_per_group():
    command = [sys.executable, str(lab_script_path("broadcast_modes")), "--mb", "1", "--rounds", "4",
               "--runs", "1", "--groups", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "broadcast 1 MB, 2 ranks, 4 rounds per group, pin none"
    assert [line.split(":")[0] for line in out[1:]] == ["run 0 group 0", "run 0 group 1"]
    assert all("slow share" in line for line in out[1:])
