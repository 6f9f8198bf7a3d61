# Reads are served in place on the queue thread when their data is in
# memory, and handed to the workers when it must come from a device. With
# the store on ext4 (a loop device, so reads really wait) and the page
# cache dropped, a verify pass takes the hand-off path; a second pass over
# the now cached data is served in place. Both verify, and the scheduler's
# counters show both paths taken. The device's trace shows where the time
# went: log I/O for writes, manifest and chunk I/O for cold reads.
# In the long mode only (137 s in the default suite; every read test takes the in-place path too).
# e2e-long-only
source "$(dirname "$0")/lib.sh"
modprobe loop
truncate -s 1G "$SCRATCH/ext4.img"
mkfs.ext4 -q -F "$SCRATCH/ext4.img"
mkdir -p "$SCRATCH/mnt"
mount -o loop "$SCRATCH/ext4.img" "$SCRATCH/mnt"
store=$(SCRATCH=$SCRATCH/mnt new_store vm 256M)
dev=$(add_image "$store" vm -d 64)
cd "$SCRATCH"
run_fio() {
    local name=$1; shift
    fio --name=rw --filename="$dev" --ioengine=io_uring --direct=1 --verify=crc32c --verify_fatal=1 \
        --verify_state_save=0 --rw=randwrite --bs=4k --size=64M --randseed=11 --iodepth=8 \
        --output="$SCRATCH/$name.txt" "$@" || { cat "$SCRATCH/$name.txt"; fail "fio $name failed"; }
    grep -q "err= 0" "$SCRATCH/$name.txt" || { cat "$SCRATCH/$name.txt"; fail "fio $name reported an error"; }
}
# Requests so far (cumulative): reads, reads with a chunk, manifest and
# cache phase, writes, writes with a log phase, and whether any retained
# slowest read spent time reading a chunk.
phase_counts() {
    "$CASBLK" stats -n "$(dev_id "$dev")" --json | python3 -c '
import json, sys
i = json.load(sys.stdin)["images"][0]
r, w = i["ops"]["read"], i["ops"]["write"]
p = r["phases"]
slow = int(any(s["phases"]["io_chunk_ns"] > 0 for s in i["slowest_reads"]))
print(r["count"], p["io_chunk"]["count"], p["io_manifest"]["count"], p["io_cache"]["count"],
      w["count"], w["phases"]["io_log"]["count"], slow)'
}
in_place_counters() {
    "$CASBLK" stats -n "$(dev_id "$dev")" --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["images"][0]["counters"]["sched"]
print(c["reads_in_place"], c["reads_requeued"])'
}
run_fio write --do_verify=0 --end_fsync=1
wait_compacted "$store"
sync
echo 3 > /proc/sys/vm/drop_caches
read -r in0 req0 <<<"$(in_place_counters)"
read -r reads0 chunk0 manifest0 cache0 writes0 log0 _ <<<"$(phase_counts)"
[ "$writes0" -ge 16384 ] && [ "$log0" = "$writes0" ] || fail "only $log0 of $writes0 writes have a log I/O phase"
run_fio cold --verify_only
read -r in1 req1 <<<"$(in_place_counters)"
note "cold verify: $((in1 - in0)) reads in place, $((req1 - req0)) handed to workers"
[ $((req1 - req0)) -gt 0 ] || fail "no read was handed to a worker with the page cache dropped"
# The engine's I/O spans reach the device's trace: every read of compacted
# data looked the manifest up, the cold ones read chunks from the store.
read -r reads1 chunk1 manifest1 cache1 _ _ slow1 <<<"$(phase_counts)"
reads=$((reads1 - reads0))
note "cold verify phases of $reads reads: io_chunk $((chunk1 - chunk0)), io_manifest $((manifest1 - manifest0)), io_cache $((cache1 - cache0)); a slowest read with io_chunk: $slow1"
[ "$reads" -ge 16384 ] || fail "the cold verify made $reads reads, not 16384"
# All but a handful (a read served from the log just before its overlay
# extent was reclaimed) looked the manifest up.
[ $((manifest1 - manifest0)) -ge $((reads - reads / 100)) ] || fail "only $((manifest1 - manifest0)) of $reads reads have a manifest phase"
[ $((chunk1 - chunk0)) -gt 0 ] || fail "no cold read has a chunk-read phase"
[ "$slow1" = 1 ] || fail "no retained slowest read has a chunk-read phase"
run_fio warm --verify_only
read -r in2 req2 <<<"$(in_place_counters)"
note "warm verify: $((in2 - in1)) reads in place, $((req2 - req1)) handed to workers"
[ $((in2 - in1)) -ge 16384 ] || fail "cached reads were not served in place ($((in2 - in1)) of 16384)"
# By default the background threads are SCHED_BATCH (3), the request path
# normal (0): a sync's wakeup does not preempt a read in place.
pid=$(daemon_pid "$dev")
for name in cas-compactor wal-wb-vm; do
    got=$(thread_policies "$pid" "$name")
    [ "$got" = 3 ] || fail "$name runs under policy '$got', not SCHED_BATCH (3)"
done
[ "$(thread_policies "$pid" casblk-worker-0)" = 0 ] || fail "a request worker is not SCHED_OTHER"
note "background threads SCHED_BATCH, request workers SCHED_OTHER"
"$CASBLK" del -a
wait_no_devices
umount "$SCRATCH/mnt"
