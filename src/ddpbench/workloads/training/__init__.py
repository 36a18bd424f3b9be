"""Full training loops (hand-written all-reduce, DDP, Lightning, DataParallel) and the transformer
family (DDP and FSDP2) (docs/design/families.md#training-loops, docs/design/families.md#transformers)."""

from .lightning import lightning_unavailable_reason
from .loops import LOOPS, make_buckets, reduce_gradients
from .models import IMAGE_SHAPE, IMPLS, MODELS, NUM_CLASSES, SEQ_LEN, VOCAB, build_model, flat_parameters, make_data
from .step_check import check_rtol, reference_step
from .transformer import TransformerTraining
from .workload import Training

__all__ = ["IMAGE_SHAPE", "IMPLS", "LOOPS", "MODELS", "NUM_CLASSES", "SEQ_LEN", "VOCAB", "Training",
           "TransformerTraining", "build_model", "check_rtol", "flat_parameters", "lightning_unavailable_reason", "make_buckets", "make_data",
           "reduce_gradients", "reference_step"]
