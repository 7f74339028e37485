#!/usr/bin/env bash
# The test suite on each supported torch, every one in a virtual environment of its own (TESTING.md, "Every torch"):
#
#   bash tests/matrix.sh                     the whole suite on every release src/shmcoll/torch_releases.py lists
#   bash tests/matrix.sh 2.16.0              the whole suite on that torch (a new release: TESTING.md, "A new torch")
#   bash tests/matrix.sh --compat            the compatibility tier (pytest -m compat) on the oldest and the newest
#                                            release: CI's legs (.ci/run)
#   bash tests/matrix.sh --setup-only ...    make the environments, run nothing (CI makes them while the main suite runs)
#   bash tests/matrix.sh 2.15.0 -- -x tests/test_profiler.py      arguments after -- go to pytest
#
# torch <version> lives in .venv-torch-<version> (ignored by git), kept for the next run: torch is installed once;
# shmcoll is installed from this tree as `pip install '.[test]'` installs it (keeping that torch), with the
# benchmarks' package that the tests of the sweep import (bench/), again whenever the tree has changed. Each leg
# prints the torch it ran and pytest's counts (its whole output goes to results/matrix/torch-<version>.log); the
# script exits non-zero if any leg failed, and says which torch.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

tier=whole setup_only=0 versions=() pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --compat) tier=compat ;;
        --setup-only) setup_only=1 ;;
        --) shift; pytest_args=("$@"); break ;;
        -*) echo "tests/matrix.sh: unknown option $1 (see the comment at its top)" >&2; exit 2 ;;
        *) versions+=("$1") ;;
    esac
    shift
done
read -r -a releases <<< "$("$PYTHON" src/shmcoll/torch_releases.py)"
if [ ${#versions[@]} -eq 0 ]; then
    if [ $tier = compat ]; then versions=("${releases[0]}" "${releases[-1]}"); else versions=("${releases[@]}"); fi
fi
marker=()
[ $tier = compat ] && marker=(-m compat)
mkdir -p results/matrix

# The files a clone of this tree has (tracked, and new ones git does not ignore): shmcoll is built from a copy of
# those, never in the tree itself, so a leg's build cannot collide with .venv's (CI builds both at once), and
# build products lying in the tree cannot hide a broken package.
tree_files() {
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done
}

setup() {  # version: .venv-torch-<version> with that torch and this tree's shmcoll
    local version=$1 venv=.venv-torch-$1 log=results/matrix/setup-torch-$1.log
    # Every pip call of a leg is held to its torch: nothing it installs (the test extra's libraries) may move it,
    # and a site's own constraint on torch (this project's machines cap it at the releases on their disk) must not
    # refuse it. PIP_CONSTRAINT replaces the constraint file pip's configuration names.
    export PIP_CONSTRAINT=$PWD/$venv/torch-constraint.txt
    if [ "$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" != "$version" ]; then
        rm -rf "$venv" && "$PYTHON" -m venv "$venv" && echo "torch==$version" > "$PIP_CONSTRAINT" &&
            "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$version" >> "$log" 2>&1 ||
            { echo "torch $version: could not install torch==$version into $venv (see $log)"; tail -5 "$log"; return 1; }
    fi
    echo "torch==$version" > "$PIP_CONSTRAINT"
    local tree copy
    tree=$(tree_files | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$venv/shmcoll-tree" 2>/dev/null)" != "$tree" ]; then
        copy=$(mktemp -d)
        tree_files | tar --null -T - -cf - | tar -xf - -C "$copy"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check "$copy[test]" >> "$log" 2>&1 &&
            "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$copy/bench" >> "$log" 2>&1 &&
            "$venv/bin/python" -m shmcoll warm >> "$log" 2>&1 && echo "$tree" > "$venv/shmcoll-tree"
        local status=$?
        rm -rf "$copy"
        [ $status -eq 0 ] || { echo "torch $version: could not install shmcoll into $venv (see $log)"; tail -5 "$log"; return 1; }
    fi
}

leg() {  # version: the tier on that torch
    local version=$1 venv=.venv-torch-$1 log=results/matrix/torch-$1.log
    local torch
    torch=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
    local what="the whole suite"
    [ $tier = compat ] && what="the compatibility tier"
    [ ${#pytest_args[@]} -gt 0 ] && what="$what, pytest ${pytest_args[*]}"
    echo "=== torch $torch ($venv): $what"
    "$venv/bin/python" -m pytest -ra -p no:cacheprovider "${marker[@]}" "${pytest_args[@]}" > "$log" 2>&1
    local status=$?
    grep -E "^(FAILED|ERROR) " "$log"
    echo "=== torch $torch: $(counts "$version")$([ $status -eq 0 ] || echo " -- FAILED (exit $status; output in $log)")"
    return $status
}

counts() {  # version: pytest's last line of its leg ("1118 passed, 3 skipped, 5 deselected in 1000.00s")
    tail -1 "results/matrix/torch-$1.log" | sed -E 's/^=+ //; s/ =+$//'
}

failed=() summary=()
for version in "${versions[@]}"; do
    if ! setup "$version"; then
        failed+=("$version") summary+=("torch $version: the environment could not be made")
        continue
    fi
    [ $setup_only = 1 ] && continue
    if leg "$version"; then
        summary+=("torch $version: passed: $(counts "$version")")
    else
        failed+=("$version") summary+=("torch $version: FAILED: $(counts "$version")")
    fi
done
[ $setup_only = 1 ] && [ ${#failed[@]} -eq 0 ] && exit 0
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "tests/matrix.sh: failed on torch ${failed[*]}"
    exit 1
fi
