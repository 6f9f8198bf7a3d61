# A store on a bucket (a one-node Garage inside the VM): a device's writes
# reach the bucket when it is deleted, and a scrub of the bucket's copies
# finds them whole; another store fetches the image and
# serves it as a device with the same bytes; the first store is then
# refused the image while the second holds its lease; bad settings are one
# line.
source "$(dirname "$0")/lib.sh"
start_garage
bad_key=$SCRATCH/bad-key
printf '%s\n%s\n' "$CASBLK_GARAGE_KEY_ID" "not-the-secret-at-all" >"$bad_key"

a=$(new_store vm 64M)
expect_error "a wrong secret" remote_set "$a" "$CASBLK_GARAGE_ENDPOINTS" "$bad_key"
expect_error "an endpoint nothing serves" remote_set "$a" "http://127.0.0.1:9"
remote_set "$a"

# Store A: 8 MiB through the device, then del publishes everything.
head -c 8M /dev/urandom >"$SCRATCH/data"
dev=$(add_image "$a" vm)
dd if="$SCRATCH/data" of="$dev" bs=1M oflag=direct conv=fsync status=none
"$CASBLK" del -n "$(dev_id "$dev")"
wait_no_devices
note "store A wrote 8 MiB and detached"
# del returns once the device is gone; the daemon then drains the image
# to the bucket as it detaches it.
for _ in $(seq 600); do
    "$CASBLK" --store "$a" image list --json | python3 -c "import json,sys; sys.exit(any(i['device'] for i in json.load(sys.stdin)))" && break
    sleep 0.1
done
out=$("$CASBLK" --store "$a" scrub --bucket) || fail "scrub --bucket of store A failed: $out"
grep -qE "scrub of the bucket: [1-9][0-9]* chunks" <<<"$out" || fail "scrub --bucket checked nothing: $out"
note "$out"
expect_error "scrub --bucket of a store with no remote" "$CASBLK" --store "$(new_store lonely 1M)" scrub --bucket

# Store B takes the image over and serves the same bytes.
b=$(new_store scratch 1M)
remote_set "$b"
fetched=$("$CASBLK" --store "$b" image fetch vm) || fail "image fetch failed"
grep -q "^vm: generation" <<<"$fetched" || fail "fetch printed no report"
devb=$(add_image "$b" vm)
cmp -n $((8 << 20)) "$SCRATCH/data" "$devb" || fail "store B's device differs from what store A wrote"
note "store B serves what store A wrote"
"$CASBLK" --store "$b" stats --json >"$SCRATCH/b.json"
python3 - "$SCRATCH/b.json" <<'PY' || fail "stats lack the image's remote counters"
import json, sys
snap = json.load(open(sys.argv[1]))
c = [i for i in snap["images"] if i["name"] == "vm"][0]["counters"]["cas"]
assert c["remote.lease_epoch"] >= 1, c
assert c["remote.lease_lost"] == 0 and c["remote.refused"] == 0, c
PY
note "stats show the image's lease and publication"

# While B holds the image, A is refused it.
expect_error "store A adds the image store B holds" add_image "$a" vm
"$CASBLK" del -a
wait_no_devices
"$CASBLK" --store "$b" fsck >/dev/null || fail "store B is not clean after the take-over"
note "store A refused, store B clean"
