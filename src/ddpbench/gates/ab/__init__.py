"""A/B mode: a baseline side and a candidate side measured in the same run, interleaved
(docs/design/ab.md#ab-mode)."""
