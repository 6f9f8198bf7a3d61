# The harness's side of the nested guests (sourced by ci/e2e/t-guest-*.sh
# after ci/e2e/lib.sh; runs inside ci/vm). A guest NAME has a console file
# ($SCRATCH/NAME.console, what the agent reports), a control file
# ($SCRATCH/NAME.ctl, what the harness says) and a QEMU process.
GUEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_AGENT=${GUEST_AGENT:-$(dirname "$CASBLK")/guest_agent}
[ -x "$GUEST_AGENT" ] || fail "no guest agent at $GUEST_AGENT (cargo build --release -p casblk-ci --bin guest_agent)"
GUEST_KIT=$("$GUEST_DIR/kit" --check) || fail "the guest kit is not ready (ci/setup makes it)"
GUEST_PIDS=()

# Every guest still running when the test ends is stopped, so a failed
# test leaves no QEMU holding its disks.
guest_stop_all() {
    local p
    for p in "${GUEST_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap guest_stop_all EXIT

# guest_root_image FILE: an ext4 image of the kit's root tree with the
# agent as its /sbin/init (ci/guest/root-image).
guest_root_image() {
    TMPDIR=$SCRATCH "$GUEST_DIR/root-image" "$1" "$GUEST_AGENT" || fail "making the guest's root image failed"
}

# guest_start NAME APPEND DISK...: boots guest NAME in the background with
# APPEND on its kernel command line (casblk.role=...) and DISKs (the
# first is its root).
guest_start() {
    local name=$1 append=$2 letters=(a b c d e f g h)
    shift 2
    truncate -s 0 "$SCRATCH/$name.ctl" && truncate -s 1M "$SCRATCH/$name.ctl"
    : >"$SCRATCH/$name.console"
    "$GUEST_DIR/run" --console "$SCRATCH/$name.console" --control "$SCRATCH/$name.ctl" \
        --append "casblk.ctl=/dev/vd${letters[$#]} $append" "$@" \
        >"$SCRATCH/$name.qemu" 2>&1 &
    GUEST_PIDS+=($!)
    eval "GUEST_PID_$name=$!"
    eval "GUEST_T0_$name=$SECONDS"
    note "guest $name started (QEMU pid $!): $append $*"
}

guest_pid() { eval "echo \$GUEST_PID_$1"; }

# Prints the guest's report lines (without the prefix).
guest_reports() { grep -a '^casblk-guest: ' "$SCRATCH/$1.console" | sed 's/^casblk-guest: //' | tr -d '\r'; }

# Fails the test showing what guest NAME printed last, and QEMU's own words.
guest_fail() {
    echo "--- guest $1 console (last 40 lines):" >&2
    tail -n 40 "$SCRATCH/$1.console" | tr -d '\r' >&2 || true
    echo "--- QEMU:" >&2
    cat "$SCRATCH/$1.qemu" >&2 || true
    fail "guest $1: $2"
}

# guest_wait NAME WORD [SECONDS]: until guest NAME has reported a line
# starting with WORD (bounded, default 600 s); fails at once if it
# reported a failure or QEMU exited first. Prints that line.
guest_wait() {
    local name=$1 word=$2 limit=${3:-600} pid line
    pid=$(guest_pid "$name")
    local deadline=$((SECONDS + limit))
    while :; do
        line=$(guest_reports "$name" | grep -a -m1 "^$word" || true)
        [ -z "$line" ] || { echo "$line"; return 0; }
        grep -q '^FAIL' <<<"$(guest_reports "$name")" && guest_fail "$name" "reported a failure while the harness waited for '$word'"
        pid_alive "$pid" || guest_fail "$name" "QEMU exited before the guest reported '$word'"
        [ "$SECONDS" -lt "$deadline" ] || guest_fail "$name" "no '$word' within $limit s"
        sleep 1
    done
}

# guest_count NAME WORD: how many report lines start with WORD.
guest_count() { guest_reports "$1" | grep -a -c "^$2" || true; }

# guest_say NAME WORD: tells guest NAME the word it waits for.
guest_say() {
    printf '%s\n' "$2" | dd of="$SCRATCH/$1.ctl" conv=notrunc status=none
    note "said '$2' to guest $1"
}

# guest_value LINE KEY: the value of KEY=VALUE in a report line.
guest_value() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }

# guest_end NAME [SECONDS]: waits (bounded, default 600 s) for QEMU to exit
# and fails unless the guest reported "done rc=0". Prints its run time.
guest_end() {
    local name=$1 limit=${2:-600} pid t0
    pid=$(guest_pid "$name")
    local deadline=$((SECONDS + limit))
    while pid_alive "$pid"; do
        [ "$SECONDS" -lt "$deadline" ] || guest_fail "$name" "still running $limit s after the harness waited for its end"
        sleep 1
    done
    wait "$pid" 2>/dev/null || true
    grep -q '^done rc=0' <<<"$(guest_reports "$name")" || guest_fail "$name" "did not end with done rc=0"
    # Where the guest's time went: each step and the guest's uptime at it.
    note "guest $name steps (at guest seconds): $(guest_reports "$name" | grep -av '^fsynced\|^kernel:' |
        awk '{t = "?"; for (i = 2; i <= NF; i++) if ($i ~ /^at_s=/) t = substr($i, 6); printf "%s@%s ", $1, t}')"
    t0=$(eval "echo \$GUEST_T0_$name")
    note "guest $name ended cleanly after $((SECONDS - t0)) s (booted to its agent at $(guest_reports "$name" | sed -n 's/^up uptime_s=\([0-9.]*\).*/\1/p') s of guest time)"
}
