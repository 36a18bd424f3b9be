"""Why a workload cannot reach the rank processes, in words a user can act on
(docs/design/plugin-and-pool.md#shipping-tasks)."""

from __future__ import annotations

import functools
import pickle
import sys
import traceback
import types
from typing import Any, Callable

# How deep and how wide the search for the unpicklable part of an object goes.
_MAX_DEPTH = 4
_MAX_PARTS = 64

#: Every message about a task the ranks could not load starts with this (the pool recognises it).
LOAD_FAILURE_PREFIX = "ddpbench: the ranks cannot load "

_WHY = ("The ranks are separate processes: they receive the workload pickled and import its "
        "classes and functions by module and name, so those must be defined at module level in a "
        "module the ranks can import.")


# ----------------------------------------------------------------------------------------------
# Controller side: what does not pickle, and why
# ----------------------------------------------------------------------------------------------


def _parts(obj: Any) -> list[tuple[str, Any]]:
    """The components pickle serialises ``obj`` through, each with a path suffix."""
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)):
        return []  # pickled by reference: the object itself is the culprit
    if isinstance(obj, types.MethodType):
        return [(".__self__", obj.__self__)]
    if isinstance(obj, functools.partial):
        return [(".func", obj.func), (".args", obj.args), (".keywords", obj.keywords)]
    if isinstance(obj, dict):
        return [(f"[{key!r}]", value) for key, value in list(obj.items())[:_MAX_PARTS]]
    if isinstance(obj, (list, tuple)):
        return [(f"[{i}]", value) for i, value in enumerate(obj[:_MAX_PARTS])]
    if isinstance(obj, (set, frozenset)):
        return [(f"{{item {i}}}", value) for i, value in enumerate(list(obj)[:_MAX_PARTS])]
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        return [(f".{name}", value) for name, value in list(state.items())[:_MAX_PARTS]]
    return []


def find_unpicklable(obj: Any, dumps: Callable[[Any], Any] = pickle.dumps, path: str = "",
                     _depth: int = 0) -> tuple[str, Any, BaseException] | None:
    """``(path, part, error)`` for the innermost part of ``obj`` that does not pickle, or None."""
    try:
        dumps(obj)
        return None
    except Exception as exc:  # noqa: BLE001 - pickling can raise nearly anything
        error = exc
    if _depth < _MAX_DEPTH:
        for suffix, part in _parts(obj):
            found = find_unpicklable(part, dumps, path + suffix, _depth + 1)
            if found is not None:
                return found
    return path, obj, error


def _source(fn) -> str:
    code = getattr(fn, "__code__", None)
    return f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""


def describe(obj: Any) -> tuple[str, str]:
    """``(what it is, how to fix it)`` for an object that does not pickle."""
    target = obj.__func__ if isinstance(obj, types.MethodType) else obj
    kind = None
    if isinstance(target, types.FunctionType):
        kind = "the function"
    elif isinstance(target, type):
        kind = "the class"
    elif "<locals>" in getattr(type(obj), "__qualname__", ""):
        target, kind = type(obj), "an instance of class"  # the class is defined inside a function
    if kind is not None:
        module = getattr(target, "__module__", None) or "?"
        qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", "?")
        name = qualname.rsplit(".", 1)[-1]
        where = _source(target)
        if name == "<lambda>":
            return (f"a lambda in module {module}{where}",
                    "Write it as a function with def at module level and pass that function.")
        if "<locals>" in qualname:
            outer = qualname.split(".<locals>")[0]
            return (f"{kind} {name}, defined inside {outer}() in module {module}{where}",
                    f"Move {name} to module level (out of {outer}) so the ranks can import it as "
                    f"{module}.{name}.")
        return (f"{kind} {module}.{qualname}{where}",
                f"Define {name} at module level under that name (not replaced later, e.g. by a "
                f"decorator) in a module the ranks can import.")
    cls = type(obj)
    return (f"a {cls.__module__}.{cls.__qualname__} object",
            "Create it in setup(ctx), on each rank, instead of keeping it in the workload (open "
            "files, locks, sockets, processes and generators do not pickle).")


def unpicklable_message(obj: Any, subject: str, dumps: Callable[[Any], Any] = pickle.dumps) -> str | None:
    """A message naming the part of ``obj`` that does not pickle and the fix; None if it pickles.

    ``subject`` is how the message names ``obj`` (e.g. "the MyStep passed to task X").
    """
    found = find_unpicklable(obj, dumps)
    if found is None:
        return None
    path, part, error = found
    what, fix = describe(part)
    it = "it is" if not path else f"its part {path} is"
    reason = f"{type(error).__name__}: {error}"
    return (f"ddpbench: {subject} cannot be sent to the ranks: {it} {what}, which does not pickle "
            f"({reason}).\nFix: {fix}\n{_WHY}")


# ----------------------------------------------------------------------------------------------
# Rank side: what could not be loaded, and why
# ----------------------------------------------------------------------------------------------


class LoadFailure(Exception):
    """A rank could not import a class or function that the task refers to."""

    def __init__(self, module: str, name: str, error: BaseException):
        super().__init__(f"{module}.{name}: {type(error).__name__}: {error}")
        self.module, self.name, self.error = module, name, error


class TaskUnpickler(pickle.Unpickler):
    """``pickle.loads`` that says which module-level object (module, name) could not be loaded."""

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except Exception as exc:  # noqa: BLE001 - an import may raise anything
            raise LoadFailure(module, name, exc) from exc


def load_failure_message(failure: LoadFailure) -> str:
    """The message a rank sends back when it cannot load ``failure.module``.``failure.name``.

    It does not name the rank: every rank that fails the same way sends the same text, and the
    controller prints it once.
    """
    module, name, error = failure.module, failure.name, failure.error
    reason = f"{type(error).__name__}: {error}"
    head = f"{LOAD_FAILURE_PREFIX}{module}.{name} ({reason})."
    missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    if missing is not None and (module == missing or module.startswith(missing + ".")):
        fix = (f"Module {module!r} cannot be imported in the rank processes (interpreter "
               f"{sys.executable}). Put it where they can import it: in a directory on sys.path "
               f"(pytest's default import mode puts a test file's directory there; `pythonpath` in "
               f"pytest.ini or PYTHONPATH add directories; a module loaded from a file path with "
               f"importlib is not on it) or in an installed package (pip install -e .). On other "
               f"nodes the same code must be installed there.")
    elif isinstance(error, ImportError):
        fix = (f"Importing {module!r} in the ranks failed: the module is found but something it "
               f"imports is missing in the rank processes (interpreter {sys.executable}).")
    elif isinstance(error, AttributeError):
        fix = (f"Module {module!r} has no {name!r} when the ranks import it: define {name} at "
               f"module level under that name (objects created at run time, inside a function, "
               f"with exec, or renamed by a decorator, cannot be found by name).")
    else:
        detail = "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
        fix = f"Importing {module!r} in the ranks raised an exception:\n{detail}"
    return f"{head}\nFix: {fix}\n{_WHY}"
