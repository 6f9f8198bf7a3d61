# The supervised daemon: `casblk daemon` serves a store in the foreground;
# when it dies (kill -9: a crash), starting it again, as its service
# manager would, recovers the store's devices. A mounted ext4 with a loop
# writing and fsyncing files sees no IO error, is not remounted read-only,
# and every fsynced file reads back; QEMU's block layer (qemu-io, cache=none,
# io_uring) on a second image sees no error either. The stable name
# /dev/casblk/<image> follows the device throughout. The daemon serves
# metrics (--metrics-listen), and the restarted one binds the same port.
source "$(dirname "$0")/lib.sh"
mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
store=$(new_store fs 256M)
"$CASBLK" --store "$store" image create q --size 64M >/dev/null
start_daemon() { # start_daemon LOG: a service daemon; waits until it is ready
    "$CASBLK" --store "$store" daemon --metrics-listen "127.0.0.1:$mport" >"$1" 2>&1 &
    for _ in $(seq 300); do grep -q "^serving store" "$1" && return 0; sleep 0.2; done
    cat "$1"; fail "casblk daemon did not report ready"
}
start_daemon "$SCRATCH/daemon1.log"
pid=$(pgrep -f -n "casblk --store $store daemon")
dev=$(add_image "$store" fs)
qdev=$(add_image "$store" q)
[ "$(daemon_pid "$dev")" = "$pid" ] || fail "add did not go to the service daemon"
[ "$(readlink /dev/casblk/fs)" = "$dev" ] || fail "/dev/casblk/fs does not point at $dev"
mkfs.ext4 -q "$dev"
mkdir -p "$SCRATCH/mnt" && mount "$dev" "$SCRATCH/mnt"
klog=$(kernel_log_mark)
# The writer: a file at a time, fsynced, its checksum logged only after.
( i=0; while [ ! -e "$SCRATCH/stop" ]; do
      i=$((i + 1)); f=$SCRATCH/mnt/f$i
      head -c $((64 << 10)) /dev/urandom >"$f.src"
      dd if="$f.src" of="$f" bs=64k conv=fsync status=none || exit 1
      echo "$(sha256sum <"$f.src" | cut -d' ' -f1) f$i" >>"$SCRATCH/synced"
      rm -f "$f.src"
  done ) &
writer=$!
# qemu-io goes on until told to stop, so that both kills land under its IO
# too: rounds of a pattern written and read back (cache=none, io_uring).
( r=0; while [ ! -e "$SCRATCH/stop" ]; do
      r=$((r + 1)); p=$(( (r % 200) + 16 ))
      qemu-io -f raw -t none -i io_uring -c "write -P $p 0 32M" -c "read -P $p 0 32M" -c "write -P $((p + 1)) 32M 32M" \
          -c "read -P $((p + 1)) 32M 32M" -c "read -P $p 0 32M" "$qdev" >"$SCRATCH/qemu-io.$r.txt" 2>&1 || exit 1
      ! grep -qiE "error|failed|Pattern verification" "$SCRATCH/qemu-io.$r.txt" || exit 1
  done ) &
qio=$!
for round in $(seq "${E2E_ROUNDS:-1}"); do
    sleep 4
    kill_under_io "$pid" "$dev" "$qdev"
    start_daemon "$SCRATCH/daemon$((round + 1)).log"
    grep -q "2 devices recovered, 0 could not be" "$SCRATCH/daemon$((round + 1)).log" \
        || { cat "$SCRATCH/daemon$((round + 1)).log"; fail "round $round: the restarted daemon did not recover both devices"; }
    pid=$(pgrep -f -n "casblk --store $store daemon")
    [ "$(daemon_pid "$dev")" = "$pid" ] || fail "round $round: the device is not served by the restarted daemon"
    [ "$(readlink /dev/casblk/fs)" = "$dev" ] || fail "round $round: /dev/casblk/fs lost its target across recovery"
    wait_io_resumed "$dev" "$qdev"
    note "round $round: kill -9 with both devices under IO (IO flowing at the kill, held while the daemon was gone), recovered, IO going on"
done
sleep 3
scraped=$(python3 - "$mport" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
v = {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l and not l.startswith("#")}
writes = {}
for image in ("fs", "q"):
    assert v[f'casblk_image_state{{image="{image}",state="live"}}'] == 1, f"{image} is not live"
    writes[image] = v[f'casblk_image_requests_total{{image="{image}",op="write"}}']
    assert writes[image] > 0, f"{image}: no writes counted"
print(f"fs writes {writes['fs']:.0f}, q writes {writes['q']:.0f} since the restart")
PY
) || fail "scraping the restarted daemon's metrics: $scraped"
note "the restarted daemon serves metrics on the same port: $scraped"
touch "$SCRATCH/stop"
wait "$writer" || fail "the ext4 writer got an IO error across the recovery"
wait "$qio" || { cat "$(ls -t "$SCRATCH"/qemu-io.*.txt | head -n1)"; fail "qemu-io failed or saw an error across the recovery"; }
grep -qE "^/dev/ublkb$(dev_id "$dev") [^ ]+ [^ ]+ rw," /proc/mounts || fail "ext4 was remounted read-only"
klog=$(kernel_log_since "$klog")
errs=$(grep -E "ublkb[0-9]+" <<<"$klog" | grep -iE "error|fail" || true)
[ -z "$errs" ] || { printf '%s\n' "$errs" | tail -n 20; fail "the kernel logged IO errors"; }
n=$(wc -l <"$SCRATCH/synced")
[ "$n" -gt 0 ] || fail "the writer synced no file"
umount "$SCRATCH/mnt"
mount "$dev" "$SCRATCH/mnt"
(cd "$SCRATCH/mnt" && while read -r sum name; do
    [ "$(sha256sum <"$name" | cut -d' ' -f1)" = "$sum" ] || { echo "$name"; exit 1; }
done <"$SCRATCH/synced") || fail "an fsynced file reads back wrong"
note "${E2E_ROUNDS:-1} kill(s) -9 of the service daemon: each restarted, 2 devices recovered, ext4 ($n fsynced files) and qemu-io without an error"
umount "$SCRATCH/mnt"
# SIGTERM (systemctl stop): every device stopped and deleted, the daemon exits.
kill -TERM "$pid"
for _ in $(seq 300); do pid_alive "$pid" || break; sleep 0.1; done
! pid_alive "$pid" || fail "the service daemon did not exit on SIGTERM"
wait_no_devices
[ ! -e /dev/casblk/fs ] || fail "/dev/casblk/fs outlived its device"
note "SIGTERM stops the devices and the service daemon exits"
