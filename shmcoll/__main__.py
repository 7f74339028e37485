"""``python -m shmcoll``: maintenance and diagnostics commands."""
from __future__ import annotations

import argparse
import sys
import time


def _warm(_args) -> int:
    """Compile (or load from Numba's on-disk cache) every reduction kernel."""
    from shmcoll import kernels

    start = time.perf_counter()
    kernels.warm()
    print(f"shmcoll: {len(kernels.DTYPES)} reduction kernels ready in {time.perf_counter() - start:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmcoll", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("warm", help=_warm.__doc__).set_defaults(run=_warm)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
