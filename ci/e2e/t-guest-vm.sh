# A virtual machine on casblk disks. A guest (ci/guest: the test VM's own
# kernel and a tiny root, under QEMU's emulation nested in the test VM)
# boots with its root filesystem on one image and a second image as its
# data disk, both virtio-blk by their /dev/casblk names (cache=none,
# aio=io_uring, discard=unmap). While it makes ext4 on the data disk,
# writes and fsyncs files and runs a crc32c verifier, the store daemon is
# killed with -9 and recovered, then upgraded; `del` of a disk it holds is
# refused. Its root is snapshotted while it runs (frozen inside the guest
# meanwhile) and written after. It deletes a file and runs fstrim: the
# store's stored bytes fall by at least 80% of the file. It sees no IO
# error (its kernel log, the verifier, its filesystems still writable).
# Then a guest boots from a clone of the snapshot while the host writes a
# second clone: each has what came before the snapshot, not what came
# after, and only its own writes; the guest is also the data disk's reboot
# (every file the guest fsynced reads back). The long mode kills
# E2E_ROUNDS times and boots E2E_GUEST_CLONES clones at once (a booted
# guest costs about 150 s here, two at once about 285 s).
# e2e-timeout: 2400
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../guest/lib.sh"
seed=$RANDOM
fill_mib=32
store=$(new_store data 256M)
guest_root_image "$SCRATCH/root.img"
"$CASBLK" --store "$store" image import root "$SCRATCH/root.img" >/dev/null || fail "importing the guest root failed"
root_dev=$(add_image "$store" root)
data_dev=$(add_image "$store" data)
[ "$(readlink -f /dev/casblk/root)" = "$root_dev" ] || fail "/dev/casblk/root does not lead to $root_dev"

# Bad input first, while it is cheap: a disk named for an image that is
# not attached (QEMU fails at once, naming it), a snapshot of no image.
rc=0
timeout 120 "$GUEST_DIR/run" --console "$SCRATCH/none.console" /dev/casblk/none >"$SCRATCH/none.qemu" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "QEMU on a missing image exited $rc"
grep -q "/dev/casblk/none" "$SCRATCH/none.qemu" || fail "QEMU's error does not name the missing disk: $(cat "$SCRATCH/none.qemu")"
note "QEMU given /dev/casblk/none: exit $rc, $(head -n1 "$SCRATCH/none.qemu")"
expect_error "snapshot of a missing image" "$CASBLK" --store "$store" image snapshot none gold

guest_start g1 "casblk.role=main casblk.seed=$seed casblk.data=/dev/vdb casblk.fill_mib=$fill_mib" \
    /dev/casblk/root /dev/casblk/data
up=$(guest_wait g1 up 900)
note "guest g1 at its agent: $up"
guest_wait g1 data-mounted 600 >/dev/null

# guest_progress NAME N SECONDS: until guest NAME has fsynced N files.
guest_progress() {
    local deadline=$((SECONDS + $3))
    while [ "$(guest_count "$1" fsynced)" -lt "$2" ]; do
        [ "$SECONDS" -lt "$deadline" ] || guest_fail "$1" "fewer than $2 files fsynced within $3 s"
        grep -q '^FAIL' <<<"$(guest_reports "$1")" && guest_fail "$1" "reported a failure"
        sleep 1
    done
}
guest_progress g1 3 600

# A disk the guest holds cannot be deleted under it.
expect_error "del of a disk QEMU holds" "$CASBLK" del -n "$(dev_id "$data_dev")"
grep -q "qemu" <<<"$("$CASBLK" del -n "$(dev_id "$data_dev")" 2>&1)" || fail "del's refusal does not name QEMU"

# kill -9 with the guest's IO flowing: its data disk completing requests
# right up to the kill, none while the daemon is gone, more after the
# recovery.
for round in $(seq "${E2E_ROUNDS:-1}"); do
    before=$(guest_count g1 fsynced)
    kill_under_io "$(daemon_pid "$data_dev")" "$data_dev"
    "$CASBLK" recover -a >/dev/null || fail "recover -a failed"
    wait_io_resumed "$data_dev"
    guest_progress g1 $((before + 2)) 600
    note "kill -9 $round under the guest's IO after $before files; recovered, the guest went on to $(guest_count g1 fsynced)"
done

before=$(guest_count g1 fsynced)
"$CASBLK" upgrade -a >/dev/null || fail "upgrade -a failed"
guest_progress g1 $((before + 2)) 600
note "upgrade after $before files; the guest went on to $(guest_count g1 fsynced)"

guest_say g1 stop
line=$(guest_wait g1 stopped 600)
files=$(guest_value "$line" files)
verified=$(guest_wait g1 verified 600)
note "guest: $line; $verified"

