"""What a rank refuses from Lightning: a ``Trainer`` made inside a rank that would launch processes
of its own (``devices`` > 1: its launcher re-runs the command line, pytest's) or train as another
rank than the pool's (a rank-0 environment on every rank: each DistributedSampler then deals every
rank the same shard). Either would pass silently and measure something else; the rank stops the
case as a usage error instead, naming ``ddpbench.LightningTraining``, which attaches a Trainer to
the pool's process group (docs/design/families.md#your-own-model).

The check runs after every ``Trainer.__init__`` in a rank process: Lightning's Trainer module is
patched when it is imported (or at once, if it already is), so importing it costs nothing extra."""

from __future__ import annotations

import functools
import importlib.abc
import sys

from .base import WorkloadRefused

#: Lightning's Trainer modules: the standalone package and the unified one.
TRAINER_MODULES = ("pytorch_lightning.trainer.trainer", "lightning.pytorch.trainer.trainer")

USE_INSTEAD = ("Use ddpbench.LightningTraining(module=YourModule, datamodule=YourData) (or batch=...): it "
               "attaches a Trainer to the pool's process group, each rank one device, and steps one fit "
               "one optimizer step per round.")


def guard_lightning_trainers() -> None:
    """Check every Lightning Trainer this process makes from now on (:func:`refuse_misplaced_trainer`)."""
    for name in TRAINER_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            _guard(module)
    if not any(isinstance(finder, _GuardOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _GuardOnImport())


def refuse_misplaced_trainer(trainer) -> None:
    """Raise :class:`~.base.WorkloadRefused` when ``trainer``, made in a rank whose process group is
    up, would drive more than this rank's one device or see another rank and world size than the
    group's."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    problems = []
    if trainer.num_devices > 1:
        problems.append(f"devices={trainer.num_devices}: Lightning would start {trainer.num_devices - 1} more "
                        f"process(es) inside this one (its launcher re-runs the command line, here pytest's), "
                        f"while the pool already runs one process per rank")
    if (trainer.global_rank, trainer.world_size) != (rank, world):
        problems.append(f"it would train as rank {trainer.global_rank} of {trainer.world_size} in rank {rank} of "
                        f"the pool's {world} (Lightning found no environment naming this rank, so every rank "
                        f"would be its own rank 0 and each DistributedSampler would deal it the same data)")
    if problems:
        raise WorkloadRefused(f"ddpbench: a Lightning Trainer made inside a rank: {'; and '.join(problems)}. "
                              f"{USE_INSTEAD}")


def _guard(module) -> None:
    trainer = getattr(module, "Trainer", None)
    if trainer is None or getattr(trainer.__init__, "_ddpbench_guarded", False):
        return
    made = trainer.__init__

    @functools.wraps(made)
    def __init__(self, *args, **kwargs):
        made(self, *args, **kwargs)
        refuse_misplaced_trainer(self)

    __init__._ddpbench_guarded = True
    trainer.__init__ = __init__


class _GuardOnImport(importlib.abc.MetaPathFinder):
    """Finds Lightning's Trainer module as the other finders do, and guards it once it has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in TRAINER_MODULES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _GuardingLoader(spec.loader)
                return spec
        return None


class _GuardingLoader(importlib.abc.Loader):
    """The module's own loader, then :func:`_guard`; everything else is the own loader's."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _guard(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)
