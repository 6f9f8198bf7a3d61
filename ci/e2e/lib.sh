# Shared helpers for the end-to-end tests (sourced; run inside ci/vm).
set -euo pipefail
: "${CASBLK:?CASBLK must name the casblk binary}"
SCRATCH=${SCRATCH:-${CASBLK_VM_SCRATCH:-/tmp}/casblk-e2e}
mkdir -p "$SCRATCH"

# fail MSG: ends the test. Inside a command substitution (note "$(...)")
# its exit ends only that subshell and the test would go on, so it also
# writes MSG to E2E_FAIL_MARK, which run-all counts as a failure however
# the test exits.
fail() {
    echo "FAIL: $*" >&2
    [ -z "${E2E_FAIL_MARK:-}" ] || echo "$*" >>"$E2E_FAIL_MARK"
    exit 1
}
note() { echo "  - $*"; }

# A sparse backing file of SIZE (truncate syntax) at a fresh path.
new_backing() { local f; f=$(mktemp "$SCRATCH/backing.XXXXXX"); truncate -s "$1" "$f"; echo "$f"; }

# Attach FILE in raw mode (extra casblk args follow); prints the device path.
add_raw() { local f=$1; shift; "$CASBLK" add --backing "$f" "$@"; }

dev_id() { echo "${1#/dev/ublkb}"; }

# No ublk device may be left: tests clean up after themselves.
assert_no_devices() {
    local left
    left=$(ls /sys/class/ublk-char 2>/dev/null || true)
    [ -z "$left" ] || fail "devices left behind: $left"
}

# expect_error DESCRIPTION CMD...: CMD must fail with exactly one line on
# stderr that starts with "casblk:" and does not mention a panic.
expect_error() {
    local what=$1; shift
    local err rc=0
    err=$("$@" 2>&1 >/dev/null) || rc=$?
    [ "$rc" -ne 0 ] || fail "$what: succeeded but should have failed"
    [ "$rc" -ne 101 ] || fail "$what: exit code 101 (a panic)"
    case "$err" in *panick*) fail "$what: panicked: $err" ;; esac
    [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "$what: expected one line of error, got: $err"
    case "$err" in casblk:*) ;; *) fail "$what: error does not start with 'casblk:': $err" ;; esac
    note "$what -> rc $rc: $err"
}

# fs_roundtrip DEV FS MNT: mkfs FS on DEV, mount at MNT, write a file tree,
# unmount, remount and verify it, unmount.
fs_roundtrip() {
    local dev=$1 fs=$2 mnt=$3
    case $fs in
        ext4) mkfs.ext4 -q -F "$dev" ;;
        xfs) mkfs.xfs -q -f "$dev" ;;
    esac
    mkdir -p "$mnt"
    mount "$dev" "$mnt"
    make_tree "$mnt" 40
    umount "$mnt"
    mount "$dev" "$mnt"
    verify_tree "$mnt"
    umount "$mnt"
}

# Builds a small file tree of random files under DIR and records its sums.
make_tree() {
    local dir=$1 n=${2:-60} i
    mkdir -p "$dir/a/b" "$dir/c"
    for i in $(seq 1 "$n"); do
        head -c $(( (i * 7919) % 300000 + 1 )) /dev/urandom > "$dir/$( [ $((i % 3)) -eq 0 ] && echo a/b || echo c )/f$i"
    done
    (cd "$dir" && find . -type f -print0 | sort -z | xargs -0 sha256sum) > "$SCRATCH/tree.sums"
}

verify_tree() { (cd "$1" && sha256sum --quiet -c "$SCRATCH/tree.sums") || fail "file tree checksums differ under $1"; }

# The whole kernel log. A dmesg that cannot run fails the test with a FAIL
# line: a check that a line is absent must not pass on an empty log.
kernel_log() { dmesg 2>/dev/null || fail "dmesg cannot run: the kernel log cannot be checked"; }

