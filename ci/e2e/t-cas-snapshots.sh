# Snapshots, clones, rollback, qcow2 import and export on real devices:
# a snapshot taken during fio random writes and a pattern writer holds a
# point between two completed writes; a snapshot attaches read-only; a
# snapshot of a mounted ext4 passes fsck -fn; a clone mounts beside its
# parent; mkfs on a clone of an empty image; rollback through the daemon;
# a qcow2 from qemu-img/qemu-io imports and compares equal on the device.
# e2e-7.3  (also run on the 7.3 kernel: the smoke group)
source "$(dirname "$0")/lib.sh"
store=$(new_store vm 256M)
dev=$(add_image "$store" vm)

# --- a snapshot during writes: the pattern writer logs each completion.
blocks=2048
cat > "$SCRATCH/pattern.py" <<'PY'
import mmap, os, sys
dev, log, stop, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
out = open(log, "w", buffering=1)
for i in range(n):
    if os.path.exists(stop):
        break
    buf.seek(0)
    buf.write((b"%016d" % (i + 1)) * 256)
    os.pwrite(fd, buf, i * 4096)
    out.write(f"{i}\n")
PY
fio --name=bg --filename="$dev" --rw=randwrite --bs=4k --offset=128M --size=128M --iodepth=8 \
    --ioengine=io_uring --direct=1 --time_based --runtime=600 --output="$SCRATCH/fio-bg.txt" &
fio_pid=$!
touch "$SCRATCH/done.log"
python3 "$SCRATCH/pattern.py" "$dev" "$SCRATCH/done.log" "$SCRATCH/stop" "$blocks" &
writer=$!
for _ in $(seq 600); do [ "$(wc -l < "$SCRATCH/done.log")" -ge 100 ] && break; sleep 0.1; done
before=$(wc -l < "$SCRATCH/done.log")
"$CASBLK" --store "$store" image snapshot vm mid >/dev/null
after=$(wc -l < "$SCRATCH/done.log")
touch "$SCRATCH/stop"
wait "$writer" || fail "the pattern writer failed"
kill "$fio_pid"; wait "$fio_pid" 2>/dev/null || true
snap=$(add_image "$store" vm@mid)
[ "$(blockdev --getro "$snap")" = 1 ] || fail "the snapshot's device is not read-only"
python3 - "$snap" "$before" "$after" "$blocks" <<'PY' || fail "the snapshot is not a point between two completed writes"
import sys
dev, before, after, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = open(dev, "rb").read(n * 4096)
k = 0
while k < n and data[k * 4096:(k + 1) * 4096] == (b"%016d" % (k + 1)) * 256:
    k += 1
rest = data[k * 4096:]
assert rest == bytes(len(rest)), f"block {k} is neither the writer's pattern nor unwritten"
print(f"snapshot holds writes 0..{k}; {before} had completed when the command started, {after} when it returned")
assert before <= k <= after + 1, (before, k, after)
PY
note "snapshot during fio + pattern writes: a prefix of completed writes ($before..$after completed around it)"
if dd if=/dev/zero of="$snap" bs=4k count=1 oflag=direct status=none 2>/dev/null; then
    fail "a write to the read-only snapshot device succeeded"
fi
sha_mid=$(head -c $((blocks * 4096)) "$snap" | sha256sum | cut -d' ' -f1)

# refused_because WHAT WHY CMD...: CMD fails in one line saying WHY.
refused_because() {
    local what=$1 why=$2 err; shift 2
    expect_error "$what" "$@"
    err=$("$@" 2>&1) || true
    case $err in *"$why"*) ;; *) fail "$what: refused, but not because $why: $err" ;; esac
}

# --- a snapshot of a mounted ext4 after a sync; a clone mounted beside it.
"$CASBLK" --store "$store" image create fs --size 256M >/dev/null
fsdev=$(add_image "$store" fs)
mkfs.ext4 -q -F "$fsdev"
mkdir -p "$SCRATCH/mnt" "$SCRATCH/snapmnt" "$SCRATCH/clonemnt"
mount "$fsdev" "$SCRATCH/mnt"
make_tree "$SCRATCH/mnt" 30
sync
"$CASBLK" --store "$store" image snapshot fs s1 >/dev/null
fssnap=$(add_image "$store" fs@s1)
fsck.ext4 -fn "$fssnap" > "$SCRATCH/fsck-snap.txt" 2>&1 || { cat "$SCRATCH/fsck-snap.txt"; fail "fsck.ext4 -fn of the snapshot found problems"; }
mount -o ro,noload "$fssnap" "$SCRATCH/snapmnt"
verify_tree "$SCRATCH/snapmnt"
umount "$SCRATCH/snapmnt"
note "snapshot of a mounted ext4 after sync: fsck.ext4 -fn clean, tree verified read-only"
"$CASBLK" --store "$store" image clone fs@s1 fsclone >/dev/null
clonedev=$(add_image "$store" fsclone)
mount "$clonedev" "$SCRATCH/clonemnt"
verify_tree "$SCRATCH/clonemnt"
echo "clone only" > "$SCRATCH/clonemnt/clone-only"
umount "$SCRATCH/clonemnt"
[ ! -e "$SCRATCH/mnt/clone-only" ] || fail "a write to the clone shows in its parent"
verify_tree "$SCRATCH/mnt"
umount "$SCRATCH/mnt"
note "clone mounted and written while its parent stayed mounted; the parent unchanged"
"$CASBLK" del -n "$(dev_id "$fssnap")"
refused_because "rm of a snapshot with clones" "clones depend on it (fsclone)" \
    "$CASBLK" --store "$store" image rm fs@s1

