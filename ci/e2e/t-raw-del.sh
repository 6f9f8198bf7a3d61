# del removes exactly the named device and its daemon; del -a removes the
# rest; SIGTERM to a daemon deletes its device; after kill -9 the device
# can still be deleted.
source "$(dirname "$0")/lib.sh"
b1=$(new_backing 16M); b2=$(new_backing 16M); b3=$(new_backing 16M)
d1=$(add_raw "$b1"); d2=$(add_raw "$b2")
pid1=$("$CASBLK" list --json | python3 -c "import json,sys; print([d['daemon_pid'] for d in json.load(sys.stdin) if d['bdev']=='$d1'][0])")
"$CASBLK" del -n "$(dev_id "$d1")"
[ ! -e "$d1" ] || fail "$d1 still exists after del"
for _ in $(seq 100); do pid_alive "$pid1" || break; sleep 0.1; done
! pid_alive "$pid1" || fail "daemon $pid1 of $d1 still running after del"
[ ! -e "/run/ublksrvd/$(printf %04d "$(dev_id "$d1")").json" ] || fail "the device's json was left in /run/ublksrvd"
[ -b "$d2" ] || fail "del of $d1 removed $d2 too"
dd if=/dev/zero of="$d2" bs=4k count=1 oflag=direct status=none || fail "$d2 not usable after deleting $d1"
note "del -n removed only its device and daemon"
d3=$(add_raw "$b3")
"$CASBLK" del -a
assert_no_devices
note "del -a removed all devices"
d1=$(add_raw "$b1")
pid=$("$CASBLK" list --json | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['daemon_pid'])")
kill -TERM "$pid"
for _ in $(seq 100); do [ -e /sys/class/ublk-char/ublkc"$(dev_id "$d1")" ] || break; sleep 0.1; done
assert_no_devices
note "SIGTERM to the daemon deleted its device"
d1=$(add_raw "$b1")
pid=$("$CASBLK" list --json | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['daemon_pid'])")
kill -KILL "$pid"
sleep 1
"$CASBLK" del -n "$(dev_id "$d1")" || fail "del after kill -9 failed"
assert_no_devices
note "a device whose daemon was killed -9 is deleted by del"
d1=$(add_raw "$b1")
mkfs.ext4 -q -F "$d1" && mkdir -p "$SCRATCH/m" && mount "$d1" "$SCRATCH/m"
expect_error "del of a mounted device" "$CASBLK" del -n "$(dev_id "$d1")"
[ -b "$d1" ] || fail "the refused del removed the device anyway"
umount "$SCRATCH/m"
"$CASBLK" del -n "$(dev_id "$d1")"
assert_no_devices
note "del of a mounted device is refused; after umount it succeeds"