# awk, with `stamped` (the line carries a [seconds.micros] stamp) and
# stamp(line) (its seconds). Continuation lines of a message carry no stamp
# and go with the stamped line before them.
kernel_log_awk() {
    awk -v t="${2:-0}" 'function stamp(l) { sub(/^\[ */, "", l); sub(/\].*/, "", l); return l }
        { stamped = ($0 ~ /^\[ *[0-9]+\.[0-9]+\]/) } '"$1"
}

# The kernel log's last timestamp now, for kernel_log_since (a line count
# would not do: once the ring buffer is full, old lines drop as new come).
kernel_log_mark() { kernel_log | kernel_log_awk 'stamped { m = stamp($0) } END { print (m == "" ? "0" : m) }'; }

# The kernel log's lines stamped after MARK (from kernel_log_mark). Test
# its text with grep on a here-string, never `dmesg | grep -q`: under
# pipefail, grep -q exits at its first match, dmesg dies of SIGPIPE when it
# has more to write, and the pipeline fails although the line was there.
kernel_log_since() { kernel_log | kernel_log_awk 'stamped { keep = (stamp($0) + 0 > t + 0) } keep' "$1"; }

# True while PID runs (a zombie awaiting its reaper counts as gone).
pid_alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1; [ -n "$st" ] && [[ $st != Z* ]]; }

# A fresh store with one image NAME of SIZE; prints the store path.
new_store() { local s=$SCRATCH/store-$RANDOM; "$CASBLK" --store "$s" image create "$1" --size "$2" >/dev/null; echo "$s"; }

# Attach image NAME of STORE (extra casblk args follow); prints the device.
add_image() { local s=$1 n=$2; shift 2; "$CASBLK" --store "$s" add --image "$n" "$@"; }

# start_fio_verify DEV SIZE OUT: random 4 KiB writes over SIZE of DEV, with
# an fsync every 64 and a crc32c verify after, in the background (its pid
# in FIO_PID); finish_fio OUT WHAT waits for it and fails on any error.
start_fio_verify() {
    # At most 800 IOPS each way: a kill a few seconds in must land under
    # IO. Unthrottled, a quiet VM wrote and verified 64 MiB in 16 s (1,659
    # write IOPS), and t-cas-recover's kill came after fio had finished.
    fio --name=verify --filename="$1" --rw=randwrite --bs=4k --size="$2" --iodepth=16 --ioengine=io_uring \
        --direct=1 --fsync=64 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 --rate_iops=800 \
        --output="$3" &
    FIO_PID=$!
}
finish_fio() {
    wait "$FIO_PID" || { cat "$1"; fail "fio failed across $2"; }
    grep -q "err= 0" "$1" || { cat "$1"; fail "fio reported an error across $2"; }
}

# tally KEY N: counts N of KEY (kill9, powercut_points, fault_eio_write...)
# for docs/reliability.md, in $E2E_TALLY_FILE if set (ci/reliability reads
# it, counting only tests that passed).
tally() { [ -z "${E2E_TALLY_FILE:-}" ] || echo "${E2E_TEST:-?} $1 $2" >>"$E2E_TALLY_FILE"; }

# kill_daemon PID: SIGKILL, then wait (bounded) until it is gone.
kill_daemon() {
    tally kill9 1
    kill -KILL "$1"
    for _ in $(seq 100); do pid_alive "$1" || return 0; sleep 0.1; done
    fail "daemon $1 survived SIGKILL"
}

# block_sysfs DEV: the device's directory under /sys/block (DEV may be a
# symlink such as /dev/casblk/<image>).
block_sysfs() { echo "/sys/block/$(basename "$(readlink -f "$1")")"; }

# io_completions DEV...: reads plus writes the devices have completed
# (/sys/block/*/stat fields 1 and 5).
io_completions() {
    local n=0 d f
    for d in "$@"; do
        read -r -a f <"$(block_sysfs "$d")/stat" || fail "no stat for $d"
        n=$((n + f[0] + f[4]))
    done
    echo "$n"
}

