#!/usr/bin/env python3
"""The table of an A/B run: mhccl-bench JSON files of several builds, each run in rounds.

`scripts/device-session.sh abtree` runs every build's mhccl-bench in turn, AB_ROUNDS times,
and writes `abtree-<tree>-<round>.json`; each file records the commit (or the tree's name) it
was built from. This script groups the files by that name (or by NAME=FILE given on the command
line), takes the mean over a build's rounds of each row's median, and prints one Markdown row a
(op, protocol, M, TP): each build's mean, and every build's difference to the base build (the
first one, or --base) in us and percent. `spread` is the largest difference between two rounds
of one build in that row: a difference below it is not a measured one (docs/PERFORMANCE.md
reads two rounds alternated so).

  python3 bench/ab_table.py out/abtree-*.json
  python3 bench/ab_table.py --base c88a03e --m 1,8,64 --protocol two-shot out/abtree-*.json
  python3 bench/ab_table.py main=a-1.json main=a-2.json old=b-1.json old=b-2.json

The Lamport floor (the bench's `lamport_floor_us`, one a M) gets a row of its own. Rows that
only some builds have are printed with "-" for the others. Exit status 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import OrderedDict, defaultdict


def row_key(row: dict) -> tuple | None:
    """(op, protocol, M, TP) of a timed row; None for rows that are not timings. A row with no M
    (the launch and row floors, timed once a run) has M 0, printed as "-"."""
    if "us_median" not in row or row.get("us_median") is None:
        return None
    op = row["op"].split(".")[-1]
    if row.get("variant") not in (None, "plain"):
        op += " " + row["variant"]
    # A simulated row ("simulated": true) carries its simulated group's size in "tp" (2 or 4),
    # though the run's pass was TP=1: a TP = 2 and a TP = 4 row of one case are two rows.
    return (op, row.get("protocol", ""), int(row.get("m", 0)), int(row.get("tp", 1)))


class Unreadable(Exception):
    """A file that is not an mhccl-bench JSON file, or a row of one that is malformed."""


def load(files: list[str]) -> "OrderedDict[str, list[dict]]":
    """Build name -> one {key: us} per round, in the order the builds first appear. Raises
    Unreadable naming the file (and the row) it cannot read."""
    builds: "OrderedDict[str, list[dict]]" = OrderedDict()
    for arg in files:
        name, sep, path = arg.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):  # a path, which may hold "="
            name, path = "", arg
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise Unreadable(f"{path}: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
            raise Unreadable(f"{path}: not an mhccl-bench JSON file (no 'rows')")
        name = name or str(doc.get("commit", path))
        times: dict = {}
        floors: dict = {}
        for i, row in enumerate(doc["rows"]):
            try:
                key = row_key(row)
                if key is None:
                    continue
                times[key] = float(row["us_median"])
                if row.get("lamport_floor_us") is not None:
                    floors[(key[2], key[3])] = float(row["lamport_floor_us"])  # (M, TP)
            except (AttributeError, KeyError, TypeError, ValueError) as e:  # e.g. "tp": null
                raise Unreadable(f"{path}: row {i}: {type(e).__name__}: {e}") from None
        for (m, tp), us in floors.items():
            times[("lamport floor", "", m, tp)] = us
        builds.setdefault(name, []).append(times)
    return builds


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="mhccl-bench JSON files (NAME=FILE names the build)")
    ap.add_argument("--base", help="the build the differences are to (default: the first)")
    ap.add_argument("--m", help="only these M (comma list)")
    ap.add_argument("--protocol", help="only rows whose protocol contains this text")
    ap.add_argument("--op", help="only rows whose op contains this text (call, finalize, floor)")
    args = ap.parse_args(argv)

    try:
        builds = load(args.files)
    except Unreadable as e:
        print(f"ab_table.py: {e}", file=sys.stderr)
        return 2
    names = list(builds)
    base = args.base or names[0]
    if base not in builds:
        print(f"ab_table.py: no build named {base!r} (builds: {', '.join(names)})", file=sys.stderr)
        return 2
    ms = {int(m) for m in args.m.split(",")} if args.m else None

    mean: dict = defaultdict(dict)
    spread: dict = defaultdict(float)
    for name, rounds in builds.items():
        for key in {k for r in rounds for k in r}:
            vals = [r[key] for r in rounds if key in r]
            mean[key][name] = sum(vals) / len(vals)
            spread[key] = max(spread[key], max(vals) - min(vals))

    keys = sorted(mean, key=lambda k: (k[3], k[0], k[1], k[2]))
    others = [n for n in names if n != base]
    rounds = ", ".join(f"{n} {len(builds[n])}" for n in names)
    print(f"Mean over rounds (rounds: {rounds}), us; differences to {base}.\n")
    head = ["op", "protocol", "TP", "M", base] + [f"{n} (vs {base})" for n in others] + ["spread"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * 4 + "---:|" * (len(head) - 4))
    for key in keys:
        op, proto, m, tp = key
        if ms is not None and m != 0 and m not in ms:  # the floors without an M stay: the run's reference
            continue
        if args.protocol and args.protocol not in proto:
            continue
        if args.op and args.op not in op:
            continue
        b = mean[key].get(base)
        cells = [op, proto, str(tp), str(m) if m else "-", f"{b:.2f}" if b is not None else "-"]
        for n in others:
            v = mean[key].get(n)
            if v is None:
                cells.append("-")
            elif b is None or b == 0:  # no base, or a base of 0 us: no percentage
                cells.append(f"{v:.2f}" if b is None else f"{v:.2f} ({v - b:+.2f})")
            else:
                cells.append(f"{v:.2f} ({v - b:+.2f}, {100.0 * (v - b) / b:+.1f}%)")
        cells.append(f"{spread[key]:.2f}")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
