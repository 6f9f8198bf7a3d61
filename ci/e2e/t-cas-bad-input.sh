# Bad input to the store commands: one line of error, non-zero exit, no
# panic, no leaked device.
source "$(dirname "$0")/lib.sh"
store=$(new_store vm 64M)
expect_error "attach a missing image" "$CASBLK" --store "$store" add --image nope
expect_error "attach from a missing store" "$CASBLK" --store "$SCRATCH/none" add --image vm
expect_error "image name with a slash" "$CASBLK" --store "$store" image create a/b --size 1M
expect_error "image name .." "$CASBLK" --store "$store" image create .. --size 1M
expect_error "image name with a space" "$CASBLK" --store "$store" image create "a b" --size 1M
expect_error "image name with a glob" "$CASBLK" --store "$store" image create "a*" --size 1M
expect_error "image name with a backslash" "$CASBLK" --store "$store" image create 'a\b' --size 1M
expect_error "image name not ASCII" "$CASBLK" --store "$store" image create "ünï" --size 1M
expect_error "image name like an option" "$CASBLK" --store "$store" image create --size 1M -- -x
expect_error "image name of 129 bytes" "$CASBLK" --store "$store" image create "$(printf 'x%.0s' $(seq 129))" --size 1M
"$CASBLK" --store "$store" image create "tenant:vm_1.a-b" --size 1M >/dev/null || fail "a portable name was refused"
"$CASBLK" --store "$store" image rm "tenant:vm_1.a-b" || fail "a portable name could not be removed"
expect_error "image size zero" "$CASBLK" --store "$store" image create z --size 0
expect_error "image size not a size" "$CASBLK" --store "$store" image create z --size lots
expect_error "image size not 4 KiB aligned" "$CASBLK" --store "$store" image create z --size 1000
expect_error "duplicate image" "$CASBLK" --store "$store" image create vm --size 1M
expect_error "remove a missing image" "$CASBLK" --store "$store" image rm nope
expect_error "stats with no daemon" "$CASBLK" --store "$store" stats
expect_error "log quota below two segments" "$CASBLK" --store "$store" add --image vm --log-quota 1M
expect_error "memory budget too small" "$CASBLK" --store "$store" add --image vm --memory-budget 16M
expect_error "compaction threads out of range" "$CASBLK" --store "$store" add --image vm --compaction-threads 4
expect_error "unknown background CPU class" "$CASBLK" --store "$store" add --image vm --background-cpu fast
expect_error "chunk cache not a size" "$CASBLK" --store "$store" add --image vm --chunk-cache big
# 2 x 128 x 1 MiB = 256 MiB of tag buffers; a 160 MiB budget leaves 32 MiB beside compaction.
expect_error "tag buffers beyond the memory budget" "$CASBLK" --store "$store" add --image vm -q 2 -d 128 \
    --io-buf-bytes 1048576 --memory-budget 160M
out=$("$CASBLK" --store "$store" add --image vm -q 2 -d 128 --io-buf-bytes 1048576 --memory-budget 160M 2>&1 || true)
case "$out" in *"268435456 bytes"*"memory budget of 167772160 bytes"*) ;; *) fail "the buffer refusal does not name the figures: $out" ;; esac
wait_no_devices
expect_error "store settings in raw mode" "$CASBLK" add --backing "$(new_backing 16M)" --chunk-cache 1M
dev=$(add_image "$store" vm)
expect_error "attach an attached image" "$CASBLK" --store "$store" add --image vm
expect_error "remove an attached image" "$CASBLK" --store "$store" image rm vm
expect_error "stats for an unknown device" "$CASBLK" stats -n 9
printf 'this is not json\n' | python3 -c "
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(sys.stdin.buffer.read())
reply = s.makefile().readline(); assert 'error' in reply, reply; print('malformed request ->', reply.strip())
" "$(ls /run/casblk/store-*.sock)" || fail "malformed socket request did not get an error reply"
dd if=/dev/urandom of="$dev" bs=4k count=8 oflag=direct status=none || fail "IO disturbed by a malformed stats request"
"$CASBLK" del -a
wait_no_devices
cp "$store/STORE" "$SCRATCH/STORE.good"
python3 - "$store/STORE" <<'PY'
import struct, sys
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
body = b"CASSTORE" + struct.pack("<II", 1000, 0)   # a store from a far newer casblk
open(sys.argv[1], "wb").write(body + struct.pack("<I", crc32c(body)))
PY
expect_error "store from a newer version" "$CASBLK" --store "$store" image list
out=$("$CASBLK" --store "$store" image list 2>&1 || true)
case "$out" in *"upgrade casblk"*) ;; *) fail "newer-version error does not say to upgrade: $out" ;; esac
echo x > "$store/STORE"
expect_error "corrupt store file" "$CASBLK" --store "$store" image list
cp "$SCRATCH/STORE.good" "$store/STORE"
"$CASBLK" --store "$store" image list >/dev/null || fail "the restored store does not open"
