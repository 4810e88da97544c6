#!/usr/bin/env python3
"""The search policies of issue 45 against each other on the seed workload
(LeNet-5 on Fashion-MNIST, SGD with momentum and weight decay), reduced.

Each arm is one `ckpt-scheduler run` of an experiment file written to a temp
dir (its own store, one cpu worker with 2 slots, plain training), once per
seed. Reported per arm: the test score of the member with the best validation
score (from the run's --summary-json), mean and standard deviation over the
seeds, and the wall time of the run (spawn to exit). One JSON line per run,
then one per arm, then a markdown table.

    bench/policy_arms.py [--seeds 3] [--intervals 4] [--steps 50]
        [--eval-size 1000] [--scheduler build/bin/ckpt-scheduler]
        [--arms pb2-8,pbt-8,pbt-30,random-tpe-30,random-30]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARMS = {
    # name: (population, policy table)
    "pb2-8": (8, 'kind = "pb2"\nmode = "sync"\nquantile = 0.25\nready_intervals = 1\n'),
    "pbt-8": (8, 'kind = "pbt"\nmode = "sync"\nquantile = 0.25\nready_intervals = 1\n'
                 'perturb = [0.8, 1.2]\nresample_probability = 0.25\n'),
    "pbt-30": (30, 'kind = "pbt"\nmode = "sync"\nquantile = 0.2\nready_intervals = 1\n'
                   'perturb = [0.8, 1.2]\nresample_probability = 0.25\n'),
    # TPE proposes for members that start after results are in: async mode.
    "random-tpe-30": (30, 'kind = "random"\nmode = "async"\nresample = "tpe"\n'),
    "random-30": (30, 'kind = "random"\nmode = "async"\n'),
}


def experiment(name, seed, population, policy, args):
    return f"""name = "{name}"
seed = {seed}
metrics = ""
[model]
spec = "lenet5"
optimizer = "sgd"
[data]
dataset = "fashion-mnist"
path = "{args.dataset_path}"
batch_size = 64
eval_size = {args.eval_size}
[population]
size = {population}
steps_per_interval = {args.steps}
intervals = {args.intervals}
[search_space.lr]
type = "log_uniform"
min = 0.001
max = 0.2
[search_space.momentum]
type = "uniform"
min = 0.5
max = 0.99
[search_space.weight_decay]
type = "log_uniform"
min = 0.000001
max = 0.01
[policy]
{policy}[[devices]]
device = "cpu"
slots = 2
fusion = "plain"
"""


def run(arm, seed, args, tmp):
    population, policy = ARMS[arm]
    name = f"{arm}-s{seed}"
    path = os.path.join(tmp, name + ".toml")
    with open(path, "w") as f:
        f.write(experiment(name, seed, population, policy, args))
    summary = os.path.join(tmp, name + ".json")
    t0 = time.monotonic()
    subprocess.run([args.scheduler, "run", "--quiet", "--store", os.path.join(tmp, name),
                    "--summary-json", summary, path], check=True)
    wall = time.monotonic() - t0
    with open(summary) as f:
        s = json.load(f)
    members = s["members"]  # best validation first
    best = next(m for m in members if m.get("test_score") is not None)
    return {"arm": arm, "seed": seed, "population": population, "wall_s": wall,
            "best_val": best["val_score"], "test": best["test_score"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--intervals", type=int, default=4)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--eval-size", type=int, default=1000)
    p.add_argument("--dataset-path", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--scheduler", default="build/bin/ckpt-scheduler")
    p.add_argument("--arms", default=",".join(ARMS))
    args = p.parse_args()
    arms = args.arms.split(",")
    results = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.seeds + 1):
            for arm in arms:  # arms interleaved: a load change spreads over all
                r = run(arm, 2026 + seed, args, tmp)
                print(json.dumps(r), flush=True)
                results[arm].append(r)
    rows = []
    for arm in arms:
        tests = [r["test"] for r in results[arm]]
        walls = [r["wall_s"] for r in results[arm]]
        row = {"arm": arm, "runs": len(tests), "test_mean": statistics.mean(tests),
               "test_sd": statistics.stdev(tests) if len(tests) > 1 else 0.0,
               "wall_s_mean": statistics.mean(walls)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| arm | runs | test score of the best-validation member (mean ± sd) | wall s (mean) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['runs']} | {r['test_mean']:.4f} ± {r['test_sd']:.4f} "
              f"| {r['wall_s_mean']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
