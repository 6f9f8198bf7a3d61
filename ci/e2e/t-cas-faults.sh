# Faults under the store: its filesystem sits on device-mapper (dm-flakey
# over a loop file). While every write to it fails with EIO, a write and
# FLUSH to the CAS device fails instead of being acknowledged, the daemon
# stays up, the image reports why it failed, and reads of data flushed
# before go on. Once the fault is cleared and the store reopened, every
# write flushed before the fault reads back.
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
    dmesg | grep -qiE "EXT4-fs.*(shut|abort|error)" || fail "a read failed during a write fault, and ext4 did not shut down"
    reads="reads fail only as ext4 shut down"
fi
note "EIO on every store write: write+FLUSH failed, daemon up, image says '$failure', $reads"

# Clear the fault, repair the filesystem, reopen the store.
timeout 60 "$CASBLK" del -n "$id" || fail "del of the failed device failed"
umount "$SCRATCH/fs" || umount -l "$SCRATCH/fs"
table "0 $sectors linear $loopdev 0" || fail "restoring the linear table failed"
rc=0
e2fsck -fy "/dev/mapper/$dm" >"$SCRATCH/e2fsck.txt" 2>&1 || rc=$?
[ "$rc" -le 1 ] || { cat "$SCRATCH/e2fsck.txt"; fail "e2fsck could not repair the store's filesystem (exit $rc)"; }
mount "/dev/mapper/$dm" "$SCRATCH/fs"
dev=$(add_image "$store" vm) || fail "the store did not reopen after the fault"
dd if="$dev" of="$SCRATCH/a.read" bs=1M count=8 iflag=direct status=none
cmp -s "$SCRATCH/a" "$SCRATCH/a.read" || fail "a write flushed before the fault was lost"
note "fault cleared, store reopened: every write flushed before the fault reads back"
