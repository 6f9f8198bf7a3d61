# `del` while IO runs: a device fio holds open is refused, naming fio;
# with --force, deleting it returns within a bound, its fio ends (its
# in-flight requests complete or fail) instead of hanging, and the same
# store daemon goes on serving the other image with no error; what was
# flushed before the forced del reads back when the image is added again.
# Where the driver has safe stop (7.3), a device held only by a memory
# mapping (no process has it as a file, so del's own scan cannot see it)
# is refused by the driver itself, and goes on serving.
# e2e-7.3  (also run on the 7.3 kernel: safe stop)
source "$(dirname "$0")/lib.sh"
store=$(new_store a 256M)
features=$("$CASBLK" features)
case $(uname -r) in 7.*) grep -q '^SAFE_STOP_DEV ' <<<"$features" || fail "the $(uname -r) driver offers no safe stop";; esac
if grep -q '^SAFE_STOP_DEV ' <<<"$features"; then
    m=$(add_image "$store" a)
    # Holds the disk open through a mapping only: the file is closed (libc's
    # mmap through ctypes: Python's own mmap keeps a duplicate descriptor).
    python3 -c "
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open('$m', os.O_RDONLY)
at = libc.mmap(None, 4096, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
assert at not in (None, ctypes.c_void_p(-1).value), 'mmap failed'
os.close(fd)
assert not any(os.path.realpath('/proc/self/fd/' + f) == '$m' for f in os.listdir('/proc/self/fd'))
print('mapped', flush=True)
time.sleep(600)
" >"$SCRATCH/mapped" &
    holder=$!
    trap 'kill "$holder" 2>/dev/null || true' EXIT
    for _ in $(seq 300); do grep -q mapped "$SCRATCH/mapped" && break; sleep 0.1; done
    grep -q mapped "$SCRATCH/mapped" || fail "the mapping holder did not start"
    expect_error "del of a device only a mapping holds" "$CASBLK" del -n "$(dev_id "$m")"
    refusal=$("$CASBLK" del -n "$(dev_id "$m")" 2>&1) && fail "the second del of $m went through"
    grep -q "the driver refuses" <<<"$refusal" || fail "the refusal does not say the driver refused: $refusal"
    dd if="$m" of=/dev/null bs=4k count=16 iflag=direct status=none || fail "$m does not serve after a refused del"
    kill "$holder"; wait "$holder" 2>/dev/null || true
    trap - EXIT
    "$CASBLK" del -n "$(dev_id "$m")" || fail "del after the mapping went failed"
    wait_no_devices
    note "safe stop: a mapping-only holder kept its device; del went through once it was gone"
else
    note "this driver has no safe stop ($(uname -r)): the mapping-only case is not tried"
fi
"$CASBLK" --store "$store" image create b --size 256M >/dev/null
a=$(add_image "$store" a)
b=$(add_image "$store" b)
pid=$(daemon_pid "$a")
cd "$SCRATCH"
fio --name=a --filename="$a" --rw=randrw --bs=4k --size=128M --iodepth=16 --ioengine=io_uring --direct=1 \
    --fsync=32 --time_based --runtime=600 --output="$SCRATCH/a.txt" >/dev/null 2>&1 &
fa=$!
start_fio_verify "$b" 32M "$SCRATCH/b.txt"
# Under IO for real: fio's start-up alone can take seconds in a fresh VM.
writes() { "$CASBLK" stats -n "$(dev_id "$a")" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['images'][0]['ops']['write']['count'])"; }
for _ in $(seq 120); do [ "$(writes)" -gt 200 ] && break; sleep 0.5; done
[ "$(writes)" -gt 200 ] || fail "fio wrote nothing to $a within 60 s"
kill -0 "$fa" 2>/dev/null || { cat "$SCRATCH/a.txt"; fail "fio on $a ended before the del"; }
# 4 MiB past fio's region, written and flushed (fsync) under fio's IO,
# just before the forced del: it must be there when the image comes back.
head -c $((4 << 20)) /dev/urandom >"$SCRATCH/flushed"
dd if="$SCRATCH/flushed" of="$a" bs=1M seek=192 oflag=direct conv=fsync,notrunc status=none ||
    fail "writing 4 MiB to $a under fio failed"
expect_error "del of a device fio holds" "$CASBLK" del -n "$(dev_id "$a")"
refusal=$("$CASBLK" del -n "$(dev_id "$a")" 2>&1) || true
grep -q "fio (pid " <<<"$refusal" || fail "del's refusal does not name fio: $refusal"
t0=$SECONDS
timeout 30 "$CASBLK" del --force -n "$(dev_id "$a")" || fail "del --force under IO failed or took over 30 s"
took=$((SECONDS - t0))
for _ in $(seq 200); do kill -0 "$fa" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$fa" 2>/dev/null; then
    echo "fio a is $fa, fio b is $FIO_PID" >&2
    ps -eLo pid,ppid,tid,stat,wchan:32,comm >&2
    cat "$SCRATCH/a.txt" >&2
    for t in /proc/"$fa"/task/* $(pgrep -P "$fa" | sed 's|^|/proc/|'); do cat "$t/stack" 2>/dev/null; done >&2
    dmesg | tail -n 20 >&2
    kill -KILL "$fa"
    fail "fio on the deleted device still runs 20 s after del"
fi
[ ! -e "$a" ] || fail "$a still exists after del"
pid_alive "$pid" || fail "the store daemon died with the deleted device"
finish_fio "$SCRATCH/b.txt" "the delete of the other image"
[ "$(daemon_pid "$b")" = "$pid" ] || fail "the other image is no longer served by daemon $pid"
note "del of a device under fio took ${took} s; its fio ended; the other image's fio verified"
a=$(add_image "$store" a)
cmp -n $((4 << 20)) "$SCRATCH/flushed" <(dd if="$a" bs=1M skip=192 count=4 iflag=direct status=none) ||
    fail "the 4 MiB flushed before the forced del differ after add"
note "the 4 MiB flushed under fio before the forced del read back after add"
"$CASBLK" del -a
wait_no_devices
for _ in $(seq 100); do pid_alive "$pid" || break; sleep 0.1; done
! pid_alive "$pid" || fail "the store daemon outlived its last device"
