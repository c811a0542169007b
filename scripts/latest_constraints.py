"""Write ``constraints-latest.txt``: every package ``constraints.txt`` pins, at the newest release PyPI serves for
this Python (torch stays pinned: it is installed first, and only the CPU build of the pinned version is on disk).

    python scripts/latest_constraints.py          # ask PyPI, write constraints-latest.txt, print what moved
    python scripts/latest_constraints.py --same   # exit 0 when both files pin the same versions (no network)

``make latest`` runs the default suite on the file; raise ``constraints.txt`` (and ``pyproject.toml``'s upper
bounds) to the versions that pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
PINNED = ROOT / "constraints.txt"
LATEST = ROOT / "constraints-latest.txt"
KEEP = {"torch"}  # installed first from the pinned CPU build
HEADER = (
    "# The newest releases PyPI serves for Python {python} of what constraints.txt pins (torch kept), written by\n"
    "# scripts/latest_constraints.py; `make latest` runs the default suite on them.\n"
)


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = (part.strip() for part in line.split("==", 1))
            found[name.lower()] = version
    return found


def newest(name: str, timeout: float = 30.0) -> str:
    """The newest final release of ``name`` whose files all say they run on this Python."""
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=timeout) as response:  # noqa: S310
        data = json.load(response)
    python = Version(".".join(map(str, sys.version_info[:3])))
    best = None
    for text, files in data["releases"].items():
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if version.is_prerelease or not files or any(f.get("yanked") for f in files):
            continue
        requires = {f.get("requires_python") or "" for f in files}
        if all(r and python not in SpecifierSet(r) for r in requires):
            continue
        best = version if best is None or version > best else best
    if best is None:
        raise RuntimeError(f"PyPI has no release of {name} for Python {python}")
    return str(best)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--same", action="store_true", help="exit 0 if both files pin the same versions, else 1")
    args = parser.parse_args()
    pinned = pins(PINNED)
    if args.same:
        return 0 if LATEST.exists() and pins(LATEST) == pinned else 1
    lines = [HEADER.format(python=".".join(map(str, sys.version_info[:2])))]
    for name, version in pinned.items():
        latest = version if name in KEEP else newest(name)
        if latest != version:
            sys.stdout.write(f"{name}: {version} -> {latest}\n")
        lines.append(f"{name}=={latest}\n")
    LATEST.write_text("".join(lines))
    sys.stdout.write(f"wrote {LATEST}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
