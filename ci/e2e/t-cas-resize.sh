# Growing an image (casblk image resize) under a mounted ext4. Where the
# driver has UPDATE_SIZE (7.x), the attached image grows online: the
# device shows the new size at once (blockdev, casblk list), resize2fs
# grows the mounted ext4, a file fills space only the new size has, and
# after del and add every file reads back. Where it does not (6.12), the
# attached grow is refused in one line naming the kernel needed and
# changes nothing; after del the image grows and its next device has the
# new size. Snapshots keep their size; a shrink without --shrink, a
# snapshot, a size not in 4 KiB and a missing image are refused. A
# detached image shrinks with --shrink (after its ext4 shrank): its files
# read back and GC frees what the dropped bytes held; an attached one is
# refused.
# e2e-7.3
source "$(dirname "$0")/lib.sh"
old=$((64 << 20)) new=$((160 << 20))
store=$(new_store vm "$old")
dev=$(add_image "$store" vm)
mnt=$SCRATCH/mnt
mkdir -p "$mnt"
mkfs.ext4 -q -F "$dev"
mount "$dev" "$mnt"
head -c $((16 << 20)) /dev/urandom >"$mnt/a"
sync -f "$mnt/a"
sums=$(cd "$mnt" && sha256sum a)

shows() { blockdev --getsize64 "$1"; }
listed() { # the size `casblk list` shows for device $1
    "$CASBLK" list --json | python3 -c "import json,sys; print(*[d['size_bytes'] for d in json.load(sys.stdin) if d['bdev']=='$1'])"
}
image_size() { # the size `image list` shows for image $1
    "$CASBLK" --store "$store" image list --json | python3 -c "import json,sys; print(*[i['size_bytes'] for i in json.load(sys.stdin) if i['name']=='$1'])"
}
fs_blocks() { df --output=size -B1 "$mnt" | tail -n 1 | tr -d ' '; }
[ "$(shows "$dev")" -eq "$old" ] || fail "$dev shows $(shows "$dev") bytes, not $old"

"$CASBLK" --store "$store" image snapshot vm s >/dev/null || fail "snapshot failed"
# refused SAYS WHAT ARGS...: resize ARGS fails in one line that says SAYS.
refused() {
    local says=$1 what=$2; shift 2
    expect_error "$what" "$CASBLK" --store "$store" image resize "$@"
    grep -q "$says" <<<"$("$CASBLK" --store "$store" image resize "$@" 2>&1)" || fail "$what: the error does not say '$says'"
}
refused "shrinking it" "a shrink" vm 32M
refused "multiple of 4096" "a size not in 4 KiB" vm $((old + 512))
refused "snapshots keep their size" "growing a snapshot" vm@s 128M
refused "not found" "growing a missing image" none 128M

# fill_past_old: a file larger than the old size could hold beside a.
fill_past_old() {
    head -c $((72 << 20)) /dev/urandom >"$mnt/b" || fail "writing 72 MiB more after the grow failed"
    sync -f "$mnt/b"
    sums+=$'\n'$(cd "$mnt" && sha256sum b)
}

before=$(fs_blocks)
features=$("$CASBLK" features)
case $(uname -r) in 7.*) grep -q '^UPDATE_SIZE ' <<<"$features" || fail "the $(uname -r) driver offers no UPDATE_SIZE";; esac
if grep -q '^UPDATE_SIZE ' <<<"$features"; then
    out=$("$CASBLK" --store "$store" image resize vm "$new") || fail "growing the attached image failed"
    note "$out"
    [ "$(shows "$dev")" -eq "$new" ] || fail "$dev shows $(shows "$dev") bytes after the grow, not $new"
    [ "$(listed "$dev")" -eq "$new" ] || fail "casblk list shows $(listed "$dev") bytes for $dev, not $new"
    resize2fs "$dev" >"$SCRATCH/resize2fs.txt" 2>&1 || fail "online resize2fs failed: $(cat "$SCRATCH/resize2fs.txt")"
    [ "$(fs_blocks)" -gt $((before + (80 << 20))) ] || fail "ext4 is $(fs_blocks) bytes after resize2fs (was $before)"
    note "online: $dev shows $new bytes, ext4 mounted grew from $before to $(fs_blocks) bytes"
    fill_past_old
    (cd "$mnt" && sha256sum --quiet -c <<<"$sums") || fail "files differ after the online grow"
    umount "$mnt"
    "$CASBLK" del -n "$(dev_id "$dev")"
