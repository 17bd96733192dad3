"""trioserve: a PyTorch model server on Trio, wire-compatible with TorchServe."""

__version__ = "0.1.0"
