# fio with verify=crc32c through a store image: random mixed sizes with
# periodic fsync (FLUSH), then O_DSYNC writes (FUA), then writes of up to
# 512 KiB, then a verify-only pass after detaching and reattaching. First
# `casblk features` is checked against the driver and the device.
# e2e-7.3  (also run on the 7.3 kernel: the smoke group)
source "$(dirname "$0")/lib.sh"
store=$(new_store vm 256M)
dev=$(add_image "$store" vm -q 2 -d 32)
cd "$SCRATCH"
# `casblk features` against this driver and this device (lib.sh): among
# others, where the driver offers user copy the device has it, so the
# daemon moves request data through the char device itself (every run
# below).
check_features "$dev"
run_fio() {
    local name=$1; shift
    fio --name="$name" --filename="$dev" --ioengine=io_uring --direct=1 --verify=crc32c \
        --verify_fatal=1 --verify_state_save=0 --output="$SCRATCH/$name.txt" "$@" \
        || { cat "$SCRATCH/$name.txt"; fail "fio $name failed"; }
    grep -q "err= 0" "$SCRATCH/$name.txt" || { cat "$SCRATCH/$name.txt"; fail "fio $name reported an error"; }
}
run_fio rand --rw=randwrite --bsrange=4k-64k --size=48M --iodepth=16 --fsync=32 --do_verify=1 --randseed=7
note "random writes with fsync + verify: ok"
run_fio fua --rw=write --bs=16k --size=16M --offset=64M --iodepth=4 --sync=dsync --do_verify=1
note "O_DSYNC (FUA) writes + verify: ok"
# Writes past the 64 KiB an io buffer keeps resident (with user copy the
# serving thread's staging buffer, without it the tag's): the buffer's tail
# is handed back to the kernel after each one, then refilled by the next
# request that buffer serves.
run_fio big --rw=randwrite --bsrange=64k-512k --size=64M --offset=96M --iodepth=32 --do_verify=1 --randseed=11
note "large writes (io buffers released after each) + verify: ok"
"$CASBLK" del -a
wait_no_devices
dev=$(add_image "$store" vm)
run_fio rand --rw=randwrite --bsrange=4k-64k --size=48M --iodepth=16 --randseed=7 --verify_only
run_fio big --rw=randwrite --bsrange=64k-512k --size=64M --offset=96M --iodepth=32 --randseed=11 --verify_only
note "verify-only after reattach: ok"
"$CASBLK" del -a
wait_no_devices
