# The metrics endpoint (issue 48): a store daemon started with
# --metrics-listen serves Prometheus text over HTTP that promtool accepts;
# while fio runs, scraped every second, the counters only grow, the write
# bytes grow by exactly what fio wrote and the latency histogram counts
# every request; `stats --openmetrics` has the same families; every metric
# the Grafana dashboard names is exposed; a client that sends nothing does
# not hold up a scrape; a bad or taken address is refused in one line; the
# port is free again once the last device is gone. Then physical space: a
# store on a small filesystem reports its size, free space and overcommit
# as df does, and --space-warn raises and clears the warning (log, stats,
# metrics) as a ballast file fills and leaves the filesystem.
source "$(dirname "$0")/lib.sh"
[ -x "${CASBLK_PROMTOOL:-}" ] || fail "no promtool at '${CASBLK_PROMTOOL:-}': run ci/setup"
# expect_error_naming TEXT DESCRIPTION CMD...: expect_error, and the one
# line names TEXT (the flag at fault), so another failure cannot pass.
expect_error_naming() {
    local text=$1 out; shift
    out=$(expect_error "$@") || exit 1
    echo "$out"
    grep -qF -- "$text" <<<"$out" || fail "$1: the error does not name $text: $out"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
store=$(new_store a 256M)
for n in b c; do "$CASBLK" --store "$store" image create "$n" --size 256M >/dev/null; done
expect_error_naming --metrics-allow-remote "a metrics address other hosts reach" add_image "$store" a --metrics-listen "0.0.0.0:$port"
dev=$(add_image "$store" a --metrics-listen "127.0.0.1:$port")
# b has limits far above what it does, so the limit families (exposed
# only for limits that are set) are there for the dashboard check.
devb=$(add_image "$store" b --metrics-listen "127.0.0.1:$port" --read-iops 1000000 --write-bps 1T)
note "a and b on one daemon, metrics at 127.0.0.1:$port"
expect_error_naming "already runs with --metrics-listen" "another metrics address for the running daemon" \
    add_image "$store" c --metrics-listen "127.0.0.1:$(free_port)"
other=$(new_store d 64M)
expect_error_naming "Address already in use" "a metrics address another daemon holds" add_image "$other" d --metrics-listen "127.0.0.1:$port"

fio --name=w --filename="$dev" --rw=randwrite --bs=64k --size=64M --iodepth=8 --ioengine=io_uring --direct=1 \
    --time_based --runtime=6 --output-format=json --output="$SCRATCH/fio-a.json" &
fio_a=$!
fio --name=r --filename="$devb" --rw=randread --bs=4k --size=64M --iodepth=4 --ioengine=io_uring --direct=1 \
    --time_based --runtime=6 --output-format=json --output="$SCRATCH/fio-b.json" &
fio_b=$!
# One scrape before fio's first write would be ideal, but fio starts at
# once: the first scrape's write bytes are subtracted from the last.
python3 - "$port" "$SCRATCH/scrape" "$fio_a" <<'PY' || fail "scraping during fio failed"
import os, sys, time, urllib.request
port, out, fio = sys.argv[1], sys.argv[2], int(sys.argv[3])
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False
i = 0
while True:
    running = alive(fio)
    t = time.monotonic()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    open(f"{out}.{i:03d}", "w").write(body)
    i += 1
    if not running:
        break
    time.sleep(max(0.0, 1.05 - (time.monotonic() - t)))
PY
wait "$fio_a" || fail "fio on a failed"
wait "$fio_b" || fail "fio on b failed"
sleep 1.1 # past the endpoint's one-second cache
python3 - "$port" "$SCRATCH/scrape.final" <<'PY' || fail "the last scrape failed"
import sys, urllib.request
open(sys.argv[2], "w").write(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode())
PY
"$CASBLK_PROMTOOL" check metrics <"$SCRATCH/scrape.final" >"$SCRATCH/promtool.txt" 2>&1 \
    || fail "promtool check metrics: $(cat "$SCRATCH/promtool.txt")"
[ ! -s "$SCRATCH/promtool.txt" ] || fail "promtool check metrics: $(cat "$SCRATCH/promtool.txt")"
"$CASBLK" --store "$store" stats --openmetrics >"$SCRATCH/openmetrics.txt"
dashboard=$(dirname "$0")/../../dist/grafana/casblk.json
summary=$(python3 - "$SCRATCH" "$dashboard" <<'PY'
import glob, json, re, sys
scratch, dashboard = sys.argv[1], sys.argv[2]
def parse(path):
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        series, value = line.rsplit(" ", 1)
        out[series] = float(value)
    return out
def fail(msg):
    print(msg)
    sys.exit(1)
scrapes = [parse(p) for p in sorted(glob.glob(f"{scratch}/scrape.[0-9]*"))] + [parse(f"{scratch}/scrape.final")]
if len(scrapes) < 5:
    fail(f"only {len(scrapes)} scrapes in a 6 s run")
wreq = 'casblk_image_requests_total{image="a",op="write"}'
wbytes = 'casblk_image_request_bytes_total{image="a",op="write"}'
wcount = 'casblk_image_request_duration_seconds_count{image="a",op="write"}'
winf = 'casblk_image_request_duration_seconds_bucket{image="a",op="write",le="+Inf"}'
rreq = 'casblk_image_requests_total{image="b",op="read"}'
for s in scrapes:
    if s[wcount] != s[wreq] or s[winf] != s[wreq]:
        fail(f"the histogram's count {s[wcount]} / +Inf {s[winf]} is not the request count {s[wreq]}")
    if s['casblk_image_state{image="a",state="live"}'] != 1:
        fail("image a is not live")
for key in (wreq, wbytes, rreq):
    values = [s[key] for s in scrapes]
    if any(b < a for a, b in zip(values, values[1:])):
        fail(f"{key} went down: {values}")
    if len(set(values[:-1])) < 3:
        fail(f"{key} did not move with the IO: {values}")
fio = json.load(open(f"{scratch}/fio-a.json"))["jobs"][0]["write"]["io_bytes"]
final = scrapes[-1][wbytes]
if final != fio:
    fail(f"write bytes {final:.0f} in the metrics, fio wrote {fio}")
om = {k.split("{")[0] for k in parse(f"{scratch}/openmetrics.txt")}
live = {k.split("{")[0] for k in scrapes[-1]}
if om != live:
    fail(f"stats --openmetrics and the endpoint differ: {sorted(om ^ live)}")
names = set(re.findall(r"casblk_[a-z0-9_]+", open(dashboard).read()))
if names - live:
    fail(f"the dashboard names metrics the daemon does not expose: {sorted(names - live)}")
rss = scrapes[-1]["casblk_daemon_resident_memory_bytes"]
print(f"{len(scrapes)} scrapes; writes {scrapes[-1][wreq]:.0f} requests, {final/2**20:.1f} MiB (= fio's); "
      f"b reads {scrapes[-1][rreq]:.0f}; {len(live)} series names; daemon RSS {rss/2**20:.0f} MiB; "
      f"{len(names)} dashboard names all exposed")
PY
) || fail "$summary"
note "$summary"

# Bounds: a client that connects and sends nothing holds the endpoint for
# at most its 2 s head deadline; oversized headers and other paths are
# refused.
bounds=$(python3 - "$port" <<'PY'
import socket, sys, time, urllib.error, urllib.request
port = int(sys.argv[1])
idle = socket.create_connection(("127.0.0.1", port))
t = time.monotonic()
urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
waited = time.monotonic() - t
if waited > 4:
    print(f"a scrape behind a silent client took {waited:.1f} s"); sys.exit(1)
idle.close()
s = socket.create_connection(("127.0.0.1", port))
s.settimeout(10)
try:
    s.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (64 << 10) + b"\r\n\r\n")
except OSError:
    pass
try:
    head = s.recv(64)
except OSError:
    head = b""
if not head.startswith(b"HTTP/1.1 431"):
    print(f"64 KiB of headers got {head!r}"); sys.exit(1)
try:
    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
    print("/ was answered"); sys.exit(1)
except urllib.error.HTTPError as e:
    if e.code != 404:
        print(f"/ got {e.code}"); sys.exit(1)
print(f"a scrape behind a silent client took {waited:.1f} s; 64 KiB of headers: {head[:12]!r}; / -> 404")
PY
) || fail "$bounds"
note "$bounds"

