# Faults under the store: its filesystem sits on device-mapper (dm-flakey
# over a loop file). While every write to it fails with EIO, a write and
# FLUSH to the CAS device fails instead of being acknowledged, the daemon
# stays up, the image reports why it failed, and reads never return wrong
# data. While every read fails too, reads of compacted data fail or return
# the right data. A store on a full filesystem (ENOSPC) fails the write
# that does not fit; a burst of failing requests writes a bounded number of
# log lines. After each fault is cleared and the store reopened,
# every write flushed before it reads back, and `casblk fsck` is clean.
source "$(dirname "$0")/lib.sh"
modprobe -a loop dm-flakey 2>/dev/null || true
export DM_DISABLE_UDEV=1
dm=casblk-faults-$$
img=$SCRATCH/under.img
truncate -s 384M "$img"
loopdev=$(losetup -f --show "$img")
sectors=$(blockdev --getsz "$loopdev")
cleanup() {
    "$CASBLK" del -a >/dev/null 2>&1 || true
    umount -l "$SCRATCH/fs" 2>/dev/null || true
    umount -l "$SCRATCH/small" 2>/dev/null || true
    dmsetup remove --noudevsync "$dm" 2>/dev/null || true
    losetup -d "$loopdev" 2>/dev/null || true
}
trap cleanup EXIT
table() { dmsetup load --noudevsync "$dm" --table "$1" && dmsetup resume --noudevsync "$dm"; }
dmsetup create --noudevsync "$dm" --table "0 $sectors linear $loopdev 0" || fail "dmsetup create failed"
dmsetup mknodes "$dm"
mkfs.ext4 -q "/dev/mapper/$dm"
mkdir -p "$SCRATCH/fs" && mount "/dev/mapper/$dm" "$SCRATCH/fs"
store=$SCRATCH/fs/store
"$CASBLK" --store "$store" image create vm --size 128M >/dev/null
dev=$(add_image "$store" vm)
id=$(dev_id "$dev")
pid=$(daemon_pid "$dev")
head -c 8M /dev/urandom >"$SCRATCH/a"
dd if="$SCRATCH/a" of="$dev" bs=1M oflag=direct conv=fsync status=none || fail "the flushed write before the fault failed"

# The fault: every write to the store's device fails; reads still work.
klog=$(kernel_log_mark)
table "0 $sectors flakey $loopdev 0 0 3600 1 error_writes" || fail "loading the dm-flakey table failed"
head -c 4M /dev/urandom >"$SCRATCH/b"
if timeout 60 dd if="$SCRATCH/b" of="$dev" bs=1M seek=16 oflag=direct conv=fsync status=none 2>"$SCRATCH/dd.err"; then
    fail "a write and FLUSH succeeded while every write to the store failed"
fi
grep -qi "error" "$SCRATCH/dd.err" || { cat "$SCRATCH/dd.err"; fail "dd failed without an IO error"; }
pid_alive "$pid" || fail "the daemon died on the fault"
failure=$("$CASBLK" stats -n "$id" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['images'][0]['failure'])")
[ -n "$failure" ] || fail "stats does not say why the image failed"
# ext4 shuts itself down when its journal cannot be written, and then
# fails reads as well: a read may fail, but never returns wrong data.
if dd if="$dev" of="$SCRATCH/a.read" bs=1M count=8 iflag=direct status=none 2>/dev/null; then
    cmp -s "$SCRATCH/a" "$SCRATCH/a.read" || fail "flushed data read back wrong during the fault"
    reads="flushed data reads back"
else
    klog=$(kernel_log_since "$klog")
    grep -qiE "EXT4-fs.*(shut|abort|error)" <<<"$klog" \
        || { printf "%s\n" "$klog" | tail -n 20; tail -n 20 /run/casblk/casblk.log || true; fail "a read failed during a write fault, and ext4 did not shut down"; }
    reads="reads fail only as ext4 shut down"
fi
tally fault_eio_writes 1
note "EIO on every store write: write+FLUSH failed, daemon up, image says '$failure', $reads"

# A guest retrying against the failed image: its failures are counted,
# but the daemon's log gets at most one line per image per 10 s.
mark=$(grep -c "" /run/casblk/casblk.log || true)
t0=$SECONDS
fio --name=failing --filename="$dev" --rw=randwrite --bs=4k --direct=1 --ioengine=psync --offset=32M --size=8M \
    --continue_on_error=all --output-format=json --output="$SCRATCH/failing.json" >/dev/null 2>&1 || true
failed=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['jobs'][0]['total_err'])" "$SCRATCH/failing.json") \
    || fail "fio against the failed image left no JSON"
lines=$(tail -n +"$((mark + 1))" /run/casblk/casblk.log | grep -cE "request failed|read failed|refused a request" || true)
[ "$failed" -ge 1000 ] || fail "only $failed of fio's 2048 writes to the failed image failed"
[ "$lines" -le $((2 + (SECONDS - t0) / 10)) ] || fail "$failed failed requests wrote $lines lines to the daemon's log in $((SECONDS - t0)) s"
note "$failed failed writes to the failed image in $((SECONDS - t0)) s: $lines lines in the daemon's log"

