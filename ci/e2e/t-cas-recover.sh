# A CAS device survives its daemon: kill -9 during fio random writes with
# fsync and verify, then `casblk recover`: the same /dev/ublkbN, fio goes on
# and finishes with no error and its verify passing (E2E_ROUNDS times,
# default 1; the long mode runs 20); then a live upgrade under fio, and a
# kill with no IO at all.
# e2e-7.3  (also run on the 7.3 kernel: the smoke group)
source "$(dirname "$0")/lib.sh"
store=$(new_store vm 256M)
dev=$(add_image "$store" vm)
id=$(dev_id "$dev")
[ -f "/run/casblk/dev-$id.json" ] || fail "no state file for device $id"
grep -q USER_RECOVERY_REISSUE <<<"$("$CASBLK" features)" || fail "the driver lacks user recovery with reissue"
cd "$SCRATCH"
for round in $(seq "${E2E_ROUNDS:-1}"); do
    start_fio_verify "$dev" 64M "$SCRATCH/fio$round.txt"
    sleep 4
    kill -0 "$FIO_PID" 2>/dev/null || { cat "$SCRATCH/fio$round.txt"; fail "fio ended before the kill"; }
    old=$(daemon_pid "$dev")
    kill_under_io "$old" "$dev"
    state=$(device_state "$id")
    [ "$state" = quiesced ] || [ "$state" = live ] || fail "after kill -9 the device is $state, not quiesced"
    [ -e "$dev" ] || fail "$dev disappeared after kill -9"
    got=$("$CASBLK" recover -n "$id") || fail "recover failed"
    [ "$got" = "$dev" ] || fail "recover printed '$got', not $dev"
    [ "$(device_state "$id")" = live ] || fail "device $id is $(device_state "$id") after recover"
    new=$(daemon_pid "$dev")
    [ "$new" != "$old" ] || fail "the same daemon pid $old serves the device"
    wait_io_resumed "$dev"
    finish_fio "$SCRATCH/fio$round.txt" "recovery round $round"
    note "round $round: kill -9 of daemon $old under fio (IO flowing at the kill, held while the daemon was gone), recovered by $new, fio err=0 and verified"
done
# Live upgrade: the daemon hands the device over to this binary under fio.
start_fio_verify "$dev" 64M "$SCRATCH/fio-up.txt"
sleep 4
old=$(daemon_pid "$dev")
got=$("$CASBLK" upgrade -a) || fail "upgrade failed"
[ "$got" = "$dev" ] || fail "upgrade printed '$got', not $dev"
! pid_alive "$old" || fail "the old daemon $old still runs after the upgrade"
finish_fio "$SCRATCH/fio-up.txt" "the upgrade"
note "live upgrade under fio: daemon $old handed over to $(daemon_pid "$dev"), fio err=0 and verified"
# No IO at all: the device waits quiesced, then serves again.
kill_daemon "$(daemon_pid "$dev")"
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
