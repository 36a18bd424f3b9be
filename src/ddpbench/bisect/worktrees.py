"""Each commit's git worktree in bisect's scratch folder, set up once with --setup, and their
removal at the end."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .inputs import Checkout, Options
from .processes import Children, child_env, git
from .terminal import log_tail, printable


class Unavailable(Exception):
    """A commit bisect cannot run: its worktree cannot be checked out (a probe: skipped)."""


class Worktrees:
    """The commits' worktrees under ``scratch`` (GOOD's is ``good``, the others their short sha);
    ``scratch`` also holds the runs' logs and is removed with them (:meth:`remove_all`)."""

    def __init__(self, checkout: Checkout, options: Options, scratch: Path, children: Children):
        self.checkout = checkout
        self.options = options
        self.scratch = scratch
        self.children = children
        self.roots: dict[str, Path] = {}  # commit -> its worktree, once added
        self.built: dict[str, bool] = {}  # commit -> whether --setup succeeded there
        self.unavailable: dict[str, str] = {}  # commit -> why its worktree could not be made

    def root(self, sha: str) -> Path:
        """The commit's worktree, made once; :class:`Unavailable` when git cannot check it out
        (an LFS or other filter failing, a missing object)."""
        if sha in self.unavailable:
            raise Unavailable(self.unavailable[sha])
        if sha not in self.roots:
            path = self.scratch / ("good" if sha == self.checkout.good else sha[:12])
            self.roots[sha] = path  # registered first: removed even if the add is interrupted
            added = git(self.checkout.top, "worktree", "add", "--detach", "--quiet", str(path), sha, check=False)
            if added.returncode != 0:
                why = " | ".join(line.strip() for line in added.stderr.splitlines() if line.strip())
                self.unavailable[sha] = f"git worktree add failed (exit {added.returncode}): {printable(why)[-300:]}"
                raise Unavailable(self.unavailable[sha])
        return self.roots[sha]

    def build(self, sha: str) -> str:
        """Makes the commit's worktree and runs --setup once in it; '' when it worked, else why not
        (its worktree, the folder bisect runs in, --setup, the interpreter)."""
        try:
            root = self.root(sha)
        except Unavailable as exc:
            return str(exc)
        if not self.cwd(sha).is_dir():
            return (f"the folder bisect runs in ({printable(self.checkout.prefix.rstrip('/'))}) does not exist at "
                    f"this commit")
        setup = self.options.setup
        log = self.scratch / f"setup-{sha[:12]}.log"
        if setup and sha not in self.built:
            self.built[sha] = self.children.run(["bash", "-c", setup], root, log) == 0
        if setup and not self.built[sha]:
            return f"--setup failed (exit status not 0): {log_tail(log)}"
        python = self.python(sha)
        if not Path(python).exists():
            return f"no interpreter {python} (--python) after --setup"
        return ""

    def python(self, sha: str) -> str:
        """The interpreter of the commit's runs: --python in its worktree, else this one."""
        return str(self.root(sha) / self.options.python) if self.options.python else sys.executable

    def cwd(self, sha: str) -> Path:
        """Where the commit's runs start: the folder bisect runs in, in its worktree."""
        return self.root(sha) / self.checkout.prefix

    def env(self, sha: str) -> dict:
        """The environment of the commit's runs; with a src layout its own package first."""
        env = child_env()
        src = self.root(sha) / "src"
        if src.is_dir():
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
        return env

    def remove_all(self) -> None:
        """Removes every worktree and the scratch folder, and prunes what git kept of them."""
        for path in self.roots.values():
            git(self.checkout.top, "worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(self.scratch, ignore_errors=True)
        git(self.checkout.top, "worktree", "prune", check=False)
