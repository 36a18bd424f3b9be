"""A census record in the shared format (`extra_info["census"]`, docs/design/census-and-memory.md#record-format), built for tests."""


def census(*collectives, buckets=None, graph_breaks=None, recompiles=None, launches=None, version=2, **more):
    """A census in the shared format; each collective (kind, dtype, group size, call sizes), with a
    fifth item, a dict, for a version-2 entry's other fields (``group``: "world" unless given,
    ``peer``, ``data_dependent_bytes``: None unless given). ``version=1``: the older format, whose
    entries hold kind, dtype and group size only."""
    entries = []
    for kind, dtype, group, calls, *extra in collectives:
        entry = {"kind": kind, "dtype": dtype, "group_size": group, "count": len(calls), "bytes": sum(calls),
                 "call_bytes": sorted(calls)}
        if version >= 2:
            entry.update({"group": "world", "peer": None, "data_dependent_bytes": None, **(extra[0] if extra else {})})
        entries.append(entry)
    record = {"version": version, "method": "dispatch:c10d", "rounds_counted": 1, "ops_per_round": 1,
              "collectives": sorted(entries, key=lambda e: (e["kind"], e["dtype"], e["group_size"],
                                                            e.get("group", ""), str(e.get("peer")))),
              "ddp_buckets": buckets, "graph_breaks": graph_breaks, "recompiles": recompiles,
              "cuda_kernel_launches": launches, **more}
    if version >= 2:
        record.update({"ops_counted": 1, "sequence_checked": True})
    return record
