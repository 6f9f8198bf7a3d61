# Online scrub (issue 48 item 3) on a served store: a clean store scrubs
# clean while fio reads (read p99 with and without the scrub, printed and
# bounded); a byte flipped in a pack under the running daemon is found by
# `casblk scrub` (exit 1), named with the image block that holds it,
# counted in stats and metrics; a direct read of that block returns the
# bytes written while the chunk cache holds a good copy and fails with EIO
# once it does not, never other bytes; fsck of the stopped store reports
# the same chunk; with a bucket (Garage), a damaged chunk of an uploaded
# pack is repaired from the bucket's copy; bad input is refused in one
# line.
source "$(dirname "$0")/lib.sh"

store=$(new_store a 64M)
expect_error "a scrub rate of 0" "$CASBLK" --store "$store" scrub --rate 0
expect_error "a scrub of a missing image, no daemon" "$CASBLK" --store "$store" scrub --image nope
dev=$(add_image "$store" a)
expect_error "a scrub of a missing image, daemon running" "$CASBLK" --store "$store" scrub --image nope

# 16 MiB of random data, so every block is its own chunk.
head -c 16M /dev/urandom >"$SCRATCH/pattern"
dd if="$SCRATCH/pattern" of="$dev" bs=1M oflag=direct conv=fsync status=none

wait_compacted "$store"

# 1. Clean, and the cost to foreground reads.
fio_read() {
    fio --name="$1" --filename="$dev" --rw=randread --bs=4k --iodepth=4 --ioengine=io_uring --direct=1 \
        --size=16M --time_based --runtime=6 --output-format=json --output="$SCRATCH/$1.json" >/dev/null
    python3 -c "import json; r=json.load(open('$SCRATCH/$1.json'))['jobs'][0]['read']; print(round(r['clat_ns']['percentile']['99.000000']/1000), round(r['iops']))"
}
read -r p99_base iops_base <<<"$(fio_read base)"
fio --name=during --filename="$dev" --rw=randread --bs=4k --iodepth=4 --ioengine=io_uring --direct=1 \
    --size=16M --time_based --runtime=6 --output-format=json --output="$SCRATCH/during.json" >/dev/null &
fio_pid=$!
sleep 0.5
# 2 MiB/s: the 4096 chunks take about 8 s, so the scrub spans fio's run.
"$CASBLK" --store "$store" scrub --rate 2M --no-wait
wait "$fio_pid"
read -r p99_scrub iops_scrub <<<"$(python3 -c "import json; r=json.load(open('$SCRATCH/during.json'))['jobs'][0]['read']; print(round(r['clat_ns']['percentile']['99.000000']/1000), round(r['iops']))")"
[ "$("$CASBLK" --store "$store" stats --json | python3 -c "import json,sys; print(json.load(sys.stdin)['counters']['scrub']['running'])")" = 1 ] \
    || fail "the scrub ended before fio did: it did not overlap the measured reads: $("$CASBLK" --store "$store" scrub --status)"
note "4k randread p99 $p99_base us at $iops_base IOPS alone; $p99_scrub us at $iops_scrub IOPS with a 2 MiB/s scrub"
[ "$p99_scrub" -le $((p99_base * 2 + 500)) ] || fail "the scrub raised read p99 from $p99_base to $p99_scrub us (bound: 2x + 0.5 ms)"
for _ in $(seq 60); do
    [ "$("$CASBLK" --store "$store" stats --json | python3 -c "import json,sys; print(json.load(sys.stdin)['counters']['scrub']['running'])")" = 0 ] && break
    sleep 1
done
"$CASBLK" --store "$store" scrub --status >"$SCRATCH/status.json"
python3 - "$SCRATCH/status.json" <<'PY' || fail "the background scrub was not clean: $(cat "$SCRATCH/status.json")"
import json, sys
s = json.load(open(sys.argv[1]))
last = s["last"]
print(f"  - background pass: {last['chunks_checked']} chunks in {last['elapsed_ms']} ms, {last['damaged_chunks']} damaged")
sys.exit(0 if s["running"] is None and last["chunks_checked"] >= 4096 and last["damaged_chunks"] == 0 else 1)
PY
"$CASBLK" --store "$store" scrub | tee "$SCRATCH/clean.txt"
grep -q " 0 damaged chunks (0 repaired)" "$SCRATCH/clean.txt" || fail "a clean store did not scrub clean"

