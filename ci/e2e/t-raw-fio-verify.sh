# fio writes with verify=crc32c through a raw-mode device: random mixed
# sizes with FUA-less writes, then a sequential pass with periodic fsync.
source "$(dirname "$0")/lib.sh"
backing=$(new_backing 256M)
dev=$(add_raw "$backing" -q 2 -d 32)
cd "$SCRATCH"
fio --name=randverify --filename="$dev" --rw=randwrite --bsrange=4k-128k --size=96M \
    --ioengine=io_uring --iodepth=16 --direct=1 --verify=crc32c --do_verify=1 \
    --verify_fatal=1 --verify_state_save=0 --randrepeat=0 --output="$SCRATCH/fio1.txt" \
    || { cat "$SCRATCH/fio1.txt"; fail "fio random verify failed"; }
grep -q "err= 0" "$SCRATCH/fio1.txt" || { cat "$SCRATCH/fio1.txt"; fail "fio reported an error"; }
note "random write + crc32c verify: ok"
fio --name=seqverify --filename="$dev" --rw=write --bs=1M --size=128M --offset=128M \
    --ioengine=io_uring --iodepth=8 --direct=1 --fsync=8 --verify=crc32c --do_verify=1 \
    --verify_fatal=1 --verify_state_save=0 --output="$SCRATCH/fio2.txt" \
    || { cat "$SCRATCH/fio2.txt"; fail "fio sequential verify failed"; }
note "sequential write with fsync + crc32c verify: ok"
"$CASBLK" del -a
assert_no_devices
