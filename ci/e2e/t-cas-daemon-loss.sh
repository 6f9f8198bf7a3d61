# What a device asks the driver for at add, on each kernel.
# Partitions: an image holding a DOS partition table. Where the driver
# has NO_AUTO_PART_SCAN (7.x), a device added by default shows no
# ublkbNp1 (the host leaves a guest's table alone), one added with
# --partitions does, and `blockdev --rereadpt` still reads it on request;
# on 6.12 the host scans every device (what `add --help` says).
# --on-daemon-loss fail: where the driver has USER_RECOVERY_FAIL_IO (7.x),
# the device carries it (and not REISSUE); after kill -9 of its daemon
# direct reads and writes fail within seconds instead of waiting; `recover`
# serves it again (casblk's own END_USER_RECOVERY: libublk cannot) with
# every flushed byte intact, and `upgrade` refuses it without --force. On
# 6.12 the option is refused in one line and nothing is added.
# e2e-7.3
source "$(dirname "$0")/lib.sh"
store=$(new_store p 64M)
"$CASBLK" --store "$store" image create f --size 64M >/dev/null
features=$("$CASBLK" features)
newer=false
case $(uname -r) in 7.*) newer=true ;; esac
if $newer; then
    for f in NO_AUTO_PART_SCAN USER_RECOVERY_FAIL_IO; do
        grep -q "^$f " <<<"$features" || fail "the $(uname -r) driver offers no $f"
    done
fi
flags_of() { # the driver flags of device $1, space-separated
    "$CASBLK" list --json | python3 -c "import json,sys; print(*[f for d in json.load(sys.stdin) if d['bdev']=='$1' for f in d['flags']])"
}
settled() { udevadm settle --timeout=10 2>/dev/null || true; sleep 1; }
detach() { "$CASBLK" del -n "$(dev_id "$1")" || fail "del of $1 failed"; wait_no_devices; }

# A DOS label with two Linux partitions of 16 MiB, written through a device.
dev=$(add_image "$store" p --partitions) || fail "add --partitions failed"
python3 - "$dev" <<'EOF' || fail "writing a partition table failed"
import os, struct, sys
mbr = bytearray(512)
for i, start in enumerate((2048, 2048 + 32768)):
    mbr[446 + 16 * i:462 + 16 * i] = struct.pack('<B3sB3sII', 0, bytes(3), 0x83, bytes(3), start, 32768)
mbr[510:512] = b'\x55\xaa'
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, mbr, 0)
os.fsync(fd)
os.close(fd)
EOF
detach "$dev"

# --partitions (and, on 6.12, every device): the host scans at add.
dev=$(add_image "$store" p --partitions) || fail "add --partitions failed"
settled
[ -b "${dev}p1" ] && [ -b "${dev}p2" ] || fail "--partitions: the host did not scan $dev's table (no ${dev}p1/p2)"
[[ " $(flags_of "$dev") " != *" NO_AUTO_PART_SCAN "* ]] || fail "--partitions: $dev carries NO_AUTO_PART_SCAN"
detach "$dev"
dev=$(add_image "$store" p) || fail "add failed"
settled
if $newer; then
    [ ! -e "${dev}p1" ] || fail "the host scanned $dev's partition table although it was added without --partitions"
    [ -z "$(ls "$(block_sysfs "$dev")" | grep "^$(basename "$dev")p")" ] || fail "$dev has partitions in sysfs"
    [[ " $(flags_of "$dev") " == *" NO_AUTO_PART_SCAN "* ]] || fail "$dev lacks NO_AUTO_PART_SCAN: $(flags_of "$dev")"
    blockdev --rereadpt "$dev" || fail "blockdev --rereadpt $dev failed"
    settled
    [ -b "${dev}p1" ] || fail "blockdev --rereadpt did not read $dev's table on request"
    note "partitions: --partitions shows p1 and p2 at add; by default none (NO_AUTO_PART_SCAN), until blockdev --rereadpt"
