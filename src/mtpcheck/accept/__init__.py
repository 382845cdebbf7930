"""``mtpcheck accept``: offline MTP acceptance rate per workload (torch + transformers)."""
