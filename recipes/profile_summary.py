#!/usr/bin/env python3
"""Where did the time of a step go? Summarises a loom Chrome trace (from --profile FILE or
loom::profiler::save).

  python3 recipes/profile_summary.py trace.json [--steps N] [--by-op] [--top N]

Prints, per span name and thread, the total and mean time, and the share of the wall time
covered by the trace for the spans that matter most: host tracing ("trace"), compiling
("compile"), device execution ("execute"), the consumer waiting for data ("loader_wait"),
reads waiting for the device ("wait") and transfers. Nested spans are counted in each of
their enclosing names, so shares can add up to more than 100%. Kernel spans recorded with
LOOM_PROFILE_SHAPES=1 carry their shapes ("conv2d float32[32,4,4,512] <- ..."): each shape is
a row of its own, and --by-op adds them up per op again. The span name comes last in each row,
so long names do not push the columns apart.
"""
import argparse
import collections
import json
import sys

KEY_SPANS = [
    ("trace", "host: building step graphs"),
    ("compile", "host: compiling"),
    ("execute", "device: running programs"),
    ("loader_wait", "host: waiting for data"),
    ("wait", "host: waiting for the device (reads)"),
    ("transfer_to_device", "transfers to the device"),
    ("transfer_from_device", "transfers from the device"),
    ("step_closure", "step closures"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="Chrome trace JSON written by loom")
    ap.add_argument("--steps", type=int, default=0, help="number of steps in the trace (for per-step means)")
    ap.add_argument("--by-op", action="store_true",
                    help="add up the spans of one op whatever their shapes (LOOM_PROFILE_SHAPES=1)")
    ap.add_argument("--top", type=int, default=0, help="list only the N longest rows (default: all)")
    args = ap.parse_args()
    try:
        with open(args.trace) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"profile_summary: cannot read '{args.trace}': {e}")
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        sys.exit(f"profile_summary: '{args.trace}' holds no spans")
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    wall = max(end - start, 1e-9)
    by_name = collections.defaultdict(float)
    by_name_thread = collections.defaultdict(lambda: [0.0, 0])
    for e in spans:
        name = e["name"].split(" ", 1)[0] if args.by_op else e["name"]
        by_name[name] += e["dur"]
        t = by_name_thread[(name, threads.get(e["tid"], f"thread {e['tid']}"))]
        t[0] += e["dur"]
        t[1] += 1
    print(f"trace: {len(spans)} spans over {wall / 1e3:.1f} ms of wall time")
    if args.steps:
        print(f"       {wall / 1e3 / args.steps:.2f} ms per step over {args.steps} steps")
    print("\nwhere the time went (share of wall time):")
    for name, what in KEY_SPANS:
        if name in by_name:
            print(f"  {what:<40} {by_name[name] / 1e3:10.1f} ms  {100 * by_name[name] / wall:5.1f}%")
    print("\nall spans by thread:")
    print(f"  {'thread':<18} {'count':>7} {'total ms':>10} {'mean us':>10}  span")
    rows = sorted(by_name_thread.items(), key=lambda kv: -kv[1][0])
    for (name, thread), (total, count) in rows[:args.top] if args.top > 0 else rows:
        print(f"  {thread:<18} {count:>7} {total / 1e3:>10.2f} {total / count:>10.1f}  {name}")


if __name__ == "__main__":
    main()
