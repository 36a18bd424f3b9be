"""A/B mode: a baseline side and a candidate side measured in the same run, interleaved.

* :mod:`~ddpbench.gates.ab.sides`    what a side is (interpreter, sys.path entries, environment), checked
  before rounds start;
* :mod:`~ddpbench.gates.ab.heap`     the malloc settings both sides' ranks share (--dist-ab-heap);
* :mod:`~ddpbench.gates.ab.schedule` the balanced random order of blocks;
* :mod:`~ddpbench.gates.stats`    paired statistics and the verdict;
* :mod:`~ddpbench.gates.ab.engine`   one case: both pools, blocks, stages, the outcome;
* :mod:`~ddpbench.gates.ab.tasks`    the rank-side steps;
* :mod:`~ddpbench.gates.verdicts`   the verdict table (terminal, markdown) of a run.

The pytest plugin only wires options and fixtures to these.
"""