else
    [ -b "${dev}p1" ] || fail "6.12 scans every device, but $dev shows no p1"
    note "partitions: on $(uname -r) the host scans every device (no NO_AUTO_PART_SCAN); --partitions changes nothing"
fi
detach "$dev"

if ! $newer; then
    expect_error "--on-daemon-loss fail on $(uname -r)" "$CASBLK" --store "$store" add --image f --on-daemon-loss fail
    grep -q "6.13" <<<"$("$CASBLK" --store "$store" add --image f --on-daemon-loss fail 2>&1)" \
        || fail "the refusal does not name the kernel needed"
    assert_no_devices
    exit 0
fi

dev=$(add_image "$store" f --on-daemon-loss fail) || fail "add --on-daemon-loss fail failed"
id=$(dev_id "$dev")
flags=$(flags_of "$dev")
[[ " $flags " == *" USER_RECOVERY_FAIL_IO "* && " $flags " == *" USER_RECOVERY "* ]] || fail "$dev lacks FAIL_IO recovery: $flags"
[[ " $flags " != *" USER_RECOVERY_REISSUE "* ]] || fail "$dev carries REISSUE beside FAIL_IO: $flags"
head -c $((8 << 20)) /dev/urandom >"$SCRATCH/data"
dd if="$SCRATCH/data" of="$dev" bs=1M oflag=direct conv=fsync status=none || fail "writing 8 MiB failed"
sum=$(sha256sum <"$SCRATCH/data")
expect_error "upgrade of a fail-on-loss device without --force" "$CASBLK" upgrade -n "$id"
[ "$(device_state "$id")" = live ] || fail "the refused upgrade left $dev $(device_state "$id")"

pid=$(daemon_pid "$dev")
kill_daemon "$pid"
for _ in $(seq 100); do [ "$(device_state "$id")" = fail_io ] && break; sleep 0.1; done
[ "$(device_state "$id")" = fail_io ] || fail "$dev is $(device_state "$id") 10 s after its daemon died, not fail_io"
t0=$SECONDS rc=0
timeout 10 dd if="$dev" of=/dev/null bs=4k count=1 iflag=direct status=none 2>/dev/null || rc=$?
[ "$rc" -ne 0 ] || fail "a direct read of $dev succeeded with no daemon"
[ "$rc" -ne 124 ] || fail "a direct read of $dev waited 10 s with no daemon instead of failing"
rc=0
timeout 10 dd if=/dev/zero of="$dev" bs=4k count=1 seek=4096 oflag=direct status=none 2>/dev/null || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "a direct write of $dev did not fail at once with no daemon (rc $rc)"
note "fail_io: with the daemon killed, a direct read and a direct write failed in $((SECONDS - t0)) s"

got=$("$CASBLK" recover -n "$id") || fail "recover of the fail_io device failed"
[ "$got" = "$dev" ] || fail "recover printed '$got', not $dev"
[ "$(device_state "$id")" = live ] || fail "$dev is $(device_state "$id") after recover"
[ "$(head -c $((8 << 20)) "$dev" | sha256sum)" = "$sum" ] || fail "the flushed 8 MiB changed across the daemon's loss"
dd if="$SCRATCH/data" of="$dev" bs=1M seek=16 oflag=direct conv=fsync status=none || fail "writing after the recovery failed"
[ "$(dd if="$dev" bs=1M skip=16 count=8 iflag=direct status=none | sha256sum)" = "$sum" ] || fail "data written after the recovery reads back wrong"
[[ " $(flags_of "$dev") " == *" USER_RECOVERY_FAIL_IO "* ]] || fail "the recovered device lost FAIL_IO"
note "fail_io: recover served $dev again (live, FAIL_IO kept); the flushed 8 MiB read back, a new write read back"
"$CASBLK" del -a
wait_no_devices
[ ! -e "/run/casblk/dev-$id.json" ] || fail "del left the state file"
[ ! -e "/run/ublksrvd/$(printf %04d "$id").json" ] || fail "del left libublk's json of device $id"
