"""Dataset storage sharing: how a dataset's layout decides the cost of handing it to spawned ranks
(docs/design/families.md#dataset-storage-sharing)."""

from .checksums import SampleChecksums
from .epoch import COLLATES, SAMPLERS, WORKER_START_METHODS, DatasetEpoch
from .handover import shared_storage_count
from .layouts import FIXED_SHAPE, LAYOUTS, REPORT_SHAPE, BuiltDataset, DatasetSpec, MappedPackedDataset, build_dataset
from .resources import STRATEGIES, DatasetShareError, open_fd_count, sharing_strategy, torch_shm_files

__all__ = ["COLLATES", "FIXED_SHAPE", "LAYOUTS", "REPORT_SHAPE", "SAMPLERS", "STRATEGIES", "WORKER_START_METHODS",
           "BuiltDataset", "DatasetEpoch", "DatasetShareError", "DatasetSpec", "MappedPackedDataset",
           "SampleChecksums", "build_dataset", "open_fd_count", "shared_storage_count", "sharing_strategy",
           "torch_shm_files"]
