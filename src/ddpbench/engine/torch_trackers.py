"""torch's memory trackers (``torch.distributed._tools``), imported for what the memory census uses
and no more: without the package's other tools (torch._inductor, FSDP), DTensor or torch._dynamo,
about 1.2 s of CPU a rank process's first census paid
(docs/design/census-and-memory.md#the-memory-record)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
import types

PACKAGE = "torch.distributed._tools"
_DTENSOR_MODULE = "torch.distributed.tensor"
_lock = threading.Lock()


def _real_dtensor():
    module = sys.modules.get(_DTENSOR_MODULE)
    return getattr(module, "DTensor", None) if module is not None else None


class _DeferredDTensorType(type):
    """The stand-in's type: equal to the real DTensor class once it is imported, never before."""

    def __eq__(cls, other):
        if other is cls:
            return True
        real = _real_dtensor()
        return real is not None and other is real

    def __ne__(cls, other):
        return not _DeferredDTensorType.__eq__(cls, other)

    __hash__ = type.__hash__

    def __instancecheck__(cls, instance):
        real = _real_dtensor()
        return real is not None and isinstance(instance, real)

    def __subclasscheck__(cls, subclass):
        real = _real_dtensor()
        return real is not None and issubclass(subclass, real)


class DeferredDTensor(metaclass=_DeferredDTensorType):
    """What ``mem_tracker`` sees as DTensor when it is imported before DTensor is."""


def _package_without_init() -> types.ModuleType:
    """The package ``torch.distributed._tools`` registered with its ``__init__`` not yet run; a
    module-level ``__getattr__`` runs it the first time a name the package lacks is asked for."""
    spec = importlib.util.find_spec(PACKAGE)
    package = importlib.util.module_from_spec(spec)
    state = {"initialised": False}

    def __getattr__(name: str):
        if name.startswith("__") or state["initialised"]:
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
        state["initialised"] = True
        spec.loader.exec_module(package)  # torch's own __init__, in the package's namespace
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}") from None

    package.__getattr__ = __getattr__
    sys.modules[PACKAGE] = package
    parent = sys.modules.get(PACKAGE.rpartition(".")[0])
    if parent is not None:
        setattr(parent, PACKAGE.rpartition(".")[2], package)
    return package


def tracker_module(name: str) -> types.ModuleType:
    """``torch.distributed._tools.<name>`` (``mem_tracker``, ``fsdp2_mem_tracker``,
    ``common_utils``), imported without the package's other tools and, for ``mem_tracker`` while
    DTensor is not imported, without DTensor (:class:`DeferredDTensor`)."""
    full = f"{PACKAGE}.{name}"
    module = sys.modules.get(full)
    if module is not None:
        return module
    with _lock:
        if PACKAGE not in sys.modules:
            import torch.distributed  # noqa: F401  (the parent package, registered first)

            _package_without_init()
        placeholder = None
        if f"{PACKAGE}.mem_tracker" not in sys.modules and _DTENSOR_MODULE not in sys.modules:
            placeholder = types.ModuleType(_DTENSOR_MODULE)
            placeholder.DTensor = DeferredDTensor
            sys.modules[_DTENSOR_MODULE] = placeholder
        try:
            if placeholder is not None:
                importlib.import_module(f"{PACKAGE}.mem_tracker")
        except ImportError:  # a torch whose tracker imports more of DTensor: import it as it is
            for module in [m for m in sys.modules if m.startswith(f"{PACKAGE}.")]:
                del sys.modules[module]
        finally:
            if placeholder is not None and sys.modules.get(_DTENSOR_MODULE) is placeholder:
                del sys.modules[_DTENSOR_MODULE]
        return importlib.import_module(full)


class _DynamoStandIn(types.ModuleType):
    """``torch._dynamo`` as ModTracker's hooks see it while torch._dynamo is not imported: no module
    runs inside a compiled one. Any other name imports torch._dynamo and is its own."""

    def __init__(self):
        super().__init__("torch._dynamo")
        self.eval_frame = types.SimpleNamespace(_is_in_optimized_module=lambda: False)

    def __getattr__(self, name: str):
        return getattr(importlib.import_module("torch._dynamo"), name)


_DYNAMO_STAND_IN = _DynamoStandIn()


@contextlib.contextmanager
def dynamo_stand_in():
    """Inside it, while torch._dynamo is not imported, ``torch._dynamo`` reads as a stand-in whose
    ``eval_frame._is_in_optimized_module()`` is False (no compiled module can run before
    torch._dynamo is imported); importing torch._dynamo meanwhile replaces it with the real one."""
    import torch

    if "torch._dynamo" in sys.modules or "_dynamo" in vars(torch):
        yield
        return
    torch._dynamo = _DYNAMO_STAND_IN
    try:
        yield
    finally:
        if vars(torch).get("_dynamo") is _DYNAMO_STAND_IN:
            del torch._dynamo
