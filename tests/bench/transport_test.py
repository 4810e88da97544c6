#!/usr/bin/env python3
"""ckpt-bench transport runs its three links and reports each figure.

Not a timed test: it checks that the ring, the TLS link and the bare socket
each carried the round trips and the 16 MiB records (every figure a finite
positive number) and that the ratios are the ones of those figures, so that a
link that silently stopped measuring (a zero, a NaN, a missing field) fails
here rather than in bench/RESULTS.md.

    transport_test.py --bench build/bench/ckpt-bench
"""
import argparse
import json
import math
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    args = ap.parse_args()
    run = subprocess.run(
        [args.bench, "transport", "--roundtrips", "20", "--mib", "64"],
        capture_output=True, text=True, timeout=300)
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        print(f"ckpt-bench transport exited {run.returncode}")
        return 1
    out = json.loads(run.stdout.strip().splitlines()[-1])
    problems = []
    for key in ("ring_roundtrip_us", "tcp_roundtrip_us", "tcp_raw_roundtrip_us",
                "ring_gb_s_16mb", "tcp_gb_s_16mb", "tcp_raw_gb_s_16mb",
                "tls_vs_raw_tcp_throughput", "tls_vs_ring_throughput",
                "tls_vs_raw_tcp_roundtrip"):
        v = out.get(key)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            problems.append(f"{key} = {v!r}, expected a finite positive number")
    if not problems:
        pairs = (("tls_vs_raw_tcp_throughput", out["tcp_raw_gb_s_16mb"] / out["tcp_gb_s_16mb"]),
                 ("tls_vs_ring_throughput", out["ring_gb_s_16mb"] / out["tcp_gb_s_16mb"]),
                 ("tls_vs_raw_tcp_roundtrip",
                  out["tcp_roundtrip_us"] / out["tcp_raw_roundtrip_us"]))
        for key, want in pairs:
            if not math.isclose(out[key], want, rel_tol=1e-9):
                problems.append(f"{key} = {out[key]}, its figures give {want}")
    if not out.get("cpu", {}).get("model_name"):
        problems.append("no cpu.model_name: a figure must name its CPU")
    for p in problems:
        print("FAILED:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
