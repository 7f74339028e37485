#!/usr/bin/env bash
# Prepares, on a machine with PyPI, what bench/peer_deepspeed.py needs of DeepSpeed on an offline machine
# with Python 3.12 (x86-64) and torch already installed (the lent many-core machine):
#
#   bash bench/deepspeed_wheels.sh       # fills .whl/ at the repository root (about 5 MiB), or WHEELS=DIR
#                                        # (bench/device_carry.sh uses it so)
#
# and there, from the repository root (.whl/ travels with the checkout: list it in .git/info/exclude and
# name it in the run's carry):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   python3 -m torch.distributed.run --nproc_per_node=4 bench/peer_deepspeed.py --threads 4 --json $OUT/peer.json
#
# DeepSpeed publishes only an sdist. Its wheel is built here from it (pure Python, py3-none-any) without
# torch: its setup.py then compiles no op, so the wheel holds C++ sources that the first call compiles
# there with the machine's C++ compiler and ninja (a minute or more), against whichever torch it finds.
# Of its Requires-Dist (einops hjson msgpack ninja numpy packaging psutil py-cpuinfo pydantic torch
# tqdm) the device already had all but hjson and pydantic; pydantic brings pydantic-core (compiled,
# hence cp312 manylinux), annotated-types and typing-inspection, and wants a typing-extensions newer
# than torch needs, so that goes too (newer is backwards compatible: torch is content with it).
# Versions are the ones bench/peer_deepspeed.py was checked with; pydantic pins pydantic-core exactly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
DEEPSPEED=${DEEPSPEED_VERSION:-0.19.8}
DEPS="hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
      typing-extensions==4.16.0"
WHEELS=${WHEELS:-.whl}
mkdir -p "$WHEELS"
sdist=$(mktemp -d)
trap 'rm -rf "$sdist"' EXIT
"$PY" -m pip download -q --no-deps --no-binary=:all: -d "$sdist" "deepspeed==$DEEPSPEED"
# Build isolation keeps torch out of the build (see above) and fetches only setuptools.
"$PY" -m pip wheel -q --no-deps -w "$WHEELS" "$sdist"/deepspeed-"$DEEPSPEED".tar.gz
for req in $DEPS; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$WHEELS" "$req"
done
ls -l "$WHEELS" >&2
du -sh "$WHEELS" >&2
