"""Intra-node data-movement plans, one collective per module.

Each function takes the node's Arena and raw addresses/byte counts (no torch),
so every rank derives the same sequence of steps from the same arguments.
"""
