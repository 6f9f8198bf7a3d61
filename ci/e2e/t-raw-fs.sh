# ext4 and xfs on a raw-mode device: mkfs, mount, write a file tree,
# unmount, remount and verify; then detach, reattach and verify again.
source "$(dirname "$0")/lib.sh"
for fs in ext4 xfs; do
    backing=$(new_backing 512M)
    dev=$(add_raw "$backing" -q 2 -d 64)
    [ -b "$dev" ] || fail "$dev is not a block device"
    mnt=$SCRATCH/mnt-$fs
    fs_roundtrip "$dev" "$fs" "$mnt"
    note "$fs: tree verified after remount"
    "$CASBLK" del -n "$(dev_id "$dev")"
    [ ! -e "$dev" ] || fail "$dev still exists after del"
    dev=$(add_raw "$backing")
    mount "$dev" "$mnt"
    verify_tree "$mnt"
    umount "$mnt"
    "$CASBLK" del -n "$(dev_id "$dev")"
    note "$fs: tree verified after detach and reattach"
done
assert_no_devices
