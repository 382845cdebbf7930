"""Converters between checkpoint formats; Megatron modules import torch and megatron-core."""
