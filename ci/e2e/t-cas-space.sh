# A full store (issue 48 item 2): the store sits on a small ext4 with a
# 128 MiB space reserve (--space-reserve) and a ballast file, two images
# over it. b's flushed 4 MiB writes go on until the store is below the
# reserve; then (after b's one grace roll) a write waits (space_state 1)
# while GC runs, and once GC has freed nothing it fails with "No space
# left on device". The daemon
# and both images stay up (no image failed). a deletes and trims a file;
# GC frees it, the store goes back above the reserve (space_state 0), and
# writes resume on both images. Everything flushed reads back, after a
# restart too, and fsck is clean. 42-57 s in ci/vm (TCG), 70 s on a busy machine.
source "$(dirname "$0")/lib.sh"

modprobe loop 2>/dev/null || true
fsimg=$SCRATCH/space.img
truncate -s 768M "$fsimg"
loopdev=$(losetup -f --show "$fsimg") || fail "no loop device"
mkfs.ext4 -q -F -m 0 "$loopdev"
fsdir=$SCRATCH/space
mkdir -p "$fsdir" && mount "$loopdev" "$fsdir"
cleanup() {
    umount "$SCRATCH/mnt-a" 2>/dev/null || true
    "$CASBLK" del -a >/dev/null 2>&1 || true
    umount -l "$fsdir" 2>/dev/null || true
    losetup -d "$loopdev" 2>/dev/null || true
}
trap cleanup EXIT
store=$fsdir/store
"$CASBLK" --store "$store" image create a --size 256M >/dev/null
"$CASBLK" --store "$store" image create b --size 256M >/dev/null
expect_error "a reserve that is not a size" "$CASBLK" --store "$store" add --image a --space-reserve lots
adev=$(add_image "$store" a --space-reserve 128M --log-quota 16M --gc-auto-interval 15)
bdev=$(add_image "$store" b)
pid=$(daemon_pid "$adev")
[ "$(store_counter "$store" store space_reserve_bytes)" -eq $((128 << 20)) ] || fail "the reserve is not 128 MiB"

# a: a filesystem with a 64 MiB file to delete later and one to keep.
mnt=$SCRATCH/mnt-a
mkdir -p "$mnt"
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$adev"
mount "$adev" "$mnt"
head -c 64M /dev/urandom >"$mnt/big"
head -c 4M /dev/urandom >"$mnt/keep"
(cd "$mnt" && sha256sum keep) >"$SCRATCH/keep.sum"
sync
wait_compacted "$store"

# Ballast leaves 48 MiB above the reserve for b to fill.
avail=$(df -B1 --output=avail "$fsdir" | tail -n1)
ballast=$((avail - (128 << 20) - (48 << 20)))
[ "$ballast" -gt 0 ] || fail "the filesystem has only $avail bytes free"
fallocate -l "$ballast" "$fsdir/ballast"
sync
note "ballast $((ballast >> 20)) MiB; $(( $(df -B1 --output=avail "$fsdir" | tail -n1) >> 20 )) MiB free"

# b: flushed 4 MiB writes until one fails; the one that fails waits first.
t0=$SECONDS
flushed=$(fill_until_error "$bdev" 40)
[ "$flushed" -lt 40 ] || fail "160 MiB fit where 48 MiB were free above the reserve"
grep -q "No space left on device" "$SCRATCH/dd.err" || { cat "$SCRATCH/dd.err"; fail "the failing write did not say ENOSPC"; }
pid_alive "$pid" || fail "the daemon died on a full store"
[ "$(store_counter "$store" store space_state)" -eq 2 ] || fail "space_state is not 2 (full) after ENOSPC"
# b's first roll below the reserve is its grace roll; GC (woken when the
# store went low) may have shown it frees nothing before b asks again, so
# a wait is not certain here (cas/tests/space_reserve.rs shows one).
asked=$(( $(store_counter "$store" store space_waits) + $(store_counter "$store" store space_graces) ))
[ "$asked" -gt 0 ] || fail "no write asked the reserve before ENOSPC"
[ "$(store_counter "$store" store space_low_episodes)" -ge 1 ] || fail "the store never went below its reserve"
[ "$(store_counter "$store" store gc_auto_passes)" -ge 1 ] || fail "going below the reserve ran no GC pass"
[ "$(store_counter "$store" store space_refusals)" -gt 0 ] || fail "no space refusal was counted"
failures=$("$CASBLK" --store "$store" stats --json \
    | python3 -c "import json,sys; print(' '.join(i['name'] + ': ' + i['failure'] for i in json.load(sys.stdin)['images'] if i['failure']))")
