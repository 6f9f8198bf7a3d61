#!/usr/bin/env python3
"""Turns the results of `ci/bench device` (fio JSON, space.json, rss.json)
into target/bench/device.json, DOCS/device.md and DOCS/device.png, and
prints the figures with the issue's targets checked against them.

usage: device-report.py RESULTS_DIR DEVICE_JSON DOCS_DIR
"""
import glob
import json
import os
import statistics
import sys

src, dst, docs = sys.argv[1], sys.argv[2], sys.argv[3]
ARMS = ["loop", "passthrough", "rublk", "rublk_q2", "cas", "cas_q2", "vdo", "nbd"]
MIB = 1 << 20


def load(path):
    with open(path) as fh:
        text = fh.read()
    # fio may print notes before the JSON document.
    return json.loads(text[text.index("{"):])


def fio_jobs(pattern):
    out = []
    for f in sorted(glob.glob(os.path.join(src, pattern))):
        try:
            jobs = load(f)["jobs"]
        except ValueError:
            print(f"device: no fio result in {f} (the job failed: see failed, *.err)", file=sys.stderr)
            continue
        errors = [j["error"] for j in jobs if j.get("error", 0) != 0]
        if errors:
            print(f"device: fio reported error {errors[0]} in {f}: figure left out", file=sys.stderr)
            continue
        out.append(jobs)
    return out


def pct(side, p):
    return side["clat_ns"]["percentile"][p] / 1000.0


# Each figure: how to read it from one repetition's fio job.
FIGURES = {
    "randread_iops": ("randread", lambda j: j["read"]["iops"]),
    "randread_p99_us": ("randread", lambda j: pct(j["read"], "99.000000")),
    "randread_qd1_p50_us": ("randread_qd1", lambda j: pct(j["read"], "50.000000")),
    "randwrite_iops": ("randwrite", lambda j: j["write"]["iops"]),
    "write_mib_s": ("write", lambda j: j["write"]["bw_bytes"] / MIB),
}


def summary(values):
    if not values:
        return None, None
    return statistics.median(values), [min(values), max(values)]


result = {}
ranges = {}
arms_run = []
space = load(os.path.join(src, "space.json")) if os.path.exists(os.path.join(src, "space.json")) else {}
rss = load(os.path.join(src, "rss.json")) if os.path.exists(os.path.join(src, "rss.json")) else {}
for arm in ARMS:
    fig = {}
    seen = False
    for key, (job, read) in FIGURES.items():
        runs = fio_jobs(f"{job}-{arm}-*.json")
        seen = seen or bool(runs)
        med, rng = summary([read(r[0]) for r in runs])
        fig[key] = None if med is None else round(med, 1)
        ranges[f"{arm}.{key}"] = rng
    sp = space.get(arm)
    fig["stored_mib_4_copies"] = None if sp is None else round((sp["after"] - sp["before"]) / MIB, 1)
    r = rss.get(arm)
    fig["peak_rss_mib"] = None if r is None else round(r["vmhwm_kib"] / 1024, 1)
    fig["pss_mib"] = None if r is None or r.get("pss_kib") is None else round(r["pss_kib"] / 1024, 1)
    if seen:
        arms_run.append(arm)
    result[arm] = fig

# The in-VM drain rate of cas: the write job's bytes over the time until
# compaction covered them.
drains = []
for rep_file in sorted(glob.glob(os.path.join(src, "drain-*.json"))):
    rep = rep_file.rsplit("-", 1)[1].split(".")[0]
    job = fio_jobs(f"write-cas-{rep}.json")
    if job:
        drains.append(job[0][0]["write"]["io_bytes"] / MIB / (load(rep_file)["ms"] / 1000.0))
result["cas"]["drain_mib_s"] = None if not drains else round(statistics.median(drains), 1)

pressure_runs = fio_jobs("pressure-*.json")
readonly_runs = fio_jobs("pressure_readonly-*.json")
if pressure_runs:
    result["pressure"] = {
        "read_p99_us": round(statistics.median(pct(r[0]["read"], "99.000000") for r in pressure_runs), 1),
        "read_only_p99_us": round(statistics.median(pct(r[0]["read"], "99.000000") for r in readonly_runs), 1),
        "read_max_us": round(max(r[0]["read"]["clat_ns"]["max"] / 1000.0 for r in pressure_runs), 1),
        "errors": sum(j.get("error", 0) + j.get("total_err", 0) for r in pressure_runs for j in r),
        "writer_mib_s": round(statistics.median(r[1]["write"]["bw_bytes"] / MIB for r in pressure_runs), 1),
    }
else:
    result["pressure"] = {"read_p99_us": None, "read_only_p99_us": None, "read_max_us": None, "errors": None}
result["ranges"] = ranges
result["reps"] = len(fio_jobs("randread-loop-*.json")) or len(fio_jobs("randread-cas-*.json"))

os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
with open(dst, "w") as fh:
    json.dump(result, fh, indent=2)


def get(arm, key):
    return result.get(arm, {}).get(key)


def check(name, lhs, rhs, ok):
    if lhs is None or rhs is None:
        return f"  {name}: not measured"
    return f"  {name}: {lhs:g} vs {rhs:g} -> {'met' if ok(lhs, rhs) else 'NOT met'}"


