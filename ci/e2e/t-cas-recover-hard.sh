# Recovery in the hard places: kill -9 while the log is full and
# compaction busy (writers waiting at the log-capacity gate), and kill -9
# of the recovering daemon itself, before it took the device over (`list`
# shows the device as recovering meanwhile), then `recover` again. Each
# E2E_ROUNDS times (default 1; the long mode runs 20); fio's verify passes across all of it.
source "$(dirname "$0")/lib.sh"
rounds=${E2E_ROUNDS:-1}
store=$(new_store vm 512M)
dev=$(add_image "$store" vm --log-quota 32M)
id=$(dev_id "$dev")
cd "$SCRATCH"
capacity_waits() { "$CASBLK" stats -n "$id" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['images'][0]['counters']['cas']['capacity_waits'])"; }
for round in $(seq "$rounds"); do
    # 1 MiB writes outrun compaction: the 32 MiB log fills, writers wait.
    fio --name=fill --filename="$dev" --rw=write --bs=1M --size=160M --iodepth=32 --ioengine=io_uring \
        --direct=1 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
        --output="$SCRATCH/fill$round.txt" &
    FIO_PID=$!
    for _ in $(seq 120); do [ "$(capacity_waits)" -gt 0 ] && break; sleep 0.5; done
    waits=$(capacity_waits)
    [ "$waits" -gt 0 ] || fail "round $round: the log never filled"
    kill_daemon "$(daemon_pid "$dev")"
    "$CASBLK" recover -n "$id" >/dev/null || fail "round $round: recover after a kill with a full log failed"
    finish_fio "$SCRATCH/fill$round.txt" "a kill -9 with a full log (round $round)"
    note "round $round: kill -9 with a full log ($waits capacity waits), recovered, fio verified"
done
# A stopped daemon must not outlive the test (it would hold the device).
pid=
trap '[ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true' EXIT
# Stopped (SIGSTOP): state T in /proc/PID/stat.
stopped() { local st; read -r st <"/proc/$1/stat" 2>/dev/null || return 1; st=${st##*) }; [[ $st == T* ]]; }
for round in $(seq "$rounds"); do
    start_fio_verify "$dev" 64M "$SCRATCH/fio$round.txt"
    sleep 3
    kill_under_io "$(daemon_pid "$dev")" "$dev"
    # The recovering daemon stops itself after naming itself in the log,
    # before it opens the store (CASBLK_TEST_STOP_AT): kill it there.
    seen=$(grep -c "store daemon starting" /run/casblk/casblk.log)
    CASBLK_TEST_STOP_AT=store-open "$CASBLK" recover -n "$id" >"$SCRATCH/recover$round.out" 2>&1 &
    client=$!
    pid=
    for _ in $(seq 600); do
        pid=$(grep "store daemon starting" /run/casblk/casblk.log | tail -n +$((seen + 1)) | sed -n 's/.* pid=\([0-9]*\).*/\1/p' | head -n1)
        [ -n "$pid" ] && stopped "$pid" && break
        sleep 0.05
    done
    [ -n "$pid" ] || fail "round $round: no recovering daemon started"
    stopped "$pid" || fail "round $round: the recovering daemon $pid did not stop at store-open"
    state=$(device_state "$id")
    [ "$state" = recovering ] || fail "round $round: list says $state while a recovery runs, not recovering"
    kill_daemon "$pid"
    ! wait "$client" || fail "round $round: recover succeeded although its daemon was killed"
    state=$(device_state "$id")
    [ "$state" = quiesced ] || fail "round $round: after the recovering daemon died the device is $state"
    got=$("$CASBLK" recover -n "$id") || fail "round $round: the second recover failed"
    [ "$got" = "$dev" ] || fail "round $round: recover printed '$got', not $dev"
    wait_io_resumed "$dev"
    finish_fio "$SCRATCH/fio$round.txt" "a kill -9 during recover (round $round)"
    note "round $round: recovering daemon $pid killed (list said recovering), recovered again, fio verified"
done
grep -q "records_replayed=" /run/casblk/casblk.log || fail "the daemon log does not say what a recovery replayed"
"$CASBLK" del -a
wait_no_devices