# --- mkfs on a clone of an empty image.
"$CASBLK" --store "$store" image create empty --size 128M >/dev/null
"$CASBLK" --store "$store" image snapshot empty e >/dev/null
"$CASBLK" --store "$store" image clone empty@e fresh >/dev/null
freshdev=$(add_image "$store" fresh)
fs_roundtrip "$freshdev" ext4 "$SCRATCH/freshmnt"
note "mkfs.ext4 on a clone of an empty image: tree verified after remount"
"$CASBLK" --store "$store" image info fresh --json > "$SCRATCH/info.json"
python3 - "$SCRATCH/info.json" <<'PY' || fail "image info is wrong"
import json, sys
i = json.load(open(sys.argv[1]))
assert i["parent"] == "empty@e" and i["kind"] == "image" and i["device"], i
print(f"info fresh: logical {i['logical_bytes']}, unique {i['unique_bytes']}, shared {i['shared_bytes']}, log {i['log_bytes']}")
PY

# --- rollback through the daemon: vm back to mid.
"$CASBLK" del -n "$(dev_id "$dev")"
refused_because "rm of an image with snapshots" "it has snapshots (vm@mid)" "$CASBLK" --store "$store" image rm vm
"$CASBLK" --store "$store" image rollback vm mid
dev=$(add_image "$store" vm)
[ "$(head -c $((blocks * 4096)) "$dev" | sha256sum | cut -d' ' -f1)" = "$sha_mid" ] ||
    fail "after rollback vm does not read as its snapshot"
note "rollback of the detached vm to vm@mid: reads as the snapshot"

# --- a qcow2 made by qemu-img and qemu-io, imported and compared on the device.
qstore=$SCRATCH/qstore
q=$SCRATCH/disk.qcow2
qemu-img create -q -f qcow2 "$q" 64M
for cmd in "write -P 0x5a 0 4M" "write -P 0x11 8M 1M" "write -z 8M 256k" "write -P 0x77 30M 12k" "write -P 0x3c 63M 1M"; do
    qemu-io -f qcow2 -c "$cmd" "$q" >/dev/null
done
"$CASBLK" --store "$qstore" image import q "$q" > "$SCRATCH/import.txt" || fail "qcow2 import failed"
qdev=$(add_image "$qstore" q)
qemu-img compare -f qcow2 -F raw "$q" "$qdev" > "$SCRATCH/compare.txt" 2>&1 ||
    { cat "$SCRATCH/compare.txt"; fail "the imported qcow2 differs from its device"; }
note "qcow2 import: $(cat "$SCRATCH/import.txt"); qemu-img compare equal"

# --- import and export through the daemon serving the store.
"$CASBLK" --store "$store" image import golden "$q" > "$SCRATCH/import-served.txt" ||
    fail "qcow2 import through the daemon failed"
gdev=$(add_image "$store" golden)
qemu-img compare -q -f qcow2 -F raw "$q" "$gdev" || fail "the qcow2 imported through the daemon differs"
refused_because "export of an attached image" "export a snapshot" \
    "$CASBLK" --store "$store" image export vm@mid "$SCRATCH/attached.raw"
"$CASBLK" --store "$store" image export fs@s1 "$SCRATCH/s1.raw"
fsck.ext4 -fn "$SCRATCH/s1.raw" > "$SCRATCH/fsck-s1.txt" 2>&1 ||
    { cat "$SCRATCH/fsck-s1.txt"; fail "fsck.ext4 -fn of the exported snapshot found problems"; }
note "through the daemon: qcow2 import compares equal; export of the detached fs@s1 passes fsck.ext4 -fn"

# --- export round trip (offline: once the daemons let go).
"$CASBLK" del -a
wait_no_devices
sum=$(fsck_clean "$store") || exit 1
note "store with snapshots and clones: $sum"
"$CASBLK" --store "$store" image export vm@mid "$SCRATCH/mid.raw"
[ "$(head -c $((blocks * 4096)) "$SCRATCH/mid.raw" | sha256sum | cut -d' ' -f1)" = "$sha_mid" ] ||
    fail "the exported snapshot differs from its device"
"$CASBLK" --store "$store" image export vm@mid "$SCRATCH/mid.qcow2" --format qcow2
qemu-img compare -q -f raw -F qcow2 "$SCRATCH/mid.raw" "$SCRATCH/mid.qcow2" || fail "raw and qcow2 exports differ"
"$CASBLK" --store "$qstore" image export q "$SCRATCH/q.raw"
qemu-img compare -q -f qcow2 -F raw "$q" "$SCRATCH/q.raw" || fail "the qcow2 round trip differs"
note "export raw and qcow2 of vm@mid and of the imported qcow2: equal"
