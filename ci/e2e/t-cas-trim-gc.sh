# A guest's fstrim gives the space back without an operator: a file
# deleted on ext4 over a store image, fstrim, and the daemon's automatic
# GC sweeps its chunks. The store has not grown since the last pass, so
# the dropped block mappings alone start it (cas::gc::auto). Passes here
# are at least 15 s apart (--gc-auto-interval; 60 s by default).
# In the long mode only (184 s (320 MiB written and compacted); t-guest-vm shows a guest fstrim freeing store space).
# e2e-long-only
source "$(dirname "$0")/lib.sh"
store=$(new_store trim 1G)
dev=$(add_image "$store" trim --gc-auto-interval 15)
mnt=$SCRATCH/mnt-trim
mkdir -p "$mnt"
mkfs.ext4 -q "$dev"
mount "$dev" "$mnt"
# 320 MiB: 81,920 chunks, past the 65,536 floor of both GC rules.
head -c $((320 << 20)) /dev/urandom >"$mnt/big"
head -c $((8 << 20)) /dev/urandom >"$mnt/keep"
(cd "$mnt" && sha256sum keep) >"$SCRATCH/keep.sum"
sync
wait_compacted "$store"

# until_auto_pass N: until the daemon has run more than N automatic passes
# (15 s after the last pass or the open).
until_auto_pass() {
    local p deadline=$((SECONDS + 150))
    while [ "$SECONDS" -lt "$deadline" ]; do
        p=$(store_counter "$store" store gc_auto_passes)
        [ "$p" -gt "$1" ] && return 0
        sleep 2
    done
    fail "no automatic GC pass within 150 s (passes: $p)"
}
# The growth from empty starts the first pass; it finds nothing dead.
until_auto_pass 0
passes=$(store_counter "$store" store gc_auto_passes)
before=$(store_counter "$store" store chunks)
note "after writing: $before chunks, $passes automatic GC pass(es)"

# A first fstrim after the mount trims all free space, never written and
# so unmapped already: only the second one's figure is the file's.
fstrim "$mnt" || fail "fstrim failed"
rm "$mnt/big"
# The freed blocks reach ext4's free-space map when the unlink's journal
# transaction commits: sync first, or fstrim skips them.
sync
out=$(fstrim -v "$mnt") || fail "fstrim failed"
trimmed=$(echo "$out" | grep -o '[0-9]* bytes' | grep -o '[0-9]*')
[ "${trimmed:-0}" -ge $((320 << 20)) ] || fail "fstrim trimmed only ${trimmed:-0} bytes after the rm: $out"
note "fstrim after the rm: $trimmed bytes"
sync
wait_compacted "$store"
# The unlink's metadata writes store a few new chunks; nothing is swept
# but by a pass. The next pass may already be due (15 s after the first,
# which can have run while the file was still being written): then it is
# counted, and the chunks read around the count show which side of it they
# are on.
p1=$(store_counter "$store" store gc_auto_passes)
mid=$(store_counter "$store" store chunks)
p2=$(store_counter "$store" store gc_auto_passes)
if [ "$p2" -eq "$passes" ]; then
    [ "$mid" -ge "$before" ] || fail "chunks were swept without a pass ($before -> $mid, passes $passes)"
    until_auto_pass "$passes"
    note "after fstrim: $mid chunks, before the next pass"
else
    note "the next automatic pass was due already (passes $passes -> $p1..$p2)"
    # That pass may have begun before the trim's drops were counted.
    [ "$(store_counter "$store" store chunks)" -le $((before - 81920 + 256)) ] || until_auto_pass "$p2"
fi
after=$(store_counter "$store" store chunks)
note "after the automatic pass: $after chunks"
[ "$after" -le $((before - 81920 + 256)) ] || fail "the trimmed file's chunks were not swept ($before -> $after)"
(cd "$mnt" && sha256sum --quiet -c "$SCRATCH/keep.sum") || fail "the kept file changed"
umount "$mnt"
mount "$dev" "$mnt"
(cd "$mnt" && sha256sum --quiet -c "$SCRATCH/keep.sum") || fail "the kept file changed after remount"
umount "$mnt"
"$CASBLK" del -a
wait_no_devices
sum=$(fsck_clean "$store") || exit 1
note "after trim and GC: $sum"
