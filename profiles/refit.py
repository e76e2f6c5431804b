"""Recompute a profile's collective fits from the medians it stores, without measuring again.

    python -m profiles.refit profiles/data/cpu-gloo-2proc.json            # in place
    python -m profiles.refit old.json --out new.json

Reads any schema version ``load_profile`` accepts, writes the current one, and records the refit
(date and command) under ``provenance["refit"]``; the measured medians are kept as they were.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from datetime import datetime, timezone

from .build import refit_collectives
from .io import load_profile, write_profile
from .schema import SCHEMA_VERSION, HardwareProfile


def refit_profile(profile: HardwareProfile, command: str, date: str) -> HardwareProfile:
    """``refit_collectives`` plus the provenance entry that says so."""
    provenance = {**profile.provenance, "refit": {
        "date": date, "command": command, "schema_version": SCHEMA_VERSION,
        "what": "collective fits recomputed from the stored medians; nothing re-measured"}}
    return replace(refit_collectives(profile), provenance=provenance)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m profiles.refit", description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="profile JSON to read")
    parser.add_argument("--out", help="where to write (default: over the input, atomically)")
    args = parser.parse_args(argv)
    command = "python -m profiles.refit " + " ".join(sys.argv[1:] if argv is None else argv)
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_profile(args.out or args.profile, refit_profile(load_profile(args.profile), command, date))


if __name__ == "__main__":
    main()
