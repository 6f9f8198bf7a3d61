# Identical blocks are stored once across images, and `casblk gc` reclaims
# the chunks only removed images referenced. Automatic GC is off
# (--gc-auto off), so the pass that swept them is the one asked for.
source "$(dirname "$0")/lib.sh"
store=$(new_store img0 128M)
# The daemon starts with the first add: its settings come from there.
add_opts=(--gc-auto off)
head -c $((32 << 20)) /dev/urandom > "$SCRATCH/shared"
for i in 0 1 2 3; do
    [ $i -eq 0 ] || "$CASBLK" --store "$store" image create "img$i" --size 128M >/dev/null
    dev=$(add_image "$store" "img$i" "${add_opts[@]}")
    dd if="$SCRATCH/shared" of="$dev" bs=1M oflag=direct status=none
    head -c $((1 << 20)) /dev/urandom | dd of="$dev" bs=1M seek=64 oflag=direct status=none
    sync "$dev"
done
wait_compacted "$store"
"$CASBLK" --store "$store" stats --json > "$SCRATCH/before.json"
python3 - "$SCRATCH/before.json" <<'PY' || fail "shared content is not stored once"
import json, sys
st = json.load(open(sys.argv[1]))["counters"]["store"]
unique = (32 + 4) << 20
print(f"mapped {st['mapped_bytes'] >> 20} MiB, unique chunks {st['unique_bytes'] >> 20} MiB, "
      f"packs {st['stored_bytes'] >> 20} MiB, dedup ratio {st['dedup_ratio']:.2f}")
assert st["mapped_bytes"] == 4 * (33 << 20), st
assert st["unique_bytes"] == unique, st
assert st["stored_bytes"] <= unique * 1.02 + (1 << 20), st
PY
note "4 images x (32 MiB shared + 1 MiB own) store 36 MiB of chunks"
for i in 1 2 3; do
    "$CASBLK" del -n "$i"
done
for i in 1 2 3; do "$CASBLK" --store "$store" image rm "img$i"; done
"$CASBLK" --store "$store" gc --json > "$SCRATCH/gc.json"
"$CASBLK" --store "$store" stats --json > "$SCRATCH/after.json"
python3 - "$SCRATCH/gc.json" "$SCRATCH/after.json" <<'PY' || fail "GC did not reclaim the removed images' own chunks"
import json, sys
r = json.load(open(sys.argv[1]))
st = json.load(open(sys.argv[2]))["counters"]["store"]
print(f"gc: scanned {r['chunks_scanned']}, dead {r['chunks_dead']}, packs rewritten {r['packs_rewritten']}; "
      f"chunks left {st['chunks']}, automatic passes {st['gc_auto_passes']}")
assert st["chunks"] == (33 << 20) // 4096, st
assert st["gc_auto_passes"] == 0, ("automatic GC ran although it is off", st)
assert r["chunks_dead"] == 3 * 256, ("the manual pass did not sweep the removed images' own chunks", r)
PY
dd if="$(ls /dev/ublkb0)" of="$SCRATCH/back" bs=1M count=32 iflag=direct status=none
cmp "$SCRATCH/shared" "$SCRATCH/back" || fail "img0 lost shared data to GC"
note "GC swept exactly the removed images' own chunks; img0 intact"
"$CASBLK" del -a
wait_no_devices
sum=$(fsck_clean "$store") || exit 1
note "after GC: $sum"
