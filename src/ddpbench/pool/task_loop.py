"""The loop every rank runs once it has joined its process group, whoever started it (a local pool
or torchrun): receive a task, run it, send back its result or traceback."""

from __future__ import annotations

import io
import sys
import traceback

from .base import RankContext, TaskError
from .lightning_guard import guard_lightning_trainers
from .picklecheck import LoadFailure, TaskUnpickler, load_failure_message


def serve_tasks(conn, ctx: RankContext) -> None:
    """The rank's task loop: receive a task, run it, send back its result or traceback."""
    guard_lightning_trainers()  # a Trainer made in a task must not launch processes or play another rank
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        _, task_id, sys_path, payload = message
        del message
        for entry in sys_path:
            if entry not in sys.path:
                sys.path.append(entry)
        reply = _run_task(ctx, task_id, payload)
        del payload
        try:
            conn.send(reply)
        except Exception:  # the result could not be pickled
            conn.send(("error", task_id, "the task's return value could not be sent back:\n"
                       + traceback.format_exc()))


def _run_task(ctx: RankContext, task_id: int, payload: bytes) -> tuple:
    """Load and run one task; its arguments are freed when this returns, not when the next task
    replaces them (a dataset a task received lets go of its memory and descriptors at once)."""
    try:
        fn, args, kwargs = TaskUnpickler(io.BytesIO(payload)).load()
        return ("ok", task_id, fn(ctx, *args, **kwargs))
    except LoadFailure as failure:  # a class or function the task names cannot be imported here
        return ("error", task_id, load_failure_message(failure))
    except TaskError as exc:  # its message says it all
        return ("error", task_id, f"{type(exc).__name__}: {exc}")
    except BaseException:  # noqa: BLE001 - everything goes back to the controller
        return ("error", task_id, traceback.format_exc())
