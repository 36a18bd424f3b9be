"""Root conftest: only what both tests/ and benchmarks/ need.

The ddpbench pytest plugin itself is loaded through its pytest11 entry point (pip install -e .),
so nothing has to be imported here.
"""
