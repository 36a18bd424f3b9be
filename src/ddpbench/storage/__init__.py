"""Saved runs, written and read in one place: :mod:`.writing` saves a run whole or not at all (its
names are re-exported here), :mod:`.records` declares the records ddpbench writes into one,
:mod:`.runs` reads a run back (``Run``, ``Case``, each record checked) and finds runs in a storage.
Importing the package loads only the writing side: the plugin does so in every session."""

from .writing import (
    RUN_NAME,
    SaveError,
    install,
    next_number,
    run_number,
    save_run,
    saved_run_files,
    serialise,
    unsaveable,
    write_json,
)

__all__ = ["RUN_NAME", "SaveError", "install", "next_number", "run_number", "save_run", "saved_run_files",
           "serialise", "unsaveable", "write_json"]
