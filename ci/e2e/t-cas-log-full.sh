# A full log makes writes wait, never fail: 640 MiB of writes into an image
# whose log quota is 256 MiB complete with no error while compaction
# reclaims the log underneath, and the data verifies afterwards.
source "$(dirname "$0")/lib.sh"
store=$(new_store vm 1G)
dev=$(add_image "$store" vm -d 64)
cd "$SCRATCH"
fio --name=fill --filename="$dev" --rw=write --bs=1M --size=640M --iodepth=32 --ioengine=io_uring \
    --direct=1 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --output="$SCRATCH/fill.txt" || { cat "$SCRATCH/fill.txt"; fail "fio failed while the log was full"; }
grep -q "err= 0" "$SCRATCH/fill.txt" || { cat "$SCRATCH/fill.txt"; fail "fio reported an error"; }
"$CASBLK" stats -n "$(dev_id "$dev")" --json > "$SCRATCH/stats.json"
python3 - "$SCRATCH/stats.json" <<'PY' || fail "the log never filled, or writes failed"
import json, sys
img = json.load(open(sys.argv[1]))["images"][0]
cas, write = img["counters"]["cas"], img["ops"]["write"]
assert write["errors"] == 0, write
assert cas["segments_reclaimed"] > 0, "nothing was reclaimed"
assert cas["log_quota_bytes"] < 640 << 20
print(f"writes {write['count']} errors 0; segments reclaimed {cas['segments_reclaimed']}; "
      f"log-capacity waits {write['gates']['log_capacity']['requests']} requests, "
      f"max {write['gates']['log_capacity']['wait_ms_max']:.0f} ms")
PY
note "640 MiB through a 256 MiB log: waits, no errors, data verified"
"$CASBLK" del -a
wait_no_devices
