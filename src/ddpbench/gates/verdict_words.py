"""The gates' verdict words, kept importable here: :mod:`ddpbench.verdict_words` declares them, below
both the gates that decide them and the saved runs that hold them."""

from ..verdict_words import COMPONENT_VERDICTS, CASE_VERDICTS, TIMING_VERDICTS, Verdict  # noqa: F401
