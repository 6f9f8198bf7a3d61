# A CAS device survives its daemon: kill -9 during fio random writes with
# fsync and verify, then `casblk recover`: the same /dev/ublkbN, fio goes on
# and finishes with no error and its verify passing. Twice, then a kill
# with no IO at all.
source "$(dirname "$0")/lib.sh"
store=$(new_store vm 256M)
dev=$(add_image "$store" vm)
id=$(dev_id "$dev")
[ -f "/run/casblk/dev-$id.json" ] || fail "no state file for device $id"
"$CASBLK" features | grep -q USER_RECOVERY_REISSUE || fail "the driver lacks user recovery with reissue"
cd "$SCRATCH"
for round in 1 2; do
    fio --name=rec --filename="$dev" --rw=randwrite --bs=4k --size=64M --iodepth=16 --ioengine=io_uring \
        --direct=1 --fsync=64 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
        --output="$SCRATCH/fio$round.txt" &
    fio_pid=$!
    sleep 4
    old=$(daemon_pid "$dev")
    kill -KILL "$old"
    for _ in $(seq 100); do pid_alive "$old" || break; sleep 0.1; done
    state=$(device_state "$id")
    [ "$state" = quiesced ] || [ "$state" = live ] || fail "after kill -9 the device is $state, not quiesced"
    [ -e "$dev" ] || fail "$dev disappeared after kill -9"
    got=$("$CASBLK" recover -n "$id") || fail "recover failed"
    [ "$got" = "$dev" ] || fail "recover printed '$got', not $dev"
    [ "$(device_state "$id")" = live ] || fail "device $id is $(device_state "$id") after recover"
    new=$(daemon_pid "$dev")
    [ "$new" != "$old" ] || fail "the same daemon pid $old serves the device"
    wait "$fio_pid" || { cat "$SCRATCH/fio$round.txt"; fail "fio failed across the recovery (round $round)"; }
    grep -q "err= 0" "$SCRATCH/fio$round.txt" || { cat "$SCRATCH/fio$round.txt"; fail "fio reported an error"; }
    note "round $round: kill -9 of daemon $old under fio, recovered by $new, fio err=0 and verified"
done
# Live upgrade: the daemon hands the device over to this binary under fio.
fio --name=up --filename="$dev" --rw=randwrite --bs=4k --size=64M --iodepth=16 --ioengine=io_uring \
    --direct=1 --fsync=64 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --output="$SCRATCH/fio-up.txt" &
fio_pid=$!
sleep 4
old=$(daemon_pid "$dev")
got=$("$CASBLK" upgrade -a) || fail "upgrade failed"
[ "$got" = "$dev" ] || fail "upgrade printed '$got', not $dev"
! pid_alive "$old" || fail "the old daemon $old still runs after the upgrade"
wait "$fio_pid" || { cat "$SCRATCH/fio-up.txt"; fail "fio failed across the upgrade"; }
grep -q "err= 0" "$SCRATCH/fio-up.txt" || { cat "$SCRATCH/fio-up.txt"; fail "fio reported an error"; }
note "live upgrade under fio: daemon $old handed over to $(daemon_pid "$dev"), fio err=0 and verified"
# No IO at all: the device waits quiesced, then serves again.
old=$(daemon_pid "$dev")
kill -KILL "$old"
for _ in $(seq 100); do pid_alive "$old" || break; sleep 0.1; done
"$CASBLK" recover -a >/dev/null || fail "recover -a failed"
dd if=/dev/urandom of="$SCRATCH/x" bs=1M count=4 status=none
dd if="$SCRATCH/x" of="$dev" bs=1M oflag=direct status=none
sync "$dev"
dd if="$dev" of="$SCRATCH/y" bs=1M count=4 iflag=direct status=none
cmp "$SCRATCH/x" "$SCRATCH/y" || fail "data written after an idle recovery reads back wrong"
note "idle kill -9, recover -a, write and read back"
"$CASBLK" del -a
wait_no_devices
[ ! -e "/run/casblk/dev-$id.json" ] || fail "del left the state file"
