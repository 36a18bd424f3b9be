"""Dataset storage sharing: how a dataset's layout decides the cost of handing it to spawned ranks.

The controller builds a dataset in one of these layouts:

* ``list``    -- a Python list of tensors (the reported case: one shared storage per sample);
* ``stacked`` -- one N x C x H x W tensor (the reports' baseline; fixed-size samples only);
* ``packed``  -- :class:`ddpbench.PackedTensorDataset`: one storage + offsets/shapes index;
* ``numpy``   -- a Python list of numpy arrays (pickled by value: no shared memory, one copy per rank);
* ``mmap``    -- the packed layout written to a file and memory-mapped by every rank (only the path
  and the small index travel; the page cache is shared).

:class:`DatasetEpoch` is the case's descriptor. ``DatasetEpoch.handed_over(spec, strategy, ...)``
builds the dataset in the controller and carries it to the ranks inside the workload itself, the
way ``mp.spawn`` carries its arguments: when the pool pickles the task for a rank, the dataset is
pickled with ``ForkingPickler`` under the chosen sharing strategy (torch.multiprocessing's
shared-memory reductions), and the rank opens it in ``setup``. Every pool that runs the workload
gets it that way, so A/B mode's two sides each receive their own copy, and nothing is left in the
ranks once the task ends. ``DatasetEpoch.built_in_ranks(spec, ...)`` is the control without a
handover: each rank builds the same samples itself.

File-descriptor budget. Under ``file_descriptor`` every shared storage is one descriptor: the
receiver keeps one per storage, and the sender keeps one per storage plus one duplicate per
storage per receiver until the receiver fetches it from the sender's ``multiprocessing``
resource-sharer thread. Running out of descriptors on either side ends, in plain torch, in EMFILE
and a receiver blocked forever; here both sides check before any descriptor moves
(:class:`DatasetShareError` names the cause and the fixes), an EMFILE that happens anyway is turned
into the same error, and the sender closes every duplicate a receiver did not fetch
(:meth:`DatasetEpoch.close`, also run when the workload is garbage-collected).
"""

from .checksums import SampleChecksums
from .epoch import COLLATES, SAMPLERS, WORKER_START_METHODS, DatasetEpoch
from .handover import shared_storage_count
from .layouts import FIXED_SHAPE, LAYOUTS, REPORT_SHAPE, BuiltDataset, DatasetSpec, MappedPackedDataset, build_dataset
from .resources import STRATEGIES, DatasetShareError, open_fd_count, sharing_strategy, torch_shm_files

__all__ = ["COLLATES", "FIXED_SHAPE", "LAYOUTS", "REPORT_SHAPE", "SAMPLERS", "STRATEGIES", "WORKER_START_METHODS",
           "BuiltDataset", "DatasetEpoch", "DatasetShareError", "DatasetSpec", "MappedPackedDataset",
           "SampleChecksums", "build_dataset", "open_fd_count", "shared_storage_count", "sharing_strategy",
           "torch_shm_files"]
