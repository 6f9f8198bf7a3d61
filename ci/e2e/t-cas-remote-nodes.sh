# Three Garage nodes (replication factor 3) inside the VM: one is killed
# while fio writes and verifies through a CAS device whose store uploads
# and publishes to the bucket; a write made while it is down is published
# with it down; it is started again. fio sees no error, and another store
# fetches the image with another node down and serves the same bytes.
# In the long mode only: 250-460 s under emulation, the longest test, and
# the bucket tier's single-node paths (t-cas-remote, t-cas-remote-kill) run
# in the default suite.
# e2e-long-only
source "$(dirname "$0")/lib.sh"
start_garage 3
# Publications of image vm by STORE's daemon so far.
publications() {
    "$CASBLK" --store "$1" stats --json | python3 -c '
import json, sys
c = [i for i in json.load(sys.stdin)["images"] if i["name"] == "vm"][0]["counters"]["cas"]
assert c["remote.lease_lost"] == 0, c
print(c["remote.publications"])'
}
a=$(new_store vm 128M)
remote_set "$a"
dev=$(add_image "$a" vm)
start_fio_verify "$dev" 32M "$SCRATCH/fio.txt"
sleep 2
garage_node kill 2
before=$(publications "$a")
head -c 8M /dev/urandom >"$SCRATCH/down"
dd if="$SCRATCH/down" of="$dev" bs=1M seek=64 oflag=direct conv=fsync status=none
wait_published "$a"
during=$(publications "$a")
[ "$during" -gt "$before" ] || fail "nothing was published while node 2 was down ($before, then $during)"
note "node 2 of 3 killed under fio; 8 MiB written and published with it down (publications $before -> $during)"
garage_node restart 2
finish_fio "$SCRATCH/fio.txt" "a Garage node's kill and restart"
wait_published "$a"
note "fio err=0 and verified across node 2's kill and restart; published $(publications "$a") times, lease held"
dd if="$dev" of="$SCRATCH/a.img" bs=1M count=72 iflag=direct status=none
"$CASBLK" del -a
wait_no_devices

garage_node kill 1
b=$(new_store scratch 1M)
remote_set "$b"
"$CASBLK" --store "$b" image fetch vm >/dev/null || fail "store B could not fetch with node 1 down"
devb=$(add_image "$b" vm)
dd if="$devb" of="$SCRATCH/b.img" bs=1M count=72 iflag=direct status=none
cmp "$SCRATCH/a.img" "$SCRATCH/b.img" || fail "store B's device differs from store A's"
cmp -n $((8 << 20)) "$SCRATCH/down" <(tail -c +$(((64 << 20) + 1)) "$SCRATCH/b.img") ||
    fail "store B lacks the write made while node 2 was down"
note "store B fetched with node 1 down and serves store A's bytes"
"$CASBLK" del -a
wait_no_devices
garage_node restart 1
"$CASBLK" --store "$b" fsck >/dev/null || fail "store B is not clean"
