"""mtpcheck: prove that a checkpoint's Multi-Token-Prediction layers survive."""

__version__ = "0.1.0"
