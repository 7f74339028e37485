#!/usr/bin/env python3
"""Plot a sweep JSON file::

    python bench/plot.py results/sweep-2ranks.json results/sweep-2ranks.png [--busbw]

The code lives in shmcoll/sweep_plot.py (shipped with the package, like the sweep, so that
``python -m shmcoll bench`` can draw its plot); ``--help`` lists the options.
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("shmcoll.sweep_plot", run_name="__main__", alter_sys=True)
