# DISCARD and WRITE_ZEROES read back as zeros, leave their neighbours
# alone, and discard releases the backing file's blocks.
source "$(dirname "$0")/lib.sh"
backing=$(new_backing 64M)
dev=$(add_raw "$backing")
mib=$((1 << 20))
head -c $((16 * mib)) /dev/urandom > "$SCRATCH/data"
dd if="$SCRATCH/data" of="$dev" bs=1M oflag=direct status=none
sync
blocks_before=$(stat -c %b "$backing")
blkdiscard -o $((2 * mib)) -l $((4 * mib)) "$dev"
blkdiscard -z -o $((8 * mib)) -l $((3 * mib)) "$dev"
dd if="$dev" of="$SCRATCH/back" bs=1M count=16 iflag=direct status=none
cmp -n $((2 * mib)) "$SCRATCH/data" "$SCRATCH/back" || fail "data before the discard changed"
cmp -n $((4 * mib)) "$SCRATCH/back" /dev/zero -i $((2 * mib)):0 || fail "discarded range does not read as zeros"
cmp -n $((2 * mib)) "$SCRATCH/data" "$SCRATCH/back" -i $((6 * mib)) || fail "data between ranges changed"
cmp -n $((3 * mib)) "$SCRATCH/back" /dev/zero -i $((8 * mib)):0 || fail "write-zeroes range does not read as zeros"
cmp -n $((5 * mib)) "$SCRATCH/data" "$SCRATCH/back" -i $((11 * mib)) || fail "data after the ranges changed"
blocks_after=$(stat -c %b "$backing")
[ "$blocks_after" -lt "$blocks_before" ] || fail "discard released no backing blocks ($blocks_before -> $blocks_after)"
note "discard + write-zeroes read back as zeros; backing blocks $blocks_before -> $blocks_after"
"$CASBLK" del -a
assert_no_devices
