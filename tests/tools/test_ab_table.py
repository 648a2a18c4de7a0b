"""bench/ab_table.py on JSON files written here: grouping by build, means over rounds, the
differences to the base build, the spread of rounds, the filters and the errors."""

import contextlib
import io
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import ab_table  # noqa: E402


def bench_json(path, commit, call_us, floor_us):
    rows = [{"op": "bandwidth", "copy_gbps": 4000.0, "peer_store_gbps": 0.0, "tp": 1},
            {"op": "launch_floor", "tp": 1, "us_median": floor_us / 2}]  # timed once a run: no M
    for m, us in call_us.items():
        rows.append({"op": "allreduce_mhc.call", "protocol": "one-shot (own mailbox)", "variant": "plain",
                     "m": m, "tp": 1, "us_median": us, "lamport_floor_us": floor_us})
        # A TP=2 group's row: its floor is TP=2's (it was filed under TP 1 until 2026-12-05).
        rows.append({"op": "allreduce_mhc.call", "protocol": "one-shot", "variant": "plain",
                     "m": m, "tp": 2, "us_median": us + 1, "lamport_floor_us": floor_us + 1})
        # As mhccl-bench writes a simulated row: "simulated": true, the simulated group's TP in
        # "tp" (the rows of TP = 2 and 4 of one case were one row until 2026-12-05).
        for tp in (2, 4):
            rows.append({"op": "allreduce_mhc.finalize", "protocol": "simulated single launch", "variant": "mxfp8",
                         "m": m, "tp": tp, "simulated": True, "pdl": True, "us_median": tp * us})
    with open(path, "w") as f:
        json.dump({"commit": commit, "rows": rows}, f)
    return path


def run(args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = ab_table.main(args)
    return rc, out.getvalue()


def main():
    d = tempfile.mkdtemp()
    a1 = bench_json(os.path.join(d, "a1.json"), "aaa", {1: 4.0, 64: 10.0}, 2.0)
    a2 = bench_json(os.path.join(d, "a2.json"), "aaa", {1: 4.2, 64: 10.0}, 2.0)
    b1 = bench_json(os.path.join(d, "b1.json"), "bbb", {1: 3.0, 64: 11.0}, 1.5)

    rc, out = run([a1, a2, b1])
    assert rc == 0, out
    assert "rounds: aaa 2, bbb 1" in out, out
    # The mean of aaa's two rounds (4.1), bbb's difference to it, the spread of aaa's rounds.
    assert "| call | one-shot (own mailbox) | 1 | 1 | 4.10 | 3.00 (-1.10, -26.8%) | 0.20 |" in out, out
    assert "| call | one-shot (own mailbox) | 1 | 64 | 10.00 | 11.00 (+1.00, +10.0%) | 0.00 |" in out, out
    assert "| lamport floor |  | 1 | 1 | 2.00 | 1.50 (-0.50, -25.0%) | 0.00 |" in out, out
    assert "| lamport floor |  | 2 | 1 | 3.00 | 2.50 (-0.50, -16.7%) | 0.00 |" in out, out
    # Simulated ranks: the row's TP is the simulated one; a variant other than plain is named.
    assert "| finalize mxfp8 | simulated single launch | 2 | 1 | 8.20 | 6.00 (-2.20, -26.8%) | 0.40 |" in out, out
    assert "| finalize mxfp8 | simulated single launch | 4 | 1 | 16.40 | 12.00 (-4.40, -26.8%) | 0.80 |" in out, out

    rc, out = run(["--base", "bbb", "--m", "64", "--op", "call", a1, a2, b1])
    assert rc == 0 and "| call | one-shot (own mailbox) | 1 | 64 | 11.00 | 10.00 (-1.00, -9.1%) | 0.00 |" in out, out
    assert "| 1 | 1 |" not in out and "finalize" not in out, out
    # A row with no M (the launch floor) is printed with M "-", under --m too.
    rc, out = run(["--m", "64", a1, a2, b1])
    assert rc == 0 and "| launch_floor |  | 1 | - | 1.00 | 0.75 (-0.25, -25.0%) | 0.00 |" in out, out

    # NAME=FILE overrides the commit recorded in the file; a path holding "=" is a path.
    rc, out = run(["x=" + a1, "y=" + b1])
    assert rc == 0 and "| x | y (vs x) | spread |" in out, out
    eq_dir = os.path.join(d, "round=1")
    os.mkdir(eq_dir)
    c1 = bench_json(os.path.join(eq_dir, "c1.json"), "ccc", {1: 5.0}, 2.0)
    rc, out = run([c1, a1])
    assert rc == 0 and "| ccc | aaa (vs ccc) | spread |" in out, out

    rc, out = run(["--base", "nope", a1])
    assert rc == 2, out
    bad = os.path.join(d, "bad.json")
    with open(bad, "w") as f:
        f.write("[1, 2]")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc, out = run([bad])
    assert rc == 2 and "not an mhccl-bench JSON file" in err.getvalue(), (rc, err.getvalue())
    # A malformed row: exit 2 naming the file and the row (a "tp": null row raised a TypeError
    # with a traceback, and a file without rows exited 1 though 2 is documented: a review, 2026-12-05).
    with open(bad, "w") as f:
        json.dump({"commit": "bad", "rows": [{"op": "allreduce_mhc.call", "m": 1, "tp": None, "us_median": 1.0}]}, f)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc, out = run([bad])
    assert rc == 2 and "row 0: TypeError" in err.getvalue(), (rc, err.getvalue())
    # A base of 0 us: the difference without a percentage, not a ZeroDivisionError.
    z1 = bench_json(os.path.join(d, "z1.json"), "zero", {1: 0.0}, 2.0)
    rc, out = run([z1, a1])
    assert rc == 0 and "| call | one-shot (own mailbox) | 1 | 1 | 0.00 | 4.00 (+4.00) |" in out, out
    print("test_ab_table: ok")


if __name__ == "__main__":
    main()
