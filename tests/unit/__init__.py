"""Unit tests: one layer at a time, in this process (no ranks, no torch.distributed group)."""
