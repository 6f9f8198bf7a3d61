# Every thread of a store daemon and of a raw daemon runs as an IO flusher
# (PR_SET_IO_FLUSHER: PF_MEMALLOC_NOIO and PF_LOCAL_THROTTLE in the flags
# of /proc/PID/task/TID/stat), so that memory reclaim in a daemon thread
# never waits on the daemon's own devices. Threads come and go
# (compaction's pipeline, GC, the kernel's io_uring workers): the flags are
# read again and again while writes with flushes, compaction and GC
# passes run, and every thread seen is checked (the metrics endpoint's
# included).
source "$(dirname "$0")/lib.sh"
store=$(new_store a 256M)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dev=$(add_image "$store" a --metrics-listen "127.0.0.1:$port")
raw=$(add_raw "$(new_backing 64M)")
pid=$(daemon_pid "$dev")
rawpid=$(daemon_pid "$raw")
for d in "$dev" "$raw"; do
    fio --name=w --filename="$d" --rw=randwrite --bs=64k --size=16M --iodepth=8 --ioengine=io_uring \
        --direct=1 --fsync=4 --time_based --runtime=8 --output="$SCRATCH/fio-$(basename "$d").txt" &
done
seen=$SCRATCH/threads.txt
: >"$seen"
# GC passes, one after another, while the flags are read.
( for _ in 1 2 3; do "$CASBLK" --store "$store" gc >/dev/null || exit 1; sleep 2; done ) &
gc=$!
deadline=$((SECONDS + 8))
while [ "$SECONDS" -lt "$deadline" ]; do
    io_flusher_threads "$pid" "$rawpid" >>"$seen"
    sleep 0.05
done
wait "$gc" || fail "a GC pass failed"
wait
wait_compacted "$store"
io_flusher_threads "$pid" "$rawpid" >>"$seen"
missing=$(awk '$4 != "ok"' "$seen" | sort -u -k3,3)
[ -z "$missing" ] || fail "daemon threads without IO_FLUSHER (pid tid name flags):
$missing"
names=$(awk '{sub(/-[0-9]+$/, "", $3); print $3}' "$seen" | sort -u | xargs)
for want in casblk-worker casblk-sync cas-gc casblk-metrics; do
    grep -qw "$want" <<<"$names" || fail "no $want thread was seen (seen: $names)"
done
for want in cas-compactor wal-wb-a; do
    grep -qw "$want" <<<"$names" || fail "no $want thread was seen (seen: $names)"
done
note "$(wc -l <"$seen") thread samples, all IO flushers: $names"
"$CASBLK" del -a
wait_no_devices