# kill_under_io PID DEV...: kill -9 of daemon PID while each of its
# devices DEV has IO going. Each device must complete a request within 60 s
# (looked at every 50 ms; emulated, a device can pause for seconds while
# its log syncs, and fio can take long to start: t-cas-recover saw no
# completion within 15 s once, in a full suite), and the kill follows the
# last one seen at once,
# so IO was flowing to the daemon when it died; then, for 1 s, nothing may
# complete (the IO the dead daemon held waits for the recovery: a request
# failed at once would count as completed). The driver does not keep that
# IO in /sys/block/*/inflight (it requeues it), so completions are the
# evidence. Sets KILL_COMPLETIONS (completions at the kill, for
# wait_io_resumed).
kill_under_io() {
    local pid=$1 d i n
    shift
    local -A start
    for d in "$@"; do start[$d]=$(io_completions "$d"); done
    for d in "$@"; do
        for i in $(seq 1200); do
            [ "$(io_completions "$d")" -gt "${start[$d]}" ] && break
            sleep 0.05
        done
        if [ "$(io_completions "$d")" -le "${start[$d]}" ]; then
            ps -eo pid,stat,etime,comm | awk 'NR == 1 || $4 ~ /^(fio|casblk|qemu)/' >&2
            fail "no IO completed on $d in 60 s (in flight: $(xargs <"$(block_sysfs "$d")/inflight")): the kill would not land under IO"
        fi
    done
    kill_daemon "$pid"
    KILL_COMPLETIONS=$(io_completions "$@")
    sleep 1
    n=$(io_completions "$@")
    [ "$n" -eq "$KILL_COMPLETIONS" ] || fail "$((n - KILL_COMPLETIONS)) requests completed on $* in the second after the kill: IO failed instead of waiting"
    tally kill9_under_io 1
}

# wait_io_resumed DEV...: after a recovery, until the devices complete IO
# again (bounded, 120 s): the IO that waited through the kill goes on.
wait_io_resumed() {
    local deadline=$((SECONDS + 120))
    while [ "$(io_completions "$@")" -le "$KILL_COMPLETIONS" ]; do
        [ "$SECONDS" -lt "$deadline" ] || fail "no IO completed on $* within 120 s of the recovery"
        sleep 0.2
    done
}

# io_flusher_threads PID...: one line per thread of each process, "PID
# TID NAME ok" when its flags (/proc/PID/task/TID/stat, field 9) carry
# both bits PR_SET_IO_FLUSHER sets (PF_MEMALLOC_NOIO 0x80000 and
# PF_LOCAL_THROTTLE 0x100000), else "PID TID NAME MISSING(flags)".
io_flusher_threads() {
    local p
    for p in "$@"; do
        # One awk over every thread's stat: the name sits between the first
        # "(" and the last ")"; the fields after it start at field 3.
        awk -v pid="$p" '{
            i = index($0, "("); j = 0
            for (k = length($0); k > i; k--) if (substr($0, k, 1) == ")") { j = k; break }
            name = substr($0, i + 1, j - i - 1); gsub(/ /, "_", name)
            split(substr($0, j + 2), f, " ")
            flags = f[7] + 0
            if (int(flags / 524288) % 2 == 1 && int(flags / 1048576) % 2 == 1) print pid, $1, name, "ok"
            else printf "%s %s %s MISSING(%#x)\n", pid, $1, name, flags
        }' /proc/"$p"/task/*/stat 2>/dev/null || true
    done
}

# The driver's state of device ID: live, quiesced, dead, ...
device_state() {
    "$CASBLK" list --json | python3 -c "import json,sys; print([d['state'] for d in json.load(sys.stdin) if d['id']==$1][0])"
}

# The pid of the daemon serving device PATH.
daemon_pid() {
    "$CASBLK" list --json | python3 -c "import json,sys; print([d['daemon_pid'] for d in json.load(sys.stdin) if d['bdev']=='$1'][0])"
}