pid=$(daemon_pid "$dev")
"$CASBLK" del -a
wait_no_devices
for _ in $(seq 100); do pid_alive "$pid" || break; sleep 0.1; done
! pid_alive "$pid" || fail "the store daemon ($pid) did not exit within 10 s of del -a"
# Nothing listens, and a new daemon could bind the port again (with
# SO_REUSEADDR, as it does: the closed scrapes' TIME_WAIT stays a while).
python3 - "$port" <<'PY' || fail "port $port is still taken after the daemon exited"
import socket, sys
port = int(sys.argv[1])
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    sys.exit(1)
except ConnectionRefusedError:
    pass
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
PY
note "port $port is free after del -a"

# Physical space on a 64 MiB ext4 (about 55 MiB usable): 128 MiB promised.
modprobe loop 2>/dev/null || true
small=$SCRATCH/small.img
truncate -s 64M "$small" && mkfs.ext4 -q -F "$small"
mkdir -p "$SCRATCH/small" && mount -o loop "$small" "$SCRATCH/small"
trap 'umount "$SCRATCH/small" 2>/dev/null || true' EXIT
sstore=$SCRATCH/small/store
"$CASBLK" --store "$sstore" image create s --size 128M >/dev/null
sport=$(free_port)
sdev=$(add_image "$sstore" s --log-quota 16M --space-warn 60 --metrics-listen "127.0.0.1:$sport")
expect_error_naming "--space-warn" "a --space-warn past 100" add_image "$sstore" s --space-warn 101
list=$("$CASBLK" --store "$sstore" image list)
grep -qE "images promise 128 MiB on a filesystem of .* overcommit [0-9]+\.[0-9]{2}x" <<<"$list" \
    || fail "image list does not show the overcommit: $list"
