"""Full training loops: hand-written all-reduce vs torch DDP vs PyTorch Lightning (vs DataParallel).

Everything runs inside the pool's rank processes; the timing engine calls the :class:`Training`
workload's hooks and never knows what a round does. A recorded round is **one optimizer step**:
``grad_accum`` micro-batches of ``batch_size`` samples each on every rank, then one update.

Models (no downloads; data is synthetic and deterministic):

* ``mlp``  - 3072 -> 256 -> 100 on CIFAR-100-shaped images (3x32x32, 100 classes);
* ``cnn``  - two 3x3 conv + max-pool stages (16, 32 channels) and a linear head, same data;
* ``lstm`` - character-level: embedding 32, one LSTM layer of 128, next-character head over a
  64-symbol alphabet, sequences of :data:`SEQ_LEN` characters.

Image labels come from a fixed random linear "teacher" (the same on every rank) and characters
from a fixed random Markov chain, so the loss really goes down. Each rank draws *different*
samples (the generator is seeded from ``(seed, rank)``) and models are initialised from a
rank-dependent seed too: every implementation must broadcast rank 0's parameters and reduce
gradients correctly, or the ranks drift apart and :meth:`Training.check` fails the case.

The check (after the timed rounds, untimed) also runs one more optimizer step and compares it with
:func:`reference_step`, a single-process float64 step on every rank's micro-batches of that step,
gathered: the gradient each parameter holds after the step must be the global-batch average and the
parameters must have moved by the SGD-with-momentum update it implies. A reduction that sums without
dividing by the world size, zeroed gradients or a skipped optimizer step keep the ranks equal and
fail here (tests/workloads/training/test_training_parity.py runs each), at world size 1 too.

Implementations:

* ``manual``: broadcast rank 0's parameters and buffers once; per step, forward/backward on each
  micro-batch (loss / grad_accum, gradients summed locally by autograd), then flatten the
  gradients into buckets of at most ``bucket_cap_mb`` (in reverse registration order, like DDP),
  one ``all_reduce`` per bucket, divide by the world size, copy back, optimizer step;
* ``ddp``: :class:`torch.nn.parallel.DistributedDataParallel` with the same bucket cap, the first
  ``grad_accum - 1`` micro-steps inside ``no_sync()``;
* ``lightning``: a ``pytorch_lightning.Trainer(strategy="ddp")`` attached to the rank's existing
  process group through the torchelastic environment variables (see :class:`_LightningLoop` for
  how a round maps onto one long ``Trainer.fit``);
* ``dataparallel``: :class:`torch.nn.DataParallel` over every visible GPU in one process (CUDA
  pools of world size 1 only), global batch = ``batch_size`` x GPU count.

All use SGD with momentum, the same learning rate and ``zero_grad(set_to_none=True)``.

Memory: the engine's memory census (``extra_info["memory"]``, :mod:`ddpbench.engine.memory`)
counts one untimed step of every implementation alike: the peak of live tensor bytes per rank and
what held them (parameters, gradients, optimizer state, activations, temporaries, DDP's bucket
copies). On CUDA the engine also reports ``torch.cuda.max_memory_allocated`` over the recorded
rounds (``peak_memory_bytes``, and ``memory.measured``). ``gradient_as_bucket_view=True`` (DDP)
makes the gradients views into DDP's buckets: the census then shows no bucket copy. Lightning's
Trainer steps on a thread of its own, which the census does not see.

The transformer family (:class:`TransformerTraining`: a GPT-style decoder, DDP knobs and FSDP2, bf16,
torch.compile) lives in :mod:`.transformer` (workload and check), :mod:`.gpt` (model and token
data) and :mod:`.metrics` (tokens/s, FLOPs, MFU, memory: the training metrics in one module).
"""

from .lightning import lightning_unavailable_reason
from .loops import LOOPS, make_buckets, reduce_gradients
from .models import IMAGE_SHAPE, IMPLS, MODELS, NUM_CLASSES, SEQ_LEN, VOCAB, build_model, flat_parameters, make_data
from .reference import check_rtol, reference_step
from .transformer import TransformerTraining
from .workload import Training

__all__ = ["IMAGE_SHAPE", "IMPLS", "LOOPS", "MODELS", "NUM_CLASSES", "SEQ_LEN", "VOCAB", "Training",
           "TransformerTraining", "build_model", "check_rtol", "flat_parameters", "lightning_unavailable_reason", "make_buckets", "make_data",
           "reduce_gradients", "reference_step"]
