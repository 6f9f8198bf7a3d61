# Take-over after a crash (a one-node Garage inside the VM): store A's
# daemon is killed with -9 after a flushed write was published and while
# a second flushed write may still be in the window; store B fetches the
# image once A's lease has expired and its device holds every published
# byte, and each block of the second write either whole or untouched.
# A's device, recovered, is then refused the image B now holds, and is
# deleted.
source "$(dirname "$0")/lib.sh"
start_garage

a=$(new_store vm 64M)
remote_set "$a"
dev=$(add_image "$a" vm)
id=$(dev_id "$dev")
head -c 4M /dev/urandom >"$SCRATCH/first"
head -c 4M /dev/urandom >"$SCRATCH/second"
dd if="$SCRATCH/first" of="$dev" bs=1M oflag=direct conv=fsync status=none
wait_published "$a"
note "store A published its first flushed 4 MiB"
pid=$(daemon_pid "$dev")
dd if="$SCRATCH/second" of="$dev" bs=1M seek=4 oflag=direct conv=fsync status=none
kill_daemon "$pid"
note "store A's daemon killed with -9 right after a second flushed 4 MiB"

# Store B waits out A's lease, then serves the image.
b=$(new_store scratch 1M)
remote_set "$b"
t0=$(date +%s)
"$CASBLK" --store "$b" image fetch vm >"$SCRATCH/fetch.txt" 2>&1 || fail "fetch after A's crash failed: $(cat "$SCRATCH/fetch.txt")"
note "store B fetched the image after $(($(date +%s) - t0)) s: $(head -1 "$SCRATCH/fetch.txt")"
devb=$(add_image "$b" vm)
dd if="$devb" of="$SCRATCH/got" bs=1M count=8 iflag=direct status=none
cmp -n $((4 << 20)) "$SCRATCH/first" "$SCRATCH/got" || fail "store B lacks bytes store A had published"
python3 - "$SCRATCH/second" "$SCRATCH/got" <<'PY' || fail "store B sees a torn block of the unpublished write"
import sys
new = open(sys.argv[1], "rb").read()
got = open(sys.argv[2], "rb").read()[4 << 20:]
seen = sum(1 for i in range(0, len(new), 4096) if got[i:i + 4096] == new[i:i + 4096])
torn = [i for i in range(0, len(new), 4096) if got[i:i + 4096] not in (new[i:i + 4096], bytes(4096))]
assert not torn, f"blocks at {torn[:4]} are neither old nor new"
print(f"  - of the write in the window, store B sees {seen} of {len(new) // 4096} blocks")
PY

# A's device comes back with a daemon that is refused the image.
rc=0
"$CASBLK" recover -n "$id" >"$SCRATCH/recover.txt" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "store A's daemon recovered an image store B holds"
grep -q "held by store" "$SCRATCH/recover.txt" || fail "recover failed without naming the lease: $(cat "$SCRATCH/recover.txt")"
[ "$(wc -l <"$SCRATCH/recover.txt")" -eq 1 ] || fail "recover's error is not one line: $(cat "$SCRATCH/recover.txt")"
note "store A's recover refused: $(cat "$SCRATCH/recover.txt")"
"$CASBLK" del -a
wait_no_devices
"$CASBLK" --store "$b" fsck >/dev/null || fail "store B is not clean after the take-over"
note "both devices deleted, store B clean"
