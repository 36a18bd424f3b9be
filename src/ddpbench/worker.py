"""``python -m ddpbench.worker``: the multi-node rank that torchrun starts (the stable entry point
of :mod:`ddpbench.pool.worker`, where it lives)."""

import sys

from .pool.worker import main

if __name__ == "__main__":
    sys.exit(main())