# The scheduling policies (0 normal, 3 batch, 5 idle: /proc stat field 41)
# of daemon PID's threads named NAME, sorted and unique, space-separated.
thread_policies() {
    local pid=$1 name=$2 t
    for t in /proc/"$pid"/task/*; do
        [ "$(cat "$t/comm" 2>/dev/null)" = "$name" ] || continue
        sed 's/.*) //' "$t/stat" | awk '{print $39}'
    done | sort -u | xargs
}

# Waits (bounded) until no ublk device is left.
wait_no_devices() {
    for _ in $(seq 100); do [ -z "$(ls /sys/class/ublk-char 2>/dev/null)" ] && return 0; sleep 0.1; done
    fail "devices still present: $(ls /sys/class/ublk-char)"
}

# Waits (bounded, 120 s) until CONDITION, a Python expression over `c`
# (one image's `cas` counters), holds for every image STORE's daemon
# serves; WHAT names the wait in the failure.
wait_images() {
    local store=$1 cond=$2 what=$3
    for _ in $(seq 240); do
        if "$CASBLK" --store "$store" stats --json | python3 -c "
import json, sys
snap = json.load(sys.stdin)
sys.exit(0 if all($cond for c in (i['counters']['cas'] for i in snap['images'])) else 1)"; then
            return 0
        fi
        sleep 0.5
    done
    fail "$what did not catch up within 120 s"
}

# Until STORE's daemon has compacted everything durable in every image.
wait_compacted() { wait_images "$1" "c['covered_seq'] >= c['durable_seq']" compaction; }

# Until every image of STORE's daemon has published all it made durable:
# the bucket's newest root covers the durable seq.
wait_published() { wait_images "$1" "c['remote.published_covered_seq'] >= c['durable_seq']" publication; }

# start_garage [NODES]: starts a Garage of NODES (1 or 3, replication
# factor NODES) under $SCRATCH/garage, stopped when the test exits, and
# sources its settings (CASBLK_GARAGE_*); $GARAGE_KEY is a key file for
# `casblk remote set`, `garage_node kill|restart N` acts on node N.
start_garage() {
    GARAGE_DIR=$SCRATCH/garage
    local env_file ci nodes=${1:-1}
    ci=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    # shellcheck disable=SC2064
    trap "'$ci/garage' stop --dir '$GARAGE_DIR' >/dev/null 2>&1 || true" EXIT
    env_file=$("$ci/garage" start --nodes "$nodes" --dir "$GARAGE_DIR") || fail "ci/garage could not start $nodes node(s)"
    # shellcheck disable=SC1090
    source "$env_file"
    GARAGE_KEY=$SCRATCH/key
    printf '%s\n%s\n' "$CASBLK_GARAGE_KEY_ID" "$CASBLK_GARAGE_SECRET" >"$GARAGE_KEY"
}

garage_node() { "$(dirname "${BASH_SOURCE[0]}")/../garage" "$1" "$2" --dir "$GARAGE_DIR" >/dev/null || fail "ci/garage $1 $2 failed"; }

# remote_set STORE [ENDPOINTS [KEY_FILE]]: records the started Garage's
# bucket (by default every endpoint, and $GARAGE_KEY).
remote_set() {
    "$CASBLK" --store "$1" remote set --endpoint "${2:-$CASBLK_GARAGE_ENDPOINTS}" --bucket "$CASBLK_GARAGE_BUCKET" \
        --key-file "${3:-$GARAGE_KEY}" >/dev/null
}

# fill_until_error DEV N: writes DEV with flushed 4 MiB writes of random
# data ($SCRATCH/fill<i>, at offset i * 4 MiB, each bounded to 150 s)
# until one fails (its error left in $SCRATCH/dd.err) or N are done, and
# prints how many were flushed.
fill_until_error() {
    local dev=$1 n=$2 i flushed=0
    for i in $(seq 0 $((n - 1))); do
        head -c 4M /dev/urandom >"$SCRATCH/fill$i"
        timeout 150 dd if="$SCRATCH/fill$i" of="$dev" bs=1M seek=$((i * 4)) oflag=direct conv=fsync status=none \
            2>"$SCRATCH/dd.err" || break
        flushed=$((i + 1))
    done
    echo "$flushed"
}

# Prints counter KEY of source SRC (e.g. store dedup_ratio) from STORE's stats.
store_counter() {
    "$CASBLK" --store "$1" stats --json | python3 -c "import json,sys; print(json.load(sys.stdin)['counters']['$2']['$3'])"
}

# Runs `casblk fsck` on STORE once its daemon has let go of it (bounded:
# exit 2 while the lock is still held), and fails unless it is clean.
# Prints fsck's summary line.
fsck_clean() {
    local store=$1 rc
    for _ in $(seq 100); do
        rc=0
        "$CASBLK" --store "$store" fsck >"$SCRATCH/fsck.txt" 2>&1 || rc=$?
        [ "$rc" -eq 2 ] && grep -q "daemon has it open" "$SCRATCH/fsck.txt" || break
        sleep 0.1
    done
    # Its findings go to stderr: the caller captures stdout (sum=$(...)).
    [ "$rc" -eq 0 ] || { cat "$SCRATCH/fsck.txt" >&2; fail "casblk fsck of $store exited $rc"; }
    tail -n 1 "$SCRATCH/fsck.txt"
}

# check_features DEV: `casblk features` against the running driver and
# DEV, a device casblk added for a cas image: every flag offered is named
# (no "BITn"), the mask line is the sum of the lines, every flag listed as
# "asked for" is on DEV, and every flag DEV has is asked for or "set by the
# kernel". On 7.3 the flags 6.12 lacks are offered; on 6.12 none of them.
check_features() {
    local dev=$1 out mask sum=0 name bit use asked by_kernel flags f
    out=$("$CASBLK" features) || fail "casblk features failed"
    mask=$(awk '$1 == "UBLK_FEATURES" {print $2}' <<<"$out")
    [ -n "$mask" ] || fail "no UBLK_FEATURES line in: $out"
    while read -r name bit use; do
        [ "$name" = UBLK_FEATURES ] && continue
        [[ $name == BIT* ]] && fail "flag $bit has no name: $name"
        [ -n "$use" ] || fail "$name: no word on whether casblk uses it"
        sum=$((sum | bit))
    done <<<"$out"
    [ $((sum)) -eq $((mask)) ] || fail "the listed flags sum to $(printf '%#x' "$sum"), the mask is $mask"
    asked=$(awk '$3 == "asked" {print $1}' <<<"$out")
    by_kernel=$(awk '/set by the kernel/ {print $1}' <<<"$out")
    flags=$("$CASBLK" list --json | python3 -c "import json,sys; print(*[f for d in json.load(sys.stdin) if d['bdev']=='$dev' for f in d['flags']])")
    [ -n "$flags" ] || fail "casblk list shows no flags for $dev"
    for f in $asked; do
        [[ " $flags " == *" $f "* ]] || fail "features says casblk asks for $f, but $dev has only: $flags"
    done
    for f in $flags; do
        grep -qx "$f" <<<"$asked"$'\n'"$by_kernel" || fail "$dev carries $f, which features lists as not used"
    done
    for f in $by_kernel; do
        [[ " $flags " == *" $f "* ]] || fail "features says the kernel sets $f on every device, but $dev has only: $flags"
    done
    local newer=(USER_RECOVERY_FAIL_IO UPDATE_SIZE QUIESCE SAFE_STOP_DEV NO_AUTO_PART_SCAN)
    case $(uname -r) in
        7.*) for f in "${newer[@]}"; do grep -q "^$f " <<<"$out" || fail "the $(uname -r) driver does not offer $f"; done ;;
        6.12.*) for f in "${newer[@]}"; do grep -q "^$f " <<<"$out" && fail "the 6.12 driver offers $f"; done ;;
    esac
    case $(uname -r) in "${CASBLK_VM_KERNEL:-}"*) ;; *) fail "asked for kernel $CASBLK_VM_KERNEL (CASBLK_VM_KERNEL), running $(uname -r)" ;; esac
    note "features on $(uname -r): mask $mask, $(grep -vc UBLK_FEATURES <<<"$out") flags; $dev carries $flags (asked for: $(echo $asked))"
}
