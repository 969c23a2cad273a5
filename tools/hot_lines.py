#!/usr/bin/env python3
"""The hot code of a run, in 64-byte instruction-cache lines.

Counts the lines of a binary's code holding an instruction that ran at
least `min` times in a callgrind profile taken with `--dump-instr=yes`
(`docs/RESULTS.md`, "The slot owner's map count; the path's code
footprint"), in all and per function:

    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=OUT \\
        target/release/examples/instantiate --threads 1 --writers-only \\
        --instances 5000 --reps 1 --mode Range+windows
    python3 tools/hot_lines.py target/release/examples/instantiate OUT 2500

With 5,000 instances, `min` = 2,500 keeps the code run at least once
every two instances. Needs `nm` (binutils) for the function names.
"""

import bisect
import re
import subprocess
import sys


def executed(profile, binary_name):
    """Instruction address -> times run, for the objects named like the binary."""
    counts, names, last, obj, skip = {}, {}, [0, 0], None, False
    for line in open(profile):
        line = line.rstrip("\n")
        m = re.match(r"c?ob=\((\d+)\)(?: (.+))?", line)
        if m:
            if m.group(2):
                names[m.group(1)] = m.group(2)
            if line.startswith("ob="):
                obj = names.get(m.group(1))
            continue
        if line.startswith("calls="):
            skip = True  # the next cost line is a call's inclusive cost
            continue
        if not line or line[0] not in "0123456789+-*":
            continue
        parts = line.split()

        def val(tok, i):
            if tok.startswith("0x"):
                return int(tok, 16)
            if tok == "*":
                return last[i]
            if tok[0] in "+-":
                return last[i] + int(tok)
            return int(tok)

        last[0] = val(parts[0], 0)
        if len(parts) > 1:
            last[1] = val(parts[1], 1)
        if skip:
            skip = False
            continue
        if obj and binary_name in obj and len(parts) > 2:
            counts[last[0]] = counts.get(last[0], 0) + int(parts[2])
    return counts


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    binary, profile, least = sys.argv[1], sys.argv[2], int(sys.argv[3])
    out = subprocess.run(["nm", "-C", "--defined-only", "-n", binary],
                         capture_output=True, text=True, check=True).stdout
    syms = [(int(p[0], 16), p[2]) for p in (l.split(" ", 2) for l in out.splitlines())
            if len(p) == 3 and p[1] in "tTwW"]
    starts = [s for s, _ in syms]

    def function(addr):
        i = bisect.bisect_right(starts, addr) - 1
        return syms[i][1] if i >= 0 else "?"

    runs = executed(profile, binary.rsplit("/", 1)[-1])
    lines = {a // 64 for a, n in runs.items() if n >= least}
    print(f"{len(lines)} hot lines ({len(lines) * 64 // 1024} KiB)")
    per = {}
    for line in lines:
        f = function(line * 64)
        per[f] = per.get(f, 0) + 1
    for f, n in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"{n:5d}  {f}")


if __name__ == "__main__":
    main()
