#!/usr/bin/env python3
"""Where the scripts' Lua VM instructions go, per line and per function, between two
snapshots of a redis-server patched with luaprof.patch (see README.md).

    lua_lines.py LIBRARY.lua BEFORE AFTER RUNS
    lua_lines.py --list SNAPSHOT...

LIBRARY.lua: the library's code as Redis holds it (`redis-cli --raw FUNCTION LIST
WITHCODE`, from the `#!lua` line on); BEFORE, AFTER: two snapshot files (cumulative
counts by line); RUNS: how many runs the interval covered (figures are per run).
`--list` prints how many instructions each snapshot's interval added, to find a phase
(a drain adds far more per 200 calls than an enqueue of one run per call).
"""
import re
import sys


def load(path):
    counts = {}
    with open(path) as f:
        for line in f:
            n, c = line.split()
            counts[int(n)] = int(c)
    return counts


def main():
    if sys.argv[1] == "--list":
        previous = {}
        for path in sys.argv[2:]:
            counts = load(path)
            added = sum(v - previous.get(k, 0) for k, v in counts.items())
            print(f"{path}  {added}")
            previous = counts
        return
    library, before, after, runs = sys.argv[1], load(sys.argv[2]), load(sys.argv[3]), int(sys.argv[4])
    code = open(library).read().split("\n")
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    # Each line's function: the nearest `local function` above it, or the registered
    # function whose body it is in.
    owner, current = {}, "(library)"
    for i, line in enumerate(code, 1):
        m = re.match(r"\s*local function (\w+)|redis.register_function \{ function_name = '(\w+?)_", line)
        if m:
            current = m.group(1) or m.group(2)
        owner[i] = current
    by_fn = {}
    for k, v in delta.items():
        by_fn[owner.get(k, "?")] = by_fn.get(owner.get(k, "?"), 0) + v
    print(f"Lua VM instructions per run: {sum(delta.values()) / runs:.1f}")
    print("\nby function:")
    for name, v in sorted(by_fn.items(), key=lambda x: -x[1])[:25]:
        print(f"{v / runs:8.1f}  {name}")
    print("\nby line:")
    for k, v in sorted(delta.items(), key=lambda x: -x[1])[:40]:
        text = code[k - 1].strip() if k <= len(code) else "?"
        print(f"{v / runs:8.1f}  {k:5d}  {text[:100]}")


if __name__ == "__main__":
    main()
