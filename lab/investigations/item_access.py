"""What one ``dataset[i]`` costs per storage layout: a Python list of tensors, the same list behind a
minimal map-style Dataset (what a DataLoader indexes when a user's Dataset holds a list), ddpbench's
PackedTensorDataset, and one stacked N x C x H x W tensor.

Standalone (torch and ddpbench only), single-threaded, in one process. Every repeat times one pass
of ``ds[i]`` over all items, in one shuffled order (as a RandomSampler draws them) shared by the
layouts, for each layout in a fresh random order of layouts (interleaved, so drift hits all of
them alike), with the garbage collector off during a pass, after one untimed pass per layout.
Prints, per layout, the median and IQR of the nanoseconds per item over the repeats, and the ratio
to the list's: the ratio of the medians, and the median and min-max of the per-repeat ratios.

    .venv/bin/python lab/investigations/item_access.py                       # 5000 x 3x32x32, 31 repeats
    .venv/bin/python lab/investigations/item_access.py --num-samples 2048 --shape 3,224,224
    .venv/bin/python lab/investigations/item_access.py --quick               # a functional check only

Run it on a quiet machine; numbers from a busy one say little.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time

import torch

from ddpbench.data.packed import PackedTensorDataset


class ListDataset(torch.utils.data.Dataset):
    """A list of tensors behind ``__getitem__``, as a user's own Dataset holds one."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def build(num_samples: int, shape: tuple[int, ...]) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    samples = [torch.randint(0, 256, shape, generator=gen).to(torch.float32) for _ in range(num_samples)]
    stacked = torch.stack(samples)
    return {
        "list": samples,
        "list_dataset": ListDataset(samples),
        "packed": PackedTensorDataset.from_tensors(samples),
        "stacked": stacked,
    }


def one_pass(dataset, order) -> float:
    """Seconds for ``dataset[i]`` over ``order``, the garbage collector off."""
    gc.disable()
    try:
        start = time.perf_counter()
        for i in order:
            dataset[i]
        return time.perf_counter() - start
    finally:
        gc.enable()


def quartiles(values):
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def check_same_samples(layouts: dict[str, object], num_samples: int) -> None:
    """Every layout returns the list's sample at every index (a timing of wrong items is worthless)."""
    reference = layouts["list"]
    for name, dataset in layouts.items():
        for i in range(num_samples):
            if not torch.equal(dataset[i], reference[i]):
                raise SystemExit(f"item_access.py: {name}[{i}] differs from list[{i}]")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-samples", type=int, default=5000)
    parser.add_argument("--shape", default="3,32,32", help="comma list, e.g. 3,224,224 (float32 samples)")
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="200 samples, 3 repeats: checks that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_samples, args.repeats = 200, 3
    shape = tuple(int(d) for d in args.shape.split(","))
    if args.num_samples < 1 or args.repeats < 1 or not shape or min(shape) < 1:
        parser.error("--num-samples, --repeats and every --shape dimension must be positive")
    torch.set_num_threads(1)
    layouts = build(args.num_samples, shape)
    check_same_samples(layouts, args.num_samples)
    rng = random.Random(args.seed)
    order = list(range(args.num_samples))
    rng.shuffle(order)
    for dataset in layouts.values():
        one_pass(dataset, order)  # untimed: first-touch effects
    per_item: dict[str, list[float]] = {name: [] for name in layouts}
    for _ in range(args.repeats):
        names = list(layouts)
        rng.shuffle(names)
        for name in names:
            per_item[name].append(one_pass(layouts[name], order) / args.num_samples * 1e9)

    base = per_item["list"]
    print(f"# dataset[i] per item: {args.num_samples} samples of {'x'.join(map(str, shape))} float32, "
          f"{args.repeats} interleaved repeats, torch {torch.__version__}, Python {sys.version.split()[0]}")
    print(f"# command: {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print()
    print("| layout | median ns/item | IQR ns/item | median / list's median | per-repeat ratio to list: median (min-max) |")
    print("|---|---|---|---|---|")
    for name, values in per_item.items():
        q1, q3 = quartiles(values)
        ratios = [v / b for v, b in zip(values, base)]
        print(f"| {name} | {statistics.median(values):.1f} | {q3 - q1:.1f} | "
              f"{statistics.median(values) / statistics.median(base):.2f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
