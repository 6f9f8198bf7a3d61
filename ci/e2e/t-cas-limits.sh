# Per-image IO limits (issue 48 item 4), measured by fio on real devices:
# a 500-IOPS read cap holds within 10% over 10 s while an uncapped image
# beside it keeps the steady rate it asks for and never waits at the rate
# gate; a 20 MiB/s
# write cap set online holds within 10% while reads of the same image pass
# the held writes; a cap lowered during a run holds from a second after the
# change; recover after kill -9 keeps the limits; bad limits are refused
# in one line and leave the daemon serving.
source "$(dirname "$0")/lib.sh"

store=$(new_store a 64M)
"$CASBLK" --store "$store" image create b --size 64M >/dev/null

# Bad input, before any device.
for bad in "--read-iops 0" "--read-iops -5" "--write-bps 0" "--read-bps 100" "--read-iops 5 --read-iops-burst 400"; do
    # shellcheck disable=SC2086 # the flags split on purpose
    expect_error "add with $bad" add_image "$store" a $bad
done
expect_error "a burst without its rate" add_image "$store" a --read-iops-burst 5
expect_error "limits of a missing image, no daemon" "$CASBLK" --store "$store" image limits nope --read-iops 5
expect_error "limits of an image with no device" "$CASBLK" --store "$store" image limits a --read-iops 5
assert_no_devices

deva=$(add_image "$store" a --read-iops 500)
devb=$(add_image "$store" b)
note "a on $deva capped at 500 read IOPS; b on $devb uncapped"
expect_error "limits of a missing image, daemon running" "$CASBLK" --store "$store" image limits nope --read-iops 5
expect_error "a zero limit, daemon running" "$CASBLK" --store "$store" image limits a --write-iops 0
"$CASBLK" --store "$store" image limits a | tee "$SCRATCH/limits.txt"
grep -qF "read 500 IOPS (burst 50)" "$SCRATCH/limits.txt" || fail "image limits does not show the cap: $(cat "$SCRATCH/limits.txt")"

# fio_job NAME DEV RW BS DEPTH SECONDS [extra fio args]: a time-based job
# writing its JSON to $SCRATCH/NAME.json (run it in the background with &).
fio_job() {
    local name=$1 dev=$2 rw=$3 bs=$4 depth=$5 secs=$6; shift 6
    fio --name="$name" --filename="$dev" --rw="$rw" --bs="$bs" --iodepth="$depth" --ioengine=io_uring \
        --direct=1 --size=64M --time_based --runtime="$secs" --output-format=json \
        --output="$SCRATCH/$name.json" "$@" >/dev/null
}
# fio_figure NAME EXPR: EXPR over the job's `read`/`write` results.
fio_figure() {
    python3 - "$SCRATCH/$1.json" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
read, write = j["read"], j["write"]
print(eval(sys.argv[2]))
PY
}
# gate_waits IMAGE OP: requests of IMAGE's OP that waited at rate_limit.
gate_waits() {
    "$CASBLK" --store "$store" stats --json | python3 -c "
import json, sys
img = next(i for i in json.load(sys.stdin)['images'] if i['name'] == '$1')
print(img['ops']['$2']['gates']['rate_limit']['requests'])"
}

# 1. The IOPS cap beside an uncapped image. Under emulation any IO on a
# takes CPU from b, so b's rate is not compared with b alone: b asks for a
# steady 2000 IOPS (paced by fio) and must get them beside the capped a.
fio_job alone "$devb" randread 4k 16 3
alone=$(fio_figure alone 'round(read["iops"])')
note "b alone, unpaced: $alone read IOPS"
[ "$alone" -gt 4000 ] || fail "b reads $alone IOPS alone: the VM is too slow to pace b at 2000 beside a"
b_waits0=$(gate_waits b read)
fio_job capped "$deva" randread 4k 16 10 &
fio_a=$!
fio_job beside "$devb" randread 4k 4 10 --rate_iops=2000
wait "$fio_a" || fail "fio on a failed"
a_iops=$(fio_figure capped 'round(read["iops"])')
b_iops=$(fio_figure beside 'round(read["iops"])')
b_p99=$(fio_figure beside 'round(read["clat_ns"]["percentile"]["99.000000"] / 1000)')
note "together for 10 s: a $a_iops read IOPS (cap 500, fio unpaced, depth 16), b $b_iops (asked 2000), b's p99 $b_p99 us"
[ "$a_iops" -ge 450 ] && [ "$a_iops" -le 550 ] || fail "a read $a_iops IOPS under a 500-IOPS cap (10% is 450-550)"
[ "$b_iops" -ge 1800 ] || fail "b got $b_iops of the 2000 IOPS it asked for beside the capped a"
[ "$(gate_waits b read)" -eq "$b_waits0" ] || fail "uncapped b waited at the rate gate"
[ "$(gate_waits a read)" -gt 0 ] || fail "a's reads never waited at the rate gate"

