# Nothing flushed is ever lost: write A and FLUSH, write B without a
# flush, kill -9 the daemon, reattach. A must read back exactly; each block
# of B reads as either its old or its new content.
source "$(dirname "$0")/lib.sh"
store=$(new_store vm 64M)
dev=$(add_image "$store" vm)
mib=$((1 << 20))
head -c $((8 * mib)) /dev/urandom > "$SCRATCH/a"
head -c $((4 * mib)) /dev/urandom > "$SCRATCH/b"
dd if="$SCRATCH/a" of="$dev" bs=1M oflag=direct status=none
sync "$dev"   # fsync on the block device: a FLUSH reaches the daemon
dd if="$SCRATCH/b" of="$dev" bs=4k seek=$((2 * 256)) oflag=direct status=none   # over A's MiB 2..6, unflushed
pid=$(daemon_pid "$dev")
tally kill9 1
kill -KILL "$pid"
sleep 1
"$CASBLK" del -a || fail "del after kill -9 failed"
wait_no_devices
dev=$(add_image "$store" vm)
dd if="$dev" of="$SCRATCH/back" bs=1M count=8 iflag=direct status=none
cmp -n $((2 * mib)) "$SCRATCH/a" "$SCRATCH/back" || fail "flushed data before B was lost"
cmp -n $((2 * mib)) "$SCRATCH/a" "$SCRATCH/back" -i $((6 * mib)) || fail "flushed data after B was lost"
python3 - "$SCRATCH/a" "$SCRATCH/b" "$SCRATCH/back" <<'PY' || fail "a block of the unflushed range is neither old nor new"
import sys
a, b, back = (open(p, "rb").read() for p in sys.argv[1:])
old, new, got = a[2 << 20: 6 << 20], b, back[2 << 20: 6 << 20]
for i in range(0, len(got), 512):
    s = got[i:i + 512]
    assert s in (old[i:i + 512], new[i:i + 512]), f"sector at {i} is neither"
print("unflushed range: every sector old or new")
PY
note "flushed data survived kill -9; unflushed sectors are old or new"
"$CASBLK" del -a
wait_no_devices
sum=$(fsck_clean "$store") || exit 1
note "after kill -9 and reopen: $sum"
# A clean stop (SIGTERM to the daemon) flushes every image: even writes the
# guest never flushed are there after reattaching.
dev=$(add_image "$store" vm)
head -c $((4 * mib)) /dev/urandom > "$SCRATCH/c"
dd if="$SCRATCH/c" of="$dev" bs=1M oflag=direct status=none   # no flush
pid=$(daemon_pid "$dev")
kill -TERM "$pid"
for _ in $(seq 100); do pid_alive "$pid" || break; sleep 0.1; done
! pid_alive "$pid" || fail "the daemon did not exit on SIGTERM"
wait_no_devices
dev=$(add_image "$store" vm)
dd if="$dev" of="$SCRATCH/back" bs=1M count=4 iflag=direct status=none
cmp "$SCRATCH/c" "$SCRATCH/back" || fail "writes before a clean stop were lost"
note "SIGTERM stops the devices, flushes, and the daemon exits; nothing lost"
"$CASBLK" del -a
wait_no_devices