# A snapshot of the running guest's root, frozen inside it meanwhile.
guest_wait g1 frozen 300 >/dev/null
"$CASBLK" --store "$store" image snapshot root gold >/dev/null || fail "snapshot of the running guest's root failed"
guest_say g1 snapshotted
guest_wait g1 after-snapshot 300 >/dev/null

# Discard: the guest fills its disk with data nothing else shares, deletes
# it and trims; compaction and GC give the store's space back.
guest_wait g1 filled 900 >/dev/null
wait_compacted "$store"
"$CASBLK" --store "$store" gc >/dev/null
full=$(store_counter "$store" store stored_bytes)
guest_say g1 delete
trimmed=$(guest_wait g1 trimmed 600)
note "guest: $trimmed"
want=$(((fill_mib << 20) * 8 / 10))
deadline=$((SECONDS + 180))
while :; do
    wait_compacted "$store"
    "$CASBLK" --store "$store" gc >/dev/null
    now=$(store_counter "$store" store stored_bytes)
    [ $((full - now)) -lt "$want" ] || break
    [ "$SECONDS" -lt "$deadline" ] || fail "the store freed $(((full - now) >> 20)) MiB of the $fill_mib MiB the guest deleted and trimmed (need 80%)"
    sleep 2
done
note "discard: stored bytes $((full >> 20)) -> $((now >> 20)) MiB: freed $(((full - now) * 100 / (fill_mib << 20)))% of the $fill_mib MiB deleted"
guest_end g1 600

# The root as the guest left it, read on the host: both marks are there.
mkdir -p "$SCRATCH/root-ro"
mount -o ro /dev/casblk/root "$SCRATCH/root-ro" || fail "mounting the guest's root on the host failed"
for mark in first-boot after-snapshot; do
    [ -f "$SCRATCH/root-ro/$mark" ] || fail "/$mark, fsynced by the guest, is not on its root"
done
umount "$SCRATCH/root-ro"

# Clones of the snapshot: E2E_GUEST_CLONES guests booting at once (default
# 1; the long mode boots more) and h1, which the host mounts and writes
# while they run. The first guest also has the first guest's data disk:
# that disk's reboot, where every file the guest fsynced reads back.
clones=${E2E_GUEST_CLONES:-1}
for name in h1 $(seq -f 'c%g' "$clones"); do
    "$CASBLK" --store "$store" image clone root@gold "$name" >/dev/null || fail "clone $name failed"
    add_image "$store" "$name" >/dev/null
done
guest_start c1 "casblk.role=clone casblk.name=c1 casblk.seed=$seed casblk.data=/dev/vdb casblk.expect=$files" \
    /dev/casblk/c1 /dev/casblk/data
for i in $(seq 2 "$clones"); do
    guest_start "c$i" "casblk.role=clone casblk.name=c$i" "/dev/casblk/c$i"
done
# mount_h1 [OPTIONS]: h1's root on the host; sets marks to its clone-* files.
mount_h1() {
    mount "$@" /dev/casblk/h1 "$SCRATCH/h1" || fail "mounting clone h1 on the host failed"
    marks=$(find "$SCRATCH/h1" -maxdepth 1 -name 'clone-*' -printf '%f\n' | sort | tr '\n' ' ')
}
mkdir -p "$SCRATCH/h1"
for i in $(seq "$clones"); do guest_wait "c$i" clone-written 1200 >/dev/null; done
mount_h1
[ -f "$SCRATCH/h1/first-boot" ] || fail "clone h1 lacks /first-boot, written before the snapshot"
[ ! -e "$SCRATCH/h1/after-snapshot" ] || fail "clone h1 has /after-snapshot, written after the snapshot"
[ -z "$marks" ] || fail "clone h1 holds $marks before anything wrote it"
echo h1 >"$SCRATCH/h1/clone-h1"
sync -f "$SCRATCH/h1/clone-h1"
umount "$SCRATCH/h1"
for i in $(seq "$clones"); do guest_say "c$i" both-written; done
files_ok=$(guest_wait c1 files-ok 900)
note "guest c1: $files_ok"
for i in $(seq "$clones"); do guest_end "c$i" 300; done
mount_h1 -o ro
umount "$SCRATCH/h1"
[ "$marks" = "clone-h1 " ] || fail "clone h1 holds '$marks', not only clone-h1"
info=$("$CASBLK" --store "$store" image info c1 --json)
shared=$(python3 -c "import json,sys; print(json.load(sys.stdin)['shared_bytes'])" <<<"$info")
[ "$shared" -gt 0 ] || fail "clone c1 shares no chunk with the base: $info"
note "clone c1 shares $((shared >> 20)) MiB with the base and h1; h1 holds only its own mark"

"$CASBLK" del -a
wait_no_devices
sum=$(fsck_clean "$store") || exit 1
note "$sum"
