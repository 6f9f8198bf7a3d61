# A full log makes writes wait, never fail: 320 MiB of writes into an image
# whose log quota is 32 MiB (`add --log-quota`) complete with no error
# while compaction reclaims the log underneath, and the data verifies
# afterwards. The daemon's settings flags reach the store (the background
# threads' CPU class among them), and a later add asking the running
# daemon for different ones is refused.
source "$(dirname "$0")/lib.sh"
store=$(new_store vm 1G)
"$CASBLK" --store "$store" image create other --size 64M >/dev/null
dev=$(add_image "$store" vm -d 64 --log-quota 32M --chunk-cache 1M --background-cpu normal)
expect_error "a running daemon asked for another log quota" \
    "$CASBLK" --store "$store" add --image other --log-quota 64M
expect_error "a running daemon asked for another background CPU class" \
    "$CASBLK" --store "$store" add --image other --background-cpu idle
other=$(add_image "$store" other --log-quota 32M) || fail "the same settings as the daemon's were refused"
cd "$SCRATCH"
fio --name=fill --filename="$dev" --rw=write --bs=1M --size=320M --iodepth=32 --ioengine=io_uring \
    --direct=1 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --output="$SCRATCH/fill.txt" || { cat "$SCRATCH/fill.txt"; fail "fio failed while the log was full"; }
grep -q "err= 0" "$SCRATCH/fill.txt" || { cat "$SCRATCH/fill.txt"; fail "fio reported an error"; }
"$CASBLK" stats -n "$(dev_id "$dev")" --json > "$SCRATCH/stats.json"
python3 - "$SCRATCH/stats.json" <<'PY' || fail "the log never filled, or writes failed"
import json, sys
snap = json.load(open(sys.argv[1]))
img = snap["images"][0]
cas, write = img["counters"]["cas"], img["ops"]["write"]
settings, chunks = snap["counters"]["settings"], snap["counters"]["chunks"]
assert write["errors"] == 0, write
assert cas["segments_reclaimed"] > 0, "nothing was reclaimed"
waited = sum(img["ops"][op]["gates"].get("log_capacity", {}).get("requests", 0)
             for op in ("write", "write_zeroes", "discard"))
assert waited > 0, "no write waited at the log_capacity gate: the log never filled"
assert cas["capacity_waits"] == waited, f"cas.capacity_waits {cas['capacity_waits']} != log_capacity gate {waited}"
assert cas["log_quota_bytes"] == 32 << 20, cas["log_quota_bytes"]
assert settings["log_quota_bytes"] == 32 << 20 and settings["chunk_cache_bytes"] == 1 << 20, settings
assert chunks["cache_entries"] <= 256, f"a 1 MiB chunk cache holds {chunks['cache_entries']} chunks"
print(f"writes {write['count']} errors 0; segments reclaimed {cas['segments_reclaimed']}; "
      f"log-capacity waits {write['gates']['log_capacity']['requests']} requests, "
      f"max {write['gates']['log_capacity']['wait_ms_max']:.0f} ms")
PY
pid=$(daemon_pid "$dev")
for name in cas-compactor wal-wb-vm; do
    got=$(thread_policies "$pid" "$name")
    [ "$got" = 0 ] || fail "--background-cpu normal: $name runs under policy '$got', not 0"
done
note "320 MiB through a 32 MiB log: waits, no errors, data verified; settings applied and checked"
"$CASBLK" del -a
wait_no_devices
