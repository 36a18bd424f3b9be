"""tinyddp: a stand-in for your own project -- a small model and its DDP training step."""
