"""A no-op archive: the served path's ceiling (TorchServe frontend + Python worker, no model)."""
