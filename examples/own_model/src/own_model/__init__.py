"""own_model: a stand-in for your own project -- its models, data and LightningModule, unchanged
by being benchmarked."""
