#!/usr/bin/env python3
"""ckpt-bench ring reports every figure, and its rings cost their windows.

Not a timed test: it checks that both record sizes were carried both ways of
sending (in parts, as the scheduler's TRAIN; in place, as the worker's RESULT)
with every figure a finite positive number and each ratio the one of its
figures, that the run names its CPU, and that the rings' windows did what
they are for: 0.5 MiB records keep a window far below the 64 MiB ring, 16 MiB
records grow it to the whole ring, and the segment holds no more than the two
windows and its control pages.

    ring_test.py --bench build/bench/ckpt-bench
"""
import argparse
import json
import math
import subprocess
import sys

MIB = 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    args = ap.parse_args()
    run = subprocess.run(
        [args.bench, "ring", "--mib-per-trial", "64", "--trials", "1", "--roundtrips", "10"],
        capture_output=True, text=True, timeout=300)
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        print(f"ckpt-bench ring exited {run.returncode}")
        return 1
    out = json.loads(run.stdout.strip().splitlines()[-1])
    problems = []

    def positive(where, key, v):
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            problems.append(f"{where}{key} = {v!r}, expected a finite positive number")

    for key in ("roundtrip_us", "roundtrip_p99_us", "ring_bytes", "segment_bytes_allocated"):
        positive("", key, out.get(key))
    records = out.get("records", {})
    for label in ("0.5MB", "16MB"):
        r = records.get(label)
        if r is None:
            problems.append(f"no records.{label}")
            continue
        for key in ("ring_gb_s", "ring_in_place_gb_s", "memcpy_gb_s", "memcpy_hot_gb_s",
                    "ratio", "in_place_ratio", "send_window_bytes"):
            positive(f"records.{label}.", key, r.get(key))
        if not problems:
            for key, want in (("ratio", r["ring_gb_s"] / r["memcpy_gb_s"]),
                              ("in_place_ratio", r["ring_in_place_gb_s"] / r["memcpy_gb_s"])):
                if not math.isclose(r[key], want, rel_tol=1e-9):
                    problems.append(f"records.{label}.{key} = {r[key]}, its figures give {want}")
    if not problems:
        ring = out["ring_bytes"]
        small = records["0.5MB"]["send_window_bytes"]
        large = records["16MB"]["send_window_bytes"]
        if ring != 64 * MIB:
            problems.append(f"ring_bytes = {ring}, expected the scheduler's default 64 MiB")
        if not small <= 4 * MIB:
            problems.append(f"0.5 MiB records grew the window to {small} bytes, expected 4 MiB")
        if large != ring:
            problems.append(f"16 MiB records left the window at {large}, expected the ring")
        if out["segment_bytes_allocated"] > 2 * large + MIB:
            problems.append(f"the segment holds {out['segment_bytes_allocated']} bytes, more "
                            f"than its two windows ({2 * large})")
    if not out.get("cpu", {}).get("model_name"):
        problems.append("no cpu.model_name: a figure must name its CPU")
    for p in problems:
        print("FAILED:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
