"""The old home of a run's facts, kept importable: :mod:`ddpbench.storage.run_facts` declares,
records, reads and compares them (storage reads them too, and imports nothing from the gates)."""

from ..storage.run_facts import (ALL, CASE_FACTS, FINGERPRINT_KEY, FINGERPRINT_VERSION, MACHINE_FACTS,  # noqa: F401
                                 RUN_FACTS, RUN_FACTS_KEY, Difference, Facts, RunDifferences, case_differences,
                                 case_facts, facts_of, parse_allowed, run_differences, run_facts)
