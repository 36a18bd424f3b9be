"""Benchmark-only hooks."""

from ddpbench.pool import PoolSpec


def pytest_collection_modifyitems(config, items):
    """Run benchmarks/test_training.py's world-size-1 cases before the larger ones, so every larger
    case finds its scaling reference. Only those items move, within the slots they already held."""
    slots = [i for i, item in enumerate(items)
             if item.nodeid.startswith("benchmarks/test_training.py::test_training[")]

    def world_size(item):
        spec = item.callspec.params.get("dist_spec")
        return spec.world_size if isinstance(spec, PoolSpec) else 0

    ordered = sorted((items[i] for i in slots), key=world_size)
    for slot, item in zip(slots, ordered):
        items[slot] = item
