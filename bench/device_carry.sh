#!/usr/bin/env bash
# Prepares, on a machine with PyPI, everything a call on the lent many-core machine needs (offline, Python 3.12
# x86-64, its own torch), in one folder the call carries:
#
#   bash bench/device_carry.sh [BASE_COMMIT]     # fills .carry/ (about 30 MiB with a BASE)
#
# then one device call (the `device` tool's run, carry [".carry"]), from the repository root:
#
#   bash .carry/run.sh                                   # bench/threads.sh's default parts, BASE in the same job
#   PARTS="split pinned" bash .carry/run.sh              # any threads.sh settings pass through
#
# What it holds: this tree's extensions built for CPython 3.12 here (the machine's compiler then has nothing to
# do; a build there costs a minute of device time), a dist-info that gives the `torch.backends` entry point
# without pip, DeepSpeed's wheels (bench/deepspeed_wheels.sh) for the peers part, and BASE_COMMIT's tree
# built the same way (threads.sh's BASE). Results go under the call's $OUT. Needs a python3.12 on PATH or in
# PYTHON312.
set -euo pipefail
cd "$(dirname "$0")/.."
PY312=${PYTHON312:-$(command -v python3.12 || true)}
[ -n "$PY312" ] || { echo "device_carry: needs Python 3.12 (PYTHON312=...)" >&2; exit 2; }
carry=.carry
rm -rf "$carry" && mkdir -p "$carry"
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"$PY312" -m venv "$venv" && "$venv/bin/pip" install -q cython setuptools

build() {  # a tree (git archive of a commit) -> its extensions, built in place for 3.12
    local commit=$1 dest=$2
    mkdir -p "$dest" && git archive "$commit" | tar -x -C "$dest"
    (cd "$dest" && "$venv/bin/python" setup.py -q build_ext --inplace >build.log 2>&1 ||
        { cat build.log >&2; exit 1; }; rm -rf build build.log tests docs examples _ext/*.c)
}
build HEAD "$venv/head"
mkdir -p "$carry/ext" && cp "$venv"/head/src/shmcoll/*.cpython-312-*.so "$carry/ext/"
[ -z "${1:-}" ] || build "$1" "$carry/base"
git rev-parse HEAD > "$carry/commit"
[ -z "${1:-}" ] || git rev-parse "$1" > "$carry/base-commit"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
info="$carry/site/shmcoll-$version.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: shmcoll\nVersion: %s\n' "$version" > "$info/METADATA"
sed -n '/^\[project.entry-points."torch.backends"\]/,/^$/p' pyproject.toml | grep -v '^#' |
    sed 's/^\[project.entry-points."torch.backends"\]/[torch.backends]/; s/"//g' > "$info/entry_points.txt"

WHEELS="$carry/whl" bash bench/deepspeed_wheels.sh 2>/dev/null

cat > "$carry/run.sh" <<'RUN'
# On the lent machine, from the repository root: this tree's extensions in place, shmcoll, its benchmarks'
# package (bench/src) and DeepSpeed found through PYTHONPATH, then bench/threads.sh (BASE: the carried base
# tree, if any) with results under $OUT.
set -uo pipefail
mkdir -p "${OUT:-results}"
cp .carry/ext/*.so src/shmcoll/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/whl/*.whl
export PYTHONPATH=$PWD/src:$PWD/bench/src:$PWD/.carry/site:/tmp/site PYTHON=python3 RESULTS=${OUT:-results}/threads
[ -d .carry/base ] && export BASE=${BASE:-.carry/base}
echo "head $(cat .carry/commit)${BASE:+, base $(cat .carry/base-commit)}" >&2
python3 -c "import torch, shmcoll, torch.distributed as d; print('torch', torch.__version__, 'shm registered:', 'shm' in d.Backend.backend_list)"
bash bench/threads.sh 2>&1 | tee -a "${OUT:-results}/threads.log"
RUN
du -sh "$carry" >&2
