"""Bisect's child runs stop at their time limit even when bisect itself runs as a shell's
background job (SIGINT ignored from the start, as under `cmd &`, nohup or some CI runners)."""

import signal
import sys
import time

from ddpbench.bisect.processes import INTERRUPT_GRACE_S, Children


def test_a_run_started_from_a_background_job_still_stops_at_its_time_limit(tmp_path):
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a background job inherits
    try:
        started = time.monotonic()
        status = Children().run([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path,
                                tmp_path / "run.log", timeout=0.5)
        took = time.monotonic() - started
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert status is None  # past its limit
    # Stopped by its SIGINT, not by the SIGKILL INTERRUPT_GRACE_S later.
    assert took < INTERRUPT_GRACE_S / 3, f"the run took {took:.1f} s to stop"
