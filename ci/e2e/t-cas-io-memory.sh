# With user copy a request's data is staged in the buffer of the thread
# serving it, not in a buffer per tag: once every tag has taken a long
# request, the daemon holds no more than after short ones. Per-tag buffers
# kept 64 KiB resident for each tag that ever took a longer request
# (128 tags: 8 MiB); the staging buffers keep 64 KiB per serving thread.
#
# The data is written and compacted first, and read with short requests
# over every tag until the caches are full; long reads of the same data
# then must not grow the daemon by more than MAX_GROWTH_KIB.
source "$(dirname "$0")/lib.sh"
MAX_GROWTH_KIB=3072
features=$("$CASBLK" features)
[[ $features == *USER_COPY* ]] || { note "driver without USER_COPY: nothing to check"; exit 0; }
store=$(new_store vm 256M)
dev=$(add_image "$store" vm -d 128)
pid=$(daemon_pid "$dev")
cd "$SCRATCH"
run_fio() {
    local name=$1; shift
    fio --name="$name" --filename="$dev" --ioengine=io_uring --direct=1 --size=64M \
        --output="$SCRATCH/$name.txt" "$@" || { cat "$SCRATCH/$name.txt"; fail "fio $name failed"; }
    grep -q "err= 0" "$SCRATCH/$name.txt" || { cat "$SCRATCH/$name.txt"; fail "fio $name reported an error"; }
}
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
run_fio fill --rw=write --bs=1M --iodepth=16 --refill_buffers --end_fsync=1
sync "$dev"
wait_compacted "$store"
# Short reads at the full depth: every tag serves some, and the chunk and
# manifest caches fill with the data the long reads will read.
run_fio short --rw=randread --bs=4k --iodepth=128 --runtime=6 --time_based
run_fio short2 --rw=randread --bs=4k --iodepth=128 --runtime=3 --time_based
before=$(rss_kib)
run_fio long --rw=randread --bsrange=64k-512k --iodepth=128 --runtime=6 --time_based
after=$(rss_kib)
growth=$((after - before))
note "daemon VmRSS after short reads ${before} KiB, after long reads ${after} KiB (+${growth} KiB)"
[ "$growth" -le "$MAX_GROWTH_KIB" ] || fail "long reads grew the daemon by ${growth} KiB (at most $MAX_GROWTH_KIB): request data stays resident per tag"
"$CASBLK" del -a
wait_no_devices