# 2. A flipped byte in a pack, under the running daemon.
packfile=$(ls "$store"/chunks/pack-*.pack | head -n1)
slot=100
python3 - "$packfile" $((4096 + slot * 4096 + 1234)) <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
off = int(sys.argv[2])
b = os.pread(fd, 1, off)
os.pwrite(fd, bytes([b[0] ^ 0x40]), off)
os.fsync(fd)
os.close(fd)
PY
pack_id=$(basename "$packfile" .pack | sed 's/pack-//')
note "flipped a byte of slot $slot in pack $pack_id"
rc=0
"$CASBLK" --store "$store" scrub >"$SCRATCH/damaged.txt" 2>"$SCRATCH/damaged.err" || rc=$?
cat "$SCRATCH/damaged.txt"
[ "$rc" -eq 1 ] || fail "scrub of a damaged store exited $rc: $(cat "$SCRATCH/damaged.err")"
grep -q "scrub found 1 damaged chunks (0 repaired)" "$SCRATCH/damaged.err" || fail "scrub's error line: $(cat "$SCRATCH/damaged.err")"
line=$(grep "^damaged: pack $((16#$pack_id)) slot $slot:" "$SCRATCH/damaged.txt") || fail "the damaged slot is not named"
block=$(sed -n 's/.*held by a block \([0-9][0-9]*\).*/\1/p' <<<"$line")
[ -n "$block" ] || fail "the damaged chunk names no block of image a: $line"
note "scrub named image a block $block"
counters=$("$CASBLK" --store "$store" stats --json | python3 -c "import json,sys; c=json.load(sys.stdin)['counters']['scrub']; print(c['last_damaged_chunks'], c['passes'])")
[ "${counters% *}" = 1 ] || fail "stats show scrub counters $counters"
"$CASBLK" --store "$store" stats --openmetrics | grep -qx "casblk_store_scrub_damaged_chunks 1" || fail "the metrics do not show the damaged chunk"

# 3. Reading the block: the bytes written while the chunk cache holds a
# good copy (fio read it), EIO once it does not (a new daemon); never
# other bytes.
read_block() { dd if="$dev" of="$SCRATCH/block" bs=4096 skip="$block" count=1 iflag=direct status=none 2>"$SCRATCH/dd.err"; }
if read_block; then
    cmp -s "$SCRATCH/block" <(dd if="$SCRATCH/pattern" bs=4096 skip="$block" count=1 status=none) \
        || fail "block $block read back other bytes than were written"
    note "block $block reads the written bytes from the chunk cache"
fi
"$CASBLK" del -a
wait_no_devices
dev=$(add_image "$store" a)
! read_block || fail "block $block of a damaged chunk read back without an error from a new daemon"
grep -qi "input/output error" "$SCRATCH/dd.err" || fail "reading block $block failed oddly: $(cat "$SCRATCH/dd.err")"
note "a new daemon (empty cache): reading block $block fails with EIO"
# 4. fsck of the stopped store names the same chunk and block.
"$CASBLK" del -a
wait_no_devices
rc=0
for _ in $(seq 100); do
    rc=0
    "$CASBLK" --store "$store" fsck >"$SCRATCH/fsck.txt" 2>&1 || rc=$?
    [ "$rc" -eq 2 ] || break
    sleep 0.1
done
[ "$rc" -eq 1 ] || fail "fsck of the damaged store exited $rc: $(tail -n 3 "$SCRATCH/fsck.txt")"
grep -q "block $block" "$SCRATCH/fsck.txt" || fail "fsck does not name block $block: $(head -n 5 "$SCRATCH/fsck.txt")"
note "fsck: $(grep -m1 "block $block" "$SCRATCH/fsck.txt")"

# 5. With a bucket, the damaged chunk is rewritten from the bucket's copy
# of its pack, and reads give the bytes written.
start_garage
r=$(new_store vm 64M)
remote_set "$r"
head -c 8M /dev/urandom >"$SCRATCH/data"
dev=$(add_image "$r" vm)
dd if="$SCRATCH/data" of="$dev" bs=1M oflag=direct conv=fsync status=none
wait_published "$r"
[ "$(store_counter "$r" remote uploaded_packs)" -ge 1 ] || fail "no pack reached the bucket"
packfile=$(ls "$r"/chunks/pack-*.pack | head -n1)
python3 - "$packfile" $((4096 + 10 * 4096 + 99)) <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
off = int(sys.argv[2])
os.pwrite(fd, bytes([os.pread(fd, 1, off)[0] ^ 0x40]), off)
os.fsync(fd)
os.close(fd)
PY
"$CASBLK" --store "$r" scrub >"$SCRATCH/repair.txt" || fail "scrub with a bucket copy exited non-zero: $(cat "$SCRATCH/repair.txt")"
cat "$SCRATCH/repair.txt"
grep -q "repaired from the bucket's copy" "$SCRATCH/repair.txt" || fail "the damaged chunk was not repaired"
grep -q " 1 damaged chunks (1 repaired)" "$SCRATCH/repair.txt" || fail "the summary does not count the repair"
block=$(sed -n 's/.*held by vm block \([0-9][0-9]*\).*/\1/p' "$SCRATCH/repair.txt")
[ -n "$block" ] || fail "the repaired chunk names no block"
"$CASBLK" del -a
wait_no_devices
dev=$(add_image "$r" vm)
cmp -s <(dd if="$dev" bs=4096 skip="$block" count=1 iflag=direct status=none) \
    <(dd if="$SCRATCH/data" bs=4096 skip="$block" count=1 status=none) || fail "block $block after the repair differs"
note "a byte flipped in an uploaded pack: repaired from the bucket; block $block reads back as written from a new daemon"
"$CASBLK" del -a
wait_no_devices
fsck_clean "$r"
