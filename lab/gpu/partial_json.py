"""A pytest plugin for lab/gpu/check.sh: the ``--benchmark-json`` file holds every case measured so
far, rewritten after each case, so a run stopped by its part's time limit keeps what it measured.

pytest-benchmark writes that file only when the session ends: a part killed at its limit would
lose its whole JSON. This plugin writes the same document (pytest-benchmark's own
``pytest_benchmark_generate_json`` hook, machine and commit info generated once) after every case
that added a benchmark, atomically (a new file renamed over the old one), and marks it as a partial
run (ddpbench's run record: not complete, stopped "before pytest finished"), so no gate takes it for
a whole run. When pytest finishes, pytest-benchmark writes the file once more, whole.

    PYTHONPATH=lab/gpu python3 -m pytest -p partial_json ... --benchmark-json=PATH
"""

from __future__ import annotations

import json
import os

STOPPED = "partial: written after each case; pytest did not finish (its part's time limit, or killed)"


class PartialJson:
    def __init__(self, config):
        self.config = config
        self.written = -1
        self.info = None

    def _session(self):
        from ddpbench.benchmark_internals import benchmark_session

        return benchmark_session(self.config)

    def write(self) -> None:
        path = self.config.getoption("benchmark_json", None)
        session = self._session()
        if not path or session is None or len(session.benchmarks) == self.written:
            return
        hook = self.config.hook
        if self.info is None:
            machine_info = hook.pytest_benchmark_generate_machine_info(config=self.config)
            hook.pytest_benchmark_update_machine_info(config=self.config, machine_info=machine_info)
            commit_info = hook.pytest_benchmark_generate_commit_info(config=self.config)
            hook.pytest_benchmark_update_commit_info(config=self.config, commit_info=commit_info)
            self.info = (machine_info, commit_info)
        doc = hook.pytest_benchmark_generate_json(config=self.config, benchmarks=session.benchmarks, include_data=True,
                                                  machine_info=self.info[0], commit_info=self.info[1])
        from ddpbench.storage.records import RUN_KEY, run_record

        doc[RUN_KEY] = run_record(2, sum(1 for b in session.benchmarks if b.has_error), STOPPED, [])
        # a path (pytest-benchmark 5) or an open file (older releases: argparse.FileType)
        path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path.name
        tmp = f"{path}.partial"
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1, default=str)
        os.replace(tmp, path)
        self.written = len(session.benchmarks)

    def pytest_runtest_logfinish(self, nodeid, location):
        self.write()


def pytest_configure(config):
    config.pluginmanager.register(PartialJson(config), "partial_json_writer")