p = result["pressure"]
targets = [
    check("cas.randread_iops >= rublk.randread_iops", get("cas", "randread_iops"), get("rublk", "randread_iops"),
          lambda a, b: a >= b),
    check("cas.randread_qd1_p50_us <= 1.2 x passthrough", get("cas", "randread_qd1_p50_us"),
          None if get("passthrough", "randread_qd1_p50_us") is None else 1.2 * get("passthrough", "randread_qd1_p50_us"),
          lambda a, b: a <= b),
    check("cas.randwrite_iops >= 0.8 x passthrough", get("cas", "randwrite_iops"),
          None if get("passthrough", "randwrite_iops") is None else 0.8 * get("passthrough", "randwrite_iops"),
          lambda a, b: a >= b),
    check("cas.write_mib_s >= 3 x vdo", get("cas", "write_mib_s"),
          None if get("vdo", "write_mib_s") is None else 3 * get("vdo", "write_mib_s"), lambda a, b: a >= b),
    check("cas.stored_mib_4_copies <= vdo", get("cas", "stored_mib_4_copies"), get("vdo", "stored_mib_4_copies"),
          lambda a, b: a <= b),
    check("pressure.read_p99_us <= 2 x read_only_p99_us", p["read_p99_us"],
          None if p["read_only_p99_us"] is None else 2 * p["read_only_p99_us"], lambda a, b: a <= b),
    check("pressure.read_max_us <= 50000", p["read_max_us"], 50000.0, lambda a, b: a <= b),
    check("pressure.errors == 0", p["errors"], 0.0, lambda a, b: a == b),
    check("cas.peak_rss_mib <= 64 + 16 (chunk cache)", get("cas", "peak_rss_mib"), 80.0, lambda a, b: a <= b),
    check("cas_q2.randread_iops >= 1.6 x cas.randread_iops (2 queues, 2 fio jobs)", get("cas_q2", "randread_iops"),
          None if get("cas", "randread_iops") is None else 1.6 * get("cas", "randread_iops"), lambda a, b: a >= b),
]

COLUMNS = [
    ("randread_iops", "4K randread QD8 IOPS"),
    ("randread_p99_us", "p99 us"),
    ("randread_qd1_p50_us", "4K randread QD1 p50 us"),
    ("randwrite_iops", "4K randwrite QD8 IOPS"),
    ("write_mib_s", "1M write MiB/s"),
    ("stored_mib_4_copies", "stored MiB, 4 copies of 128 MiB"),
    ("peak_rss_mib", "peak RSS MiB"),
]


def cell(v):
    return "-" if v is None else f"{v:g}"


lines = [
    "# ci/bench device",
    "",
    "Generated by `ci/bench device` (ci/bench.d/device-report.py) from one VM boot under",
    f"software emulation (TCG): compare arms within this table only. Medians of {result['reps']} repetitions;",
    "ranges in target/bench/device.json. A/B runs of single changes, which this file would",
    "lose on the next run, are kept by hand in device-notes.md.",
    "",
    "| arm | " + " | ".join(c[1] for c in COLUMNS) + " |",
    "|---|" + "---|" * len(COLUMNS),
]
for arm in arms_run:
    lines.append(f"| {arm} | " + " | ".join(cell(get(arm, k)) for k, _ in COLUMNS) + " |")
lines += [
    "",
    f"cas drain rate in the VM (1 MiB write until compacted): {cell(get('cas', 'drain_mib_s'))} MiB/s.",
    "",
    "Pressure (4 KiB reads on image A, QD8, while a writer fills image B's log): "
    f"read p99 {cell(p['read_p99_us'])} us (alone {cell(p['read_only_p99_us'])} us), "
    f"slowest read {cell(p['read_max_us'])} us, errors {cell(p['errors'])}.",
    "",
    "Targets:",
    "",
] + [f"- {t.strip()}" for t in targets]
os.makedirs(docs, exist_ok=True)
with open(os.path.join(docs, "device.md"), "w") as fh:
    fh.write("\n".join(lines) + "\n")

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(COLUMNS), figsize=(3.2 * len(COLUMNS), 3.6))
    for ax, (key, title) in zip(axes, COLUMNS):
        vals = [get(a, key) for a in arms_run]
        ax.bar(range(len(arms_run)), [0 if v is None else v for v in vals],
               color=["#d62728" if a == "cas" else "#7f7f7f" for a in arms_run])
        ax.set_xticks(range(len(arms_run)), arms_run, rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle("ci/bench device (one VM boot, TCG; medians)", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "device.png"), dpi=90)
except ImportError:
    print("device: matplotlib missing (ci/setup --bench installs it): no device.png", file=sys.stderr)

print(f"bench device ({result['reps']} reps, medians):")
for arm in arms_run:
    print(f"  {arm:12}" + "  ".join(f"{k}={cell(get(arm, k))}" for k, _ in COLUMNS))
print(f"  cas drain_mib_s={cell(get('cas', 'drain_mib_s'))}")
print(f"  pressure: {json.dumps(p)}")
print("targets:")
for t in targets:
    print(t)
print(f"wrote {dst}, {docs}/device.md, {docs}/device.png")
