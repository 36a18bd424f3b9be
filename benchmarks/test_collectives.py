"""Collective benchmarks: time and nccl-tests-style bandwidth of all_reduce, all_gather,
reduce_scatter and broadcast over --dist-sizes and --dist-world-sizes.

Case ids read ``test_<op>[<backend>-<world size>p-<size>]``, e.g. ``test_all_reduce[gloo-2p-10MB]``;
each case's extra_info carries op, size_bytes, algbw_GBps and busbw_GBps.
"""

from ddpbench.workloads.collectives import Collective


def test_all_reduce(dist_benchmark, dist_message_size):
    dist_benchmark(Collective("all_reduce", dist_message_size))


def test_all_gather(dist_benchmark, dist_message_size):
    dist_benchmark(Collective("all_gather", dist_message_size))


def test_reduce_scatter(dist_benchmark, dist_message_size):
    dist_benchmark(Collective("reduce_scatter", dist_message_size))


def test_broadcast(dist_benchmark, dist_message_size):
    dist_benchmark(Collective("broadcast", dist_message_size))
