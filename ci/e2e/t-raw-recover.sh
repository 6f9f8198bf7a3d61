# A raw-mode device survives its daemon: kill -9 during fio random writes
# with verify, `casblk recover -n ID`, fio finishes with no error.
source "$(dirname "$0")/lib.sh"
backing=$(new_backing 256M)
dev=$(add_raw "$backing")
id=$(dev_id "$dev")
cd "$SCRATCH"
for round in $(seq "${E2E_ROUNDS:-1}"); do
    start_fio_verify "$dev" 96M "$SCRATCH/fio$round.txt"
    sleep 3
    old=$(daemon_pid "$dev")
    kill_under_io "$old" "$dev"
    got=$("$CASBLK" recover -n "$id") || fail "recover failed"
    [ "$got" = "$dev" ] || fail "recover printed '$got', not $dev"
    wait_io_resumed "$dev"
    finish_fio "$SCRATCH/fio$round.txt" "recovery round $round"
    note "round $round: kill -9 of daemon $old under fio (IO flowing at the kill, held while the daemon was gone), recovered, fio err=0 and verified"
done
"$CASBLK" del -a
wait_no_devices
[ ! -e "/run/casblk/dev-$id.json" ] || fail "del left the state file"
