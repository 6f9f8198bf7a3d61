# One daemon serves several images: stats per device and for the store
# (JSON that parses, with the documented top-level keys), `stats --watch`
# refreshes with the counts moving as IO runs, image list shows the
# attachments, and the daemon exits (socket removed) after del -a.
source "$(dirname "$0")/lib.sh"
store=$(new_store a 64M)
"$CASBLK" --store "$store" image create b --size 128M >/dev/null
da=$(add_image "$store" a)
db=$(add_image "$store" b -q 2)
[ "$(daemon_pid "$da")" = "$(daemon_pid "$db")" ] || fail "two images of one store got two daemons"
dd if=/dev/urandom of="$da" bs=64k count=16 oflag=direct status=none
dd if="$db" of=/dev/null bs=64k count=16 iflag=direct status=none
grep -q "^a .*$da" <<<"$("$CASBLK" --store "$store" image list)" || fail "image list does not show a attached"
"$CASBLK" --store "$store" stats --json > "$SCRATCH/all.json"
"$CASBLK" stats -n "$(dev_id "$db")" --json > "$SCRATCH/b.json"
python3 - "$SCRATCH/all.json" "$SCRATCH/b.json" <<'PY' || fail "stats JSON is not as documented"
import json, sys
all_, b = (json.load(open(p)) for p in sys.argv[1:])
assert all_["schema_version"] >= 1
names = sorted(i["name"] for i in all_["images"])
assert names == ["a", "b"], names
assert [i["name"] for i in b["images"]] == ["b"]
a = [i for i in all_["images"] if i["name"] == "a"][0]
assert a["ops"]["write"]["count"] >= 16, a["ops"]["write"]
assert "cas" in a["counters"] and "sched" in a["counters"]
print("stats ok")
PY
grep -q "^a " <<<"$("$CASBLK" stats -n "$(dev_id "$da")")" || fail "stats table lacks image a"

# --watch: one snapshot per interval until interrupted, writes counted as
# they happen (JSON, one line each), and the table form clears the screen.
(
    end=$((SECONDS + 7))
    while [ "$SECONDS" -lt "$end" ]; do dd if=/dev/urandom of="$da" bs=4k count=256 oflag=direct status=none; done
) &
writer=$!
timeout -s INT 5 "$CASBLK" stats -n "$(dev_id "$da")" --watch 1 --json >"$SCRATCH/watch.json" || true
wait "$writer"
python3 - "$SCRATCH/watch.json" <<'PY' || fail "stats --watch did not refresh with the writes"
import json, sys
counts = [json.loads(l)["images"][0]["ops"]["write"]["count"] for l in open(sys.argv[1]) if l.strip()]
assert len(counts) >= 3, f"{len(counts)} refreshes in 5 s at 1 s"
assert counts == sorted(counts) and counts[-1] > counts[0], counts
print(f"watch: {len(counts)} refreshes, writes {counts[0]} -> {counts[-1]}")
PY
timeout -s INT 3 "$CASBLK" stats -n "$(dev_id "$da")" --watch 1 >"$SCRATCH/watch.txt" || true
grep -q $'\e\[2J' "$SCRATCH/watch.txt" && grep -q "^a " "$SCRATCH/watch.txt" || fail "stats --watch's table did not refresh"
expect_error "stats --watch 0" "$CASBLK" stats -n "$(dev_id "$da")" --watch 0
sock=$(ls /run/casblk/store-*.sock)
"$CASBLK" del -a
wait_no_devices
for _ in $(seq 50); do [ -e "$sock" ] || break; sleep 0.1; done
[ ! -e "$sock" ] || fail "the daemon's socket remained after its last device went"
note "one daemon, two images, stats, clean exit"