# space_state: warning used% avail size provisioned, from one scrape.
space_state() {
    python3 - "$sport" <<'PY'
import sys, urllib.request
t = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
v = {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in t.splitlines() if l and not l.startswith("#")}
print(int(v["casblk_store_space_warning"]), int(v["casblk_store_fs_avail_bytes"]), int(v["casblk_store_fs_size_bytes"]),
      int(v["casblk_store_provisioned_bytes"]), v["casblk_store_overcommit_ratio"])
PY
}
read -r warning avail size promised ratio <<<"$(space_state)"
df_avail=$(( $(stat -f -c '%a * %S' "$SCRATCH/small") ))
df_size=$(( $(stat -f -c '%b * %S' "$SCRATCH/small") ))
[ "$warning" = 0 ] || fail "a nearly empty filesystem is in the warning state"
[ "$size" = "$df_size" ] || fail "fs size $size in the metrics, $df_size by statfs"
[ $((avail - df_avail)) -le $((1 << 20)) ] && [ $((df_avail - avail)) -le $((1 << 20)) ] \
    || fail "fs avail $avail in the metrics, $df_avail by statfs"
[ "$promised" = $((128 << 20)) ] || fail "provisioned $promised, not 128 MiB"
note "space: $size bytes, $avail free (statfs: $df_avail), provisioned $promised, overcommit $ratio"
# wait_warning W: the state becomes W within the watch's 5 s interval (and 10 s of slack).
wait_warning() {
    local w
    for _ in $(seq 30); do
        read -r w _ <<<"$(space_state)"
        [ "$w" = "$1" ] && return 0
        sleep 0.5
    done
    fail "the space warning did not become $1 within 15 s"
}
mark=$(grep -c "" /run/casblk/casblk.log || true)
# Leave 30% of the filesystem free: 70% used.
head -c $((df_avail - df_size * 3 / 10)) /dev/zero >"$SCRATCH/small/ballast" && sync
wait_warning 1
tail -n +"$((mark + 1))" /run/casblk/casblk.log | grep -q "full (--space-warn 60)" \
    || fail "the daemon did not log the space warning"
rm "$SCRATCH/small/ballast" && sync
wait_warning 0
tail -n +"$((mark + 1))" /run/casblk/casblk.log | grep -q "below --space-warn 60" \
    || fail "the daemon did not log that the warning cleared"
note "--space-warn 60: a ballast up to 70% used raised the warning (log and metric), removing it cleared both"
"$CASBLK" del -a
wait_no_devices
