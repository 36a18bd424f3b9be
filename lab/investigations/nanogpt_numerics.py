"""The numerics verdict on karpathy/nanoGPT's GPT, wrapped as a user's ``Workload`` (a tiny
config on CPU gloo, flash attention off so that attention runs nanoGPT's explicit path): A/A runs
against the first, and changes made here on purpose (a hand-written gradient all-reduce that
sums instead of averaging; flash attention back on, which only reorders the attention's sums).

nanoGPT's code is not part of this repository: its ``model.py`` is read at run time, from
``--model-py`` or from a git mirror of the repository (``--nanogpt-git-dir``, default the fetched
mirror below); without either the script says so and exits 0.

    .venv/bin/python lab/investigations/nanogpt_numerics.py
    .venv/bin/python lab/investigations/nanogpt_numerics.py --model-py ../nanoGPT/model.py --repeats 3
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import ddpbench

DEFAULT_GIT_DIR = "/work/.mirror/karpathy+nanoGPT/repo"


def _load_model_module(path: str):
    """nanoGPT's model.py as a module of its own (not on sys.path: read from where the user keeps it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NanoGPTStep(ddpbench.Workload):
    """One training step of nanoGPT's GPT with its own AdamW (``configure_optimizers``): DDP, or a
    hand-written all-reduce of the gradients (``average=False``: summed, the planted bug)."""

    def __init__(self, model_py: str, impl: str = "ddp", average: bool = True, flash: bool = False,
                 n_layer: int = 2, n_head: int = 2, n_embd: int = 64, block_size: int = 32,
                 vocab_size: int = 256, batch_size: int = 4):
        self.model_py, self.impl, self.average, self.flash = model_py, impl, average, flash
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.block_size, self.vocab_size, self.batch_size = block_size, vocab_size, batch_size

    def setup(self, ctx):
        import contextlib
        import io

        import torch
        from torch.nn.parallel import DistributedDataParallel

        nanogpt = _load_model_module(self.model_py)
        config = nanogpt.GPTConfig(block_size=self.block_size, vocab_size=self.vocab_size, n_layer=self.n_layer,
                                   n_head=self.n_head, n_embd=self.n_embd, dropout=0.0, bias=True)
        with contextlib.redirect_stdout(io.StringIO()):  # nanoGPT prints its parameter counts
            model = nanogpt.GPT(config)
            optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95),
                                                   device_type="cpu")
        # flash off: nanoGPT's own fallback, the explicit softmax(q k^T) v under its causal-mask buffer
        # (registered with flash on too, so that the two differ only in the attention's arithmetic)
        for module in model.modules():
            if isinstance(module, nanogpt.CausalSelfAttention):
                module.flash = self.flash
                if not hasattr(module, "bias"):
                    module.register_buffer("bias", torch.tril(torch.ones(self.block_size, self.block_size))
                                           .view(1, 1, self.block_size, self.block_size))
        generator = torch.Generator().manual_seed(1000 + ctx.rank)  # each rank its own batch
        tokens = torch.randint(self.vocab_size, (self.batch_size, self.block_size + 1), generator=generator)
        trained = DistributedDataParallel(model) if self.impl == "ddp" else model
        return {"ctx": ctx, "model": trained, "optimizer": optimizer,
                "x": tokens[:, :-1].contiguous(), "y": tokens[:, 1:].contiguous()}

    def run_round(self, state):
        import torch.distributed as dist

        _, loss = state["model"](state["x"], state["y"])
        state["optimizer"].zero_grad(set_to_none=True)
        loss.backward()
        if self.impl != "ddp":
            for param in state["model"].parameters():
                dist.all_reduce(param.grad)
                if self.average:
                    param.grad /= state["ctx"].world_size
        state["optimizer"].step()
        return loss.detach()


def model_py(args, scratch: Path) -> str | None:
    """Where nanoGPT's model.py is: ``--model-py``, else written out of the git mirror; None without."""
    if args.model_py:
        return args.model_py if Path(args.model_py).is_file() else None
    shown = subprocess.run(["git", f"--git-dir={args.nanogpt_git_dir}", "show", "HEAD:model.py"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    path = scratch / "model.py"
    path.write_text(shown.stdout)
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-py", help="nanoGPT's model.py (default: from --nanogpt-git-dir)")
    parser.add_argument("--nanogpt-git-dir", default=DEFAULT_GIT_DIR, help=f"a git dir of karpathy/nanoGPT "
                        f"(default {DEFAULT_GIT_DIR})")
    parser.add_argument("--repeats", type=int, default=5, help="A/A runs against the first (default 5)")
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()

    from ddpbench.gates.numerics import compare_numerics
    from ddpbench.pool import PoolSpec, RankPool
    from numerics import _magnitude, _numerics, _tensor_count  # this folder's numerics investigation

    import nanogpt_numerics as me  # the ranks import the workload class by this module's name

    with tempfile.TemporaryDirectory() as scratch:
        path = model_py(args, Path(scratch))
        if path is None:
            print(f"skipped: no nanoGPT model.py (give --model-py, or a git dir of karpathy/nanoGPT as "
                  f"--nanogpt-git-dir; {args.nanogpt_git_dir} is not one)")
            return 0
        pool = RankPool(PoolSpec("gloo", args.world_size, "cpu"))
        try:
            base = _numerics(pool, me.NanoGPTStep(path))
            tensors = _tensor_count(base)
            same = [compare_numerics(base, _numerics(pool, me.NanoGPTStep(path))).line for _ in range(args.repeats)]
            print(f"| nanoGPT A/A ({args.world_size} ranks, DDP, flash off) | runs | same (bitwise) | tensors per "
                  f"rank and step | replay spread |")
            print("|---|---|---|---|---|")
            print(f"| | {args.repeats} | {sum(s.startswith('same (bitwise)') for s in same)} | {tensors} | "
                  f"{base['replay_spread']} |")
            print("\n| change | verdict | relative difference | line |")
            print("|---|---|---|---|")
            manual = _numerics(pool, me.NanoGPTStep(path, impl="manual"))
            changes = (("DDP → hand-written all_reduce, averaged", base, manual),
                       ("planted: hand-written all_reduce summed, not averaged", manual,
                        _numerics(pool, me.NanoGPTStep(path, impl="manual", average=False))),
                       ("flash attention off → on (scaled_dot_product_attention)", base,
                        _numerics(pool, me.NanoGPTStep(path, flash=True))))
            for label, before, after in changes:
                verdict = compare_numerics(before, after)
                print(f"| {label} | {verdict.verdict} | {_magnitude(verdict.line)} | {verdict.line} |")
        finally:
            pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
