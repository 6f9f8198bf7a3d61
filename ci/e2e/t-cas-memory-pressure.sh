# No deadlock under memory pressure: the daemon, a writer and a memory hog
# share a memory cgroup (a small machine: 384 MiB), with the dirty page
# limits raised. The writer puts twice the group's memory through ext4 on
# a CAS device, fsyncing each file, while the hog (192 MiB) allocates and
# touches memory in a loop, so reclaim runs hard and finds
# the group's memory full of the device's dirty pages. The store itself is
# on ext4 over a loop device, so the daemon's own writes are dirty page
# cache too. Because every daemon thread is an IO flusher, reclaim in a
# daemon thread never waits on the daemon's own device and the daemon is
# throttled only by its own writes: the writer finishes within a bound,
# no task hangs (hung_task_timeout_secs lowered to 30), no IO error
# reaches the kernel log, and every fsynced file reads back.
source "$(dirname "$0")/lib.sh"
GROUP_MIB=${E2E_PRESSURE_GROUP_MIB:-384}
HOG_MIB=${E2E_PRESSURE_HOG_MIB:-192}
FILES=${E2E_PRESSURE_FILES:-6}
FILE_MIB=${E2E_PRESSURE_FILE_MIB:-128}
BOUND_S=${E2E_PRESSURE_BOUND_S:-600}
[ -f /sys/fs/cgroup/cgroup.controllers ] || mount -t cgroup2 none /sys/fs/cgroup || fail "no cgroup2"
grep -qw memory /sys/fs/cgroup/cgroup.controllers || fail "cgroup2 has no memory controller"
echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
cg=/sys/fs/cgroup/casblk-pressure-$$
mkdir "$cg"
echo "$((GROUP_MIB << 20))" >"$cg/memory.max"
echo 0 >"$cg/memory.swap.max" 2>/dev/null || true
declare -A saved
for k in vm.dirty_ratio vm.dirty_background_ratio kernel.hung_task_timeout_secs; do saved[$k]=$(sysctl -n "$k"); done
hog=
cleanup() {
    [ -z "$hog" ] || kill "$hog" 2>/dev/null || true
    for k in "${!saved[@]}"; do sysctl -qw "$k=${saved[$k]}" || true; done
    echo $$ >/sys/fs/cgroup/cgroup.procs 2>/dev/null || true
    umount "$SCRATCH/mnt" 2>/dev/null || true
    "$CASBLK" del -a --force >/dev/null 2>&1 || true
    wait_no_devices
    umount "$SCRATCH/storefs" 2>/dev/null || true
    [ -z "${loopdev:-}" ] || losetup -d "$loopdev" 2>/dev/null || true
    rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
modprobe loop
truncate -s 3G "$SCRATCH/store.img"
loopdev=$(losetup -f --show "$SCRATCH/store.img")
mkfs.ext4 -q -F "$loopdev"
mkdir -p "$SCRATCH/storefs" "$SCRATCH/mnt"
mount "$loopdev" "$SCRATCH/storefs"
store=$SCRATCH/storefs/store
"$CASBLK" --store "$store" image create vm --size 4G >/dev/null
# The daemon, the writer and the hog are born in the group (this shell
# joins it only to start each); the test's own commands stay outside, so
# the group's OOM killer cannot end the test itself.
in_group() { echo $$ >"$cg/cgroup.procs"; }
out_of_group() { echo $$ >/sys/fs/cgroup/cgroup.procs; }
in_group
dev=$(add_image "$store" vm --log-quota 64M)
out_of_group
pid=$(daemon_pid "$dev")
grep -q "casblk-pressure-$$" "/proc/$pid/cgroup" || fail "the daemon is not in the memory cgroup"
mkfs.ext4 -q -F "$dev"
mount "$dev" "$SCRATCH/mnt"
sysctl -qw vm.dirty_ratio=60 vm.dirty_background_ratio=50 kernel.hung_task_timeout_secs=30
klog=$(kernel_log_mark)
# The hog: HOG_MIB allocated and touched, freed, again, until killed.
in_group
python3 -c '
import sys, time
while True:
    b = bytearray(int(sys.argv[1]) << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    del b
    time.sleep(0.2)
' "$HOG_MIB" &
hog=$!
# Each file repeats one random MiB: the store keeps one copy of it, the
# page cache holds all of it.
head -c $((1 << 20)) /dev/urandom >"$SCRATCH/mib"
t0=$SECONDS
writer() {
    local i
    for i in $(seq "$FILES"); do
        for _ in $(seq "$FILE_MIB"); do cat "$SCRATCH/mib"; done >"$SCRATCH/mnt/f$i" || return 1
        sync "$SCRATCH/mnt/f$i" || return 1
        echo "f$i $(( SECONDS - t0 )) s" >>"$SCRATCH/synced"
    done
}
writer &
w=$!
out_of_group
deadline=$((SECONDS + BOUND_S))
while kill -0 "$w" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        cat "$SCRATCH/synced" 2>/dev/null || true
        grep -E "^(memory.events|oom)" "$cg/memory.events" 2>/dev/null || cat "$cg/memory.events" || true
        fail "the writer did not finish $FILES x $FILE_MIB MiB within $BOUND_S s under memory pressure"
    fi
    sleep 2
done
wait "$w" || fail "the writer got an IO error (or was killed) under memory pressure"
took=$((SECONDS - t0))
pid_alive "$hog" || fail "the hog died (the group's OOM killer?): $(tr '\n' ' ' <"$cg/memory.events")"
kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null || true; hog=
pid_alive "$pid" || fail "the daemon died under memory pressure"
events=$(tr '\n' ' ' <"$cg/memory.events")
klog=$(kernel_log_since "$klog")
bad=$(grep -E "blocked for more than|I/O error|EXT4-fs error|Remounting filesystem read-only|Out of memory" <<<"$klog" || true)
[ -z "$bad" ] || { printf '%s\n' "$bad" | head -n 20; fail "the kernel reported trouble under memory pressure (above)"; }
grep -qE " $SCRATCH/mnt [^ ]+ rw," /proc/mounts || fail "ext4 on the device went read-only"
umount "$SCRATCH/mnt"
echo 3 >/proc/sys/vm/drop_caches
mount "$dev" "$SCRATCH/mnt"
want=$(for _ in $(seq "$FILE_MIB"); do cat "$SCRATCH/mib"; done | sha256sum | cut -d' ' -f1)
for i in $(seq "$FILES"); do
    [ "$(sha256sum <"$SCRATCH/mnt/f$i" | cut -d' ' -f1)" = "$want" ] || fail "f$i reads back wrong after the pressure"
done
flusher=yes
[ "${CASBLK_TEST_NO_IO_FLUSHER:-}" != 1 ] || flusher="NO (CASBLK_TEST_NO_IO_FLUSHER=1)"
note "$((FILES * FILE_MIB)) MiB written and fsynced in $took s in a $GROUP_MIB MiB group with a $HOG_MIB MiB hog (daemon an IO flusher: $flusher); no hung task, no IO error; all read back; memory.events: $events"