else
    refused "Linux 6.16 or later" "growing the attached image on $(uname -r)" vm "$new"
    [ "$(shows "$dev")" -eq "$old" ] || fail "$dev changed size after a refused grow: $(shows "$dev")"
    [ "$(image_size vm)" -eq "$old" ] || fail "image vm is $(image_size vm) bytes after a refused grow"
    umount "$mnt"
    "$CASBLK" del -n "$(dev_id "$dev")"
    "$CASBLK" --store "$store" image resize vm "$new" >/dev/null || fail "growing the detached image failed"
    dev=$(add_image "$store" vm)
    [ "$(shows "$dev")" -eq "$new" ] || fail "the next device shows $(shows "$dev") bytes, not $new"
    e2fsck -f -p "$dev" >/dev/null || fail "e2fsck before the offline resize2fs failed"
    resize2fs "$dev" >"$SCRATCH/resize2fs.txt" 2>&1 || fail "resize2fs failed: $(cat "$SCRATCH/resize2fs.txt")"
    mount "$dev" "$mnt"
    [ "$(fs_blocks)" -gt $((before + (80 << 20))) ] || fail "ext4 is $(fs_blocks) bytes after resize2fs (was $before)"
    note "offline: the next device shows $new bytes, ext4 grew from $before to $(fs_blocks) bytes"
    fill_past_old
    umount "$mnt"
    "$CASBLK" del -n "$(dev_id "$dev")"
fi
[ "$(image_size vm@s)" -eq "$old" ] || fail "the snapshot is $(image_size vm@s) bytes after the grow, not $old"

# After del and add, from the store alone.
wait_no_devices
dev=$(add_image "$store" vm)
[ "$(shows "$dev")" -eq "$new" ] || fail "re-added, $dev shows $(shows "$dev") bytes, not $new"
mount -o ro "$dev" "$mnt"
(cd "$mnt" && sha256sum --quiet -c <<<"$sums") || fail "files differ after del and add"
umount "$mnt"

# Shrinking: refused while attached; detached, with --shrink, after the
# filesystem shrank, the image keeps the prefix the filesystem uses and GC
# frees the chunks only the dropped bytes held (b's: the snapshot is older).
small=$((48 << 20))
refused "detached" "shrinking an attached image" vm "$small" --shrink
mount "$dev" "$mnt"
rm "$mnt/b"
umount "$mnt"
e2fsck -f -p "$dev" >/dev/null || fail "e2fsck before the shrink failed"
resize2fs "$dev" "$((small >> 10))K" >"$SCRATCH/resize2fs.txt" 2>&1 || fail "shrinking ext4 failed: $(cat "$SCRATCH/resize2fs.txt")"
"$CASBLK" del -n "$(dev_id "$dev")"
wait_no_devices
out=$("$CASBLK" --store "$store" image resize vm "$small" --shrink) || fail "the shrink of the detached image failed"
note "$out"
[ "$(image_size vm)" -eq "$small" ] || fail "image vm is $(image_size vm) bytes after the shrink, not $small"
reclaimed=$("$CASBLK" --store "$store" gc --json | python3 -c "import json,sys; print(json.load(sys.stdin)['bytes_reclaimed'])")
[ "$reclaimed" -gt 0 ] || fail "GC reclaimed $reclaimed bytes after the shrink"
dev=$(add_image "$store" vm)
[ "$(shows "$dev")" -eq "$small" ] || fail "the shrunk image's device shows $(shows "$dev") bytes, not $small"
mount -o ro "$dev" "$mnt"
(cd "$mnt" && sha256sum --quiet -c <<<"$(grep ' a$' <<<"$sums")") || fail "a differs after the shrink"
umount "$mnt"
note "shrunk: ext4 to 48 MiB, then the image (--shrink, detached): a reads back, GC reclaimed $reclaimed bytes"
"$CASBLK" del -n "$(dev_id "$dev")"
wait_no_devices
sum=$(fsck_clean "$store") || exit 1
note "$sum"
