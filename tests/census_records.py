"""A census record in the shared format (`extra_info["census"]`, docs/design.md), built for tests."""


def census(*collectives, buckets=None, graph_breaks=None, recompiles=None, launches=None, **more):
    """A census in the shared format; each collective (kind, dtype, group size, call sizes)."""
    entries = [{"kind": kind, "dtype": dtype, "group_size": group, "count": len(calls), "bytes": sum(calls),
                "call_bytes": sorted(calls)} for kind, dtype, group, calls in collectives]
    return {"version": 1, "method": "dispatch:c10d", "rounds_counted": 1, "ops_per_round": 1,
            "collectives": sorted(entries, key=lambda e: (e["kind"], e["dtype"], e["group_size"])),
            "ddp_buckets": buckets, "graph_breaks": graph_breaks, "recompiles": recompiles,
            "cuda_kernel_launches": launches, **more}
