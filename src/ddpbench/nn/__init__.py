"""Modules that users import: :class:`~ddpbench.nn.syncbn.FusedSyncBatchNorm`, a SyncBatchNorm that
also runs on CPU with gloo, with two collectives per training step."""
