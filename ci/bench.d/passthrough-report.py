#!/usr/bin/env python3
"""Turns the fio JSON files of `ci/bench passthrough` into passthrough.json."""
import glob
import json
import os
import statistics
import sys

src, dst = sys.argv[1], sys.argv[2]


def runs(job, arm):
    files = sorted(glob.glob(os.path.join(src, f"{job}-{arm}-*.json")))
    if not files:
        sys.exit(f"passthrough: no results for {job}/{arm} in {src}")
    out = []
    for f in files:
        with open(f) as fh:
            text = fh.read()
        # fio may print notes before the JSON document.
        j = json.loads(text[text.index("{"):])
        job0 = j["jobs"][0]
        if job0.get("error", 0) != 0:
            sys.exit(f"passthrough: fio reported error {job0['error']} in {f}")
        out.append(job0)
    return out


def median(xs):
    return statistics.median(xs)


ARMS = ("loop", "casblk", "cas")
rr = {arm: runs("randread", arm) for arm in ARMS}
wr = {arm: runs("write", arm) for arm in ARMS}
iops = {a: median([r["read"]["iops"] for r in rr[a]]) for a in rr}
p99 = {a: median([r["read"]["clat_ns"]["percentile"]["99.000000"] / 1000 for r in rr[a]]) for a in rr}
mib = {a: median([r["write"]["bw_bytes"] / (1 << 20) for r in wr[a]]) for a in wr}
result = {
    "randread": {
        "loop_iops": round(iops["loop"], 1),
        "casblk_iops": round(iops["casblk"], 1),
        "ratio": round(iops["casblk"] / iops["loop"], 3),
        "loop_p99_us": round(p99["loop"], 1),
        "casblk_p99_us": round(p99["casblk"], 1),
        # Content-addressed mode on the same filesystem, for reference.
        "cas_iops": round(iops["cas"], 1),
        "cas_ratio": round(iops["cas"] / iops["loop"], 3),
        "cas_p99_us": round(p99["cas"], 1),
    },
    "write": {
        "loop_mib_s": round(mib["loop"], 1),
        "casblk_mib_s": round(mib["casblk"], 1),
        "ratio": round(mib["casblk"] / mib["loop"], 3),
        "cas_mib_s": round(mib["cas"], 1),
        "cas_ratio": round(mib["cas"] / mib["loop"], 3),
    },
    "runs_per_arm": len(rr["loop"]),
    "per_run": {
        "randread_iops": {a: [round(r["read"]["iops"], 1) for r in rr[a]] for a in rr},
        "write_mib_s": {a: [round(r["write"]["bw_bytes"] / (1 << 20), 1) for r in wr[a]] for a in wr},
    },
}
os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
with open(dst, "w") as fh:
    json.dump(result, fh, indent=2)
    fh.write("\n")
r, w = result["randread"], result["write"]
print(f"randread 4k QD8 : loop {r['loop_iops']:.0f} IOPS (p99 {r['loop_p99_us']:.0f} us)  "
      f"casblk {r['casblk_iops']:.0f} IOPS (p99 {r['casblk_p99_us']:.0f} us)  ratio {r['ratio']:.3f}  [target >= 0.8]")
print(f"write 1M QD32   : loop {w['loop_mib_s']:.1f} MiB/s  casblk {w['casblk_mib_s']:.1f} MiB/s  ratio {w['ratio']:.3f}")
print(f"cas mode (ref.) : randread {r['cas_iops']:.0f} IOPS (p99 {r['cas_p99_us']:.0f} us, {r['cas_ratio']:.3f} of loop)  "
      f"write {w['cas_mib_s']:.1f} MiB/s ({w['cas_ratio']:.3f} of loop)")
print(f"wrote {dst}")
