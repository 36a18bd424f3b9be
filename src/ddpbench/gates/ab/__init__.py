"""A/B mode: a baseline side and a candidate side measured in the same run, interleaved.

* :mod:`.sides`    what a side is (interpreter, sys.path entries, environment), its engine and
  where it imports the code under test from, checked before rounds start;
* :mod:`.heap`     the malloc settings both sides' ranks share (--dist-ab-heap);
* :mod:`.schedule` the balanced random order of blocks, drawn from the run's seed;
* :mod:`.engine`   one case: both sides' pools, blocks, stages, the outcome;
* :mod:`.tasks`    the rank-side steps;
* :mod:`.session`  A/B mode in a pytest run: options, header, each case, the verdict table.

The statistics are :mod:`ddpbench.gates.stats`'s, the verdicts and their table
:mod:`ddpbench.gates.verdicts`'. The pytest plugin only wires options and fixtures to these.
"""
