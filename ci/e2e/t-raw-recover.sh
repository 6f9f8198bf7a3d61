# A raw-mode device survives its daemon: kill -9 during fio random writes
# with verify, `casblk recover -n ID`, fio finishes with no error.
source "$(dirname "$0")/lib.sh"
backing=$(new_backing 256M)
dev=$(add_raw "$backing")
id=$(dev_id "$dev")
cd "$SCRATCH"
for round in 1 2; do
    fio --name=rec --filename="$dev" --rw=randwrite --bs=4k --size=96M --iodepth=16 --ioengine=io_uring \
        --direct=1 --fsync=64 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
        --output="$SCRATCH/fio$round.txt" &
    fio_pid=$!
    sleep 3
    old=$(daemon_pid "$dev")
    kill -KILL "$old"
    for _ in $(seq 100); do pid_alive "$old" || break; sleep 0.1; done
    got=$("$CASBLK" recover -n "$id") || fail "recover failed"
    [ "$got" = "$dev" ] || fail "recover printed '$got', not $dev"
    wait "$fio_pid" || { cat "$SCRATCH/fio$round.txt"; fail "fio failed across the recovery (round $round)"; }
    grep -q "err= 0" "$SCRATCH/fio$round.txt" || { cat "$SCRATCH/fio$round.txt"; fail "fio reported an error"; }
    note "round $round: kill -9 of daemon $old under fio, recovered, fio err=0 and verified"
done
"$CASBLK" del -a
wait_no_devices
[ ! -e "/run/casblk/dev-$id.json" ] || fail "del left the state file"