# 2. A bytes cap on writes, set online; reads of the same image pass.
fio_job pre "$devb" randwrite 64k 8 3
pre=$(fio_figure pre 'round(write["bw_bytes"] / 2**20, 1)')
note "b uncapped writes 64k: $pre MiB/s"
python3 -c "import sys; sys.exit(0 if $pre > 30 else 1)" || fail "uncapped writes reach only $pre MiB/s: the VM is too slow to tell a 20 MiB/s cap"
"$CASBLK" --store "$store" image limits a --read-iops none --write-bps 20M
fio_job wcap "$deva" randwrite 64k 8 10 &
fio_w=$!
fio_job rmix "$deva" randread 4k 4 10 --offset=32M --size=32M
wait "$fio_w" || fail "fio writes on a failed"
w_mib=$(fio_figure wcap 'round(write["bw_bytes"] / 2**20, 2)')
r_iops=$(fio_figure rmix 'round(read["iops"])')
note "a under --write-bps 20M for 10 s: writes $w_mib MiB/s, reads beside them $r_iops IOPS"
python3 -c "import sys; sys.exit(0 if 18 <= $w_mib <= 22 else 1)" || fail "writes ran at $w_mib MiB/s under a 20 MiB/s cap (10% is 18-22)"
# Reads queued behind the held writes would go at the writes' pace (about
# 320 a second); passing them, they go much faster.
[ "$r_iops" -ge 640 ] || fail "reads of a slowed to $r_iops IOPS behind its capped writes"
[ "$(gate_waits a write)" -gt 0 ] || fail "a's writes never waited at the rate gate"
metric=$("$CASBLK" --store "$store" stats --openmetrics | grep '^casblk_image_limit_bytes_per_second{' || true)
grep -qE 'class="write",image="a"} 20971520$|image="a",class="write"} 20971520$' <<<"$metric" \
    || fail "the metrics do not show the write cap: $metric"

# 3. A cap changed during a run holds from a second after the change:
# fio's IOPS per second (its log), from 1 s after the start to 1 s before
# the change, and in every whole second from 1 s after the change on.
"$CASBLK" --store "$store" image limits a --clear --read-iops 500 >/dev/null
t0=$(date +%s.%N)
fio_job change "$deva" randread 4k 16 10 --write_iops_log="$SCRATCH/change" --log_avg_msec=1000 &
fio_c=$!
sleep 4.5
"$CASBLK" --store "$store" image limits a --read-iops 200 >/dev/null
t1=$(date +%s.%N)
wait "$fio_c" || fail "fio during the change failed"
python3 - "$SCRATCH/change_iops.1.log" "$t0" "$t1" <<'PY' || fail "the changed cap did not hold"
import sys
log, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
# fio starts after t0, so its clock is behind: the change is at most this
# late on it, and the windows after it are judged conservatively.
change_ms = (t1 - t0) * 1000
rows = [[int(x) for x in line.split(",")[:2]] for line in open(log)]
# A sample at ms covers (ms - 1000, ms].
before = [v for ms, v in rows if 2000 <= ms <= change_ms - 1000]
after = [v for ms, v in rows if ms - 1000 >= change_ms + 1000]
print(f"  - change at {change_ms:.0f} ms; IOPS per second before {before}, from a second after {after}")
bad = [v for v in before if not 450 <= v <= 550] + [v for v in after if not 180 <= v <= 220]
sys.exit(1 if bad or len(before) < 2 or len(after) < 3 else 0)
PY
# 4. The limits stay with the device through a kill -9 and recover.
id=$(dev_id "$deva")
kill_daemon "$(daemon_pid "$deva")"
"$CASBLK" recover -a >/dev/null || fail "recover -a failed"
"$CASBLK" --store "$store" image limits a --json >"$SCRATCH/after.json"
python3 -c "
import json, sys
l = json.load(open('$SCRATCH/after.json'))['limits']
sys.exit(0 if l == {'read_iops': {'per_sec': 200, 'burst': 20}} else 1)" \
    || fail "after recover the limits are $(cat "$SCRATCH/after.json")"
note "recovered /dev/ublkb$id with its limits: $("$CASBLK" --store "$store" image limits a)"

"$CASBLK" del -a
wait_no_devices
fsck_clean "$store"