# Clear the fault, repair the filesystem, reopen the store: REOPEN_ARGS
# go to add; sets dev.
reopen() {
    timeout 60 "$CASBLK" del -a || fail "del of the failed device failed"
    umount "$SCRATCH/fs" || umount -l "$SCRATCH/fs"
    table "0 $sectors linear $loopdev 0" || fail "restoring the linear table failed"
    local rc=0
    e2fsck -fy "/dev/mapper/$dm" >"$SCRATCH/e2fsck.txt" 2>&1 || rc=$?
    [ "$rc" -le 1 ] || { cat "$SCRATCH/e2fsck.txt"; fail "e2fsck could not repair the store's filesystem (exit $rc)"; }
    mount "/dev/mapper/$dm" "$SCRATCH/fs"
    dev=$(add_image "$store" vm "$@") || fail "the store did not reopen after the fault"
}
reopen --chunk-cache 1M
dd if="$dev" of="$SCRATCH/a.read" bs=1M count=8 iflag=direct status=none
cmp -s "$SCRATCH/a" "$SCRATCH/a.read" || fail "a write flushed before the write fault was lost"
note "fault cleared, store reopened: every write flushed before the fault reads back"

# Reads fail under the store: the data compacted into chunks, the caches
# dropped (a 1 MiB chunk cache, the kernel's page cache), then every IO to
# the store's device fails. A read fails or returns the right data, never
# other data; the daemon stays up.
wait_compacted "$store"
echo 3 >/proc/sys/vm/drop_caches
pid=$(daemon_pid "$dev")
table "0 $sectors flakey $loopdev 0 0 3600" || fail "loading the failing dm-flakey table failed"
if dd if="$dev" of="$SCRATCH/a.read" bs=1M count=8 iflag=direct status=none 2>"$SCRATCH/dd.err"; then
    cmp -s "$SCRATCH/a" "$SCRATCH/a.read" || fail "a read returned wrong data while the store's reads failed"
    reads="reads still served (cached)"
else
    grep -qi "error" "$SCRATCH/dd.err" || { cat "$SCRATCH/dd.err"; fail "the read failed without an IO error"; }
    reads="reads fail with EIO"
fi
pid_alive "$pid" || fail "the daemon died on read errors"
reopen
dd if="$dev" of="$SCRATCH/a.read" bs=1M count=8 iflag=direct status=none
cmp -s "$SCRATCH/a" "$SCRATCH/a.read" || fail "flushed data was lost across the read fault"
tally fault_eio_all_io 1
note "EIO on every store IO: $reads, daemon up; cleared and reopened, flushed data reads back"
"$CASBLK" del -a
sum=$(fsck_clean "$store") || exit 1
note "after the EIO faults: $sum"

# ENOSPC without a space reserve (--space-reserve 0; t-cas-space has
# one): a store on a 64 MiB filesystem, an image twice that size. Writes
# of 4 MiB, each flushed, go on until one fails; the daemon stays up and
# the image has not failed (a log segment is allocated when it is made,
# so only a roll meets ENOSPC, before its write has a place in the log).
# With space freed (a ballast file removed) and the store reopened, every
# write that was flushed reads back.
small=$SCRATCH/small.img
truncate -s 64M "$small"
mkfs.ext4 -q -F "$small"
mkdir -p "$SCRATCH/small" && mount -o loop "$small" "$SCRATCH/small"
head -c 8M /dev/zero >"$SCRATCH/small/ballast" && sync
sstore=$SCRATCH/small/store
"$CASBLK" --store "$sstore" image create big --size 128M >/dev/null
bdev=$(add_image "$sstore" big --log-quota 16M --space-reserve 0)
bpid=$(daemon_pid "$bdev")
flushed=$(fill_until_error "$bdev" 32)
[ "$flushed" -lt 32 ] || fail "128 MiB of new data fit on a 64 MiB filesystem"
grep -qiE "error|space" "$SCRATCH/dd.err" || { cat "$SCRATCH/dd.err"; fail "the failing write did not report an IO error"; }
pid_alive "$bpid" || fail "the daemon died on ENOSPC"
bfail=$("$CASBLK" stats -n "$(dev_id "$bdev")" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['images'][0]['failure'])")
case "$bfail" in failed*) fail "the image failed on ENOSPC: $bfail" ;; esac
timeout 60 "$CASBLK" del -a || fail "del after ENOSPC failed"
rm -f "$SCRATCH/small/ballast"
bdev=$(add_image "$sstore" big --log-quota 16M --space-reserve 0) || fail "the store did not reopen after ENOSPC"
for i in $(seq 0 $((flushed - 1))); do
    dd if="$bdev" of="$SCRATCH/blk.read" bs=1M skip=$((i * 4)) count=4 iflag=direct status=none
    cmp -s "$SCRATCH/fill$i" "$SCRATCH/blk.read" || fail "flushed block $i was lost across ENOSPC"
done
tally fault_enospc 1
note "ENOSPC after $flushed flushed 4 MiB writes: the next failed, daemon up; space freed and reopened, all $flushed read back"
"$CASBLK" del -a
sum=$(fsck_clean "$sstore") || exit 1
note "after ENOSPC: $sum"
umount "$SCRATCH/small"
