# QEMU's block layer on the device, as a KVM guest's virtio-blk disk would
# use it (cache=none, aio=io_uring): convert a qcow2 image onto the device
# and verify its pattern through qemu-io.
source "$(dirname "$0")/lib.sh"
backing=$(new_backing 64M)
dev=$(add_raw "$backing")
img=$SCRATCH/src.qcow2
qemu-img create -q -f qcow2 "$img" 64M
qemu-io -f qcow2 -c 'write -P 0xab 0 4M' -c 'write -P 0x5c 32M 1M' "$img" >/dev/null
qemu-img convert -n -O raw -t none "$img" "$dev"
qemu-io -f raw -t none -i io_uring -c 'read -P 0xab 0 4M' -c 'read -P 0 4M 28M' -c 'read -P 0x5c 32M 1M' "$dev" \
    | tee "$SCRATCH/qemu-io.txt"
! grep -q "Pattern verification failed" "$SCRATCH/qemu-io.txt" || fail "qemu-io pattern mismatch"
qemu-img compare -f qcow2 -F raw "$img" "$dev" || fail "qemu-img compare differs"
note "qemu-img convert + qemu-io (cache=none, io_uring) verified"
"$CASBLK" del -a
assert_no_devices
