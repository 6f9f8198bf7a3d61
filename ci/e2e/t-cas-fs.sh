# ext4 and xfs on store images: mkfs, mount, file tree, remount; then
# detach (the daemon exits), reattach (a new daemon replays the log) and
# verify the tree again.
source "$(dirname "$0")/lib.sh"
for fs in ext4 xfs; do
    store=$(new_store "img-$fs" 512M)
    dev=$(add_image "$store" "img-$fs" -q 2 -d 64)
    mnt=$SCRATCH/mnt-$fs
    fs_roundtrip "$dev" "$fs" "$mnt"
    note "$fs: tree verified after remount"
    pid=$(daemon_pid "$dev")
    "$CASBLK" del -n "$(dev_id "$dev")"
    for _ in $(seq 100); do pid_alive "$pid" || break; sleep 0.1; done
    ! pid_alive "$pid" || fail "the store daemon did not exit after its last device was deleted"
    dev=$(add_image "$store" "img-$fs")
    mount "$dev" "$mnt"
    verify_tree "$mnt"
    umount "$mnt"
    "$CASBLK" del -n "$(dev_id "$dev")"
    note "$fs: tree verified after detach, daemon exit and reattach"
done
wait_no_devices
