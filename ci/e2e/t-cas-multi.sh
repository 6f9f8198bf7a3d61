# One daemon serves several images: stats per device and for the store
# (JSON that parses, with the documented top-level keys), image list shows
# the attachments, and the daemon exits (socket removed) after del -a.
source "$(dirname "$0")/lib.sh"
store=$(new_store a 64M)
"$CASBLK" --store "$store" image create b --size 128M >/dev/null
da=$(add_image "$store" a)
db=$(add_image "$store" b -q 2)
[ "$(daemon_pid "$da")" = "$(daemon_pid "$db")" ] || fail "two images of one store got two daemons"
dd if=/dev/urandom of="$da" bs=64k count=16 oflag=direct status=none
dd if="$db" of=/dev/null bs=64k count=16 iflag=direct status=none
"$CASBLK" --store "$store" image list | grep -q "^a .*$da" || fail "image list does not show a attached"
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
"$CASBLK" stats -n "$(dev_id "$da")" | grep -q "^a " || fail "stats table lacks image a"
sock=$(ls /run/casblk/store-*.sock)
"$CASBLK" del -a
wait_no_devices
for _ in $(seq 50); do [ -e "$sock" ] || break; sleep 0.1; done
[ ! -e "$sock" ] || fail "the daemon's socket remained after its last device went"
note "one daemon, two images, stats, clean exit"
