# Bad input gets one line of error and a non-zero exit, never a panic or a
# leaked device.
source "$(dirname "$0")/lib.sh"
expect_error "missing backing file" "$CASBLK" add --backing "$SCRATCH/nope.img"
mkdir -p "$SCRATCH/dir"
expect_error "backing is a directory" "$CASBLK" add --backing "$SCRATCH/dir"
unreadable=$(new_backing 1M); chmod 000 "$unreadable"; chmod 755 "$SCRATCH"
expect_error "unreadable backing file (as nobody)" setpriv --reuid=nobody --regid=nogroup --clear-groups "$CASBLK" add --backing "$unreadable"
mkdir -p "$SCRATCH/ro" && mount -t tmpfs -o size=4M tmpfs "$SCRATCH/ro"
truncate -s 1M "$SCRATCH/ro/disk.img" && mount -o remount,ro "$SCRATCH/ro"
expect_error "backing on a read-only filesystem" "$CASBLK" add --backing "$SCRATCH/ro/disk.img"
umount "$SCRATCH/ro"
empty=$(new_backing 0)
expect_error "zero-size backing file" "$CASBLK" add --backing "$empty"
odd=$(new_backing 1000)
expect_error "size not a multiple of 512" "$CASBLK" add --backing "$odd"
good=$(new_backing 8M)
expect_error "zero queues" "$CASBLK" add --backing "$good" -q 0
expect_error "depth too large" "$CASBLK" add --backing "$good" -d 5000
expect_error "io buffer not 4 KiB aligned" "$CASBLK" add --backing "$good" --io-buf-bytes 5000
expect_error "unknown device id" "$CASBLK" del -n 77
dev=$(add_raw "$good" -n 3)
expect_error "device id already in use" "$CASBLK" add --backing "$good" -n 3
"$CASBLK" del -n 3
assert_no_devices
rmmod ublk_drv || fail "cannot unload ublk_drv for the driver-absent case"
expect_error "ublk_drv absent (add)" "$CASBLK" add --backing "$good"
expect_error "ublk_drv absent (list)" "$CASBLK" list
expect_error "ublk_drv absent (features)" "$CASBLK" features
modprobe ublk_drv
"$CASBLK" features >/dev/null || fail "features failed after reloading ublk_drv"
assert_no_devices
