"""Collective benchmarks: time and nccl-tests-style bandwidth of all_reduce, all_gather,
reduce_scatter and broadcast over --dist-sizes and --dist-world-sizes.

Case ids read ``test_<op>[<backend>-<world size>p-<size>]``, e.g. ``test_all_reduce[gloo-2p-10MB]``;
--dist-dtypes, --dist-reduce-ops (the ops that reduce) and --dist-placements add an id part each
when given. Each case's extra_info carries op, size_bytes, algbw_GBps, busbw_GBps, dtype,
placement and, for the ops that reduce, reduce_op.
"""

from ddpbench.workloads.collectives import Collective


def test_all_reduce(dist_benchmark, dist_message_size, dist_dtype, dist_reduce_op, dist_placement):
    dist_benchmark(Collective("all_reduce", dist_message_size, dist_dtype, dist_reduce_op, dist_placement))


def test_all_gather(dist_benchmark, dist_message_size, dist_dtype, dist_placement):
    dist_benchmark(Collective("all_gather", dist_message_size, dist_dtype, placement=dist_placement))


def test_reduce_scatter(dist_benchmark, dist_message_size, dist_dtype, dist_reduce_op, dist_placement):
    dist_benchmark(Collective("reduce_scatter", dist_message_size, dist_dtype, dist_reduce_op, dist_placement))


def test_broadcast(dist_benchmark, dist_message_size, dist_dtype, dist_placement):
    dist_benchmark(Collective("broadcast", dist_message_size, dist_dtype, placement=dist_placement))
