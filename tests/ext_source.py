"""Constants of the C extensions that Python cannot see (enum members of _ext/*.pyx, *.pxi), read from their
source, for tests that check the memory they lay out."""
import pathlib
import re

EXT = pathlib.Path(__file__).parents[1] / "_ext"


def constant(file: str, name: str) -> int:
    """``name = <int>`` in ``_ext/<file>``, which must define it once."""
    found = re.findall(rf"\b{name}\s*=\s*(\d+)\b", (EXT / file).read_text())
    assert len(found) == 1, f"_ext/{file} defines {name} {len(found)} times"
    return int(found[0])