[ -z "$failures" ] || fail "an image failed on a full store: $failures"
note "b: $flushed flushed 4 MiB writes, the next failed with ENOSPC ($((SECONDS - t0)) s of writes; $asked asks of the reserve held or graced); daemon and images up"
tally space_enospc 1

# a gives space back: rm, sync (a small write into its log's current
# segment), fstrim. GC frees the file's packs and the store leaves the
# reserve.
rm "$mnt/big"
sync
out=$(fstrim -v "$mnt") || fail "fstrim failed on a full store"
trimmed=$(echo "$out" | grep -o '[0-9]* bytes' | grep -o '[0-9]*')
[ "${trimmed:-0}" -ge $((64 << 20)) ] || fail "fstrim trimmed only ${trimmed:-0} bytes: $out"
t1=$SECONDS
state=2
while [ $((SECONDS - t1)) -lt 90 ]; do
    state=$(store_counter "$store" store space_state)
    [ "$state" -eq 0 ] && break
    sleep 2
done
if [ "$state" -ne 0 ]; then
    "$CASBLK" --store "$store" stats --json | python3 -c "import json,sys; print(json.load(sys.stdin)['counters']['store'])" >&2
    grep -iE "space|gc|compaction" /run/casblk/casblk.log | tail -n 40 >&2
    fail "the store did not go back above its reserve within 90 s of the trim (state $state)"
fi
note "after the trim: above the reserve again in $((SECONDS - t1)) s ($(store_counter "$store" store gc_auto_passes) automatic GC passes)"

# Writes resume on both images: 12 MiB of new data, which with its log
# fits in what GC freed above the reserve (more would be a full store
# again). a's file is fsync'd: a plain sync(1) does not report an ext4
# writeback error.
for i in $(seq "$flushed" $((flushed + 1))); do
    head -c 4M /dev/urandom >"$SCRATCH/fill$i"
    dd if="$SCRATCH/fill$i" of="$bdev" bs=1M seek=$((i * 4)) oflag=direct conv=fsync status=none \
        || fail "b's write $i failed after space came back"
done
flushed=$((flushed + 2))
head -c 4M /dev/urandom >"$mnt/more"
(cd "$mnt" && sha256sum more) >"$SCRATCH/more.sum"
sync "$mnt/more" || fail "a's fsync failed after space came back"
sync
(cd "$mnt" && sha256sum --quiet -c "$SCRATCH/keep.sum") || fail "a's kept file changed"
tally space_resumed 1
umount "$mnt"

# Restart: every flushed write of b and a's files read back; fsck clean.
"$CASBLK" del -a
wait_no_devices
sum=$(fsck_clean "$store") || exit 1
note "after the full store: $sum"
adev=$(add_image "$store" a --space-reserve 128M)
bdev=$(add_image "$store" b)
for i in $(seq 0 $((flushed - 1))); do
    dd if="$bdev" of="$SCRATCH/b.read" bs=1M skip=$((i * 4)) count=4 iflag=direct status=none
    cmp -s "$SCRATCH/fill$i" "$SCRATCH/b.read" || fail "b's flushed write $i did not read back"
done
mount "$adev" "$mnt"
(cd "$mnt" && sha256sum --quiet -c "$SCRATCH/keep.sum" && sha256sum --quiet -c "$SCRATCH/more.sum") \
    || fail "a's files changed across the restart"
umount "$mnt"
note "after a restart: b's $flushed flushed writes and a's files read back"
