"""Start a plain torch.distributed job for the scripts of lab/investigations: ``world_size`` spawned
processes, each calling ``target(rank, world_size, store_path, results, *args)`` (``store_path``: a
file for ``init_method=f"file://{store_path}"``; ``results``: a queue to put one ``(rank, value)``
on). Returns ``{rank: value}`` once every process has ended."""

import os
import tempfile

import torch.multiprocessing as mp


def run_ranks(target, world_size: int, *args) -> dict:
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store_path = os.path.join(folder, "store")
        ranks = [context.Process(target=target, args=(rank, world_size, store_path, results, *args))
                 for rank in range(world_size)]
        for process in ranks:
            process.start()
        found = dict(results.get() for _ in ranks)
        for process in ranks:
            process.join()
    return found
