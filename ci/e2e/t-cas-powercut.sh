# Power cut: every write the store's filesystem makes is recorded with
# dm-log-writes while a CAS device takes writes and FLUSHes, with
# compaction, reclamation and GC running. The log is then replayed onto a
# scratch copy up to every FLUSH mark and to random points between marks
# (a prefix of the log is a state a power cut could have left). At each
# point the store's filesystem mounts, `casblk fsck` finds nothing but
# what an open cleans up, the store opens (`casblk image export`), every
# write flushed before the point reads back (a sector written in the round
# in flight reads as before or as one of that round's writes), and after
# the open fsck is clean.
#
#   E2E_POWERCUT_POINTS   replay points (default 8: one at each of the 6 marks, 2 between them; the long mode uses 240)
#   E2E_POWERCUT_ROUNDS   write + FLUSH rounds recorded (default 5)
source "$(dirname "$0")/lib.sh"
modprobe -a loop dm-log-writes 2>/dev/null || true
export DM_DISABLE_UDEV=1
replay=$(dirname "$CASBLK")/replay_log
[ -x "$replay" ] || fail "no $replay: build it with cargo build --release -p casblk-ci --bin replay_log"
points=${E2E_POWERCUT_POINTS:-8}
rounds=${E2E_POWERCUT_ROUNDS:-5}
dm=casblk-lw-$$
mib=$((1 << 20))
image_mib=32
truncate -s 160M "$SCRATCH/store.img"
truncate -s 1536M "$SCRATCH/log.img"
sdev=$(losetup -f --show "$SCRATCH/store.img")
ldev=$(losetup -f --show "$SCRATCH/log.img")
cleanup() {
    "$CASBLK" del -a >/dev/null 2>&1 || true
    umount -l "$SCRATCH/fs" 2>/dev/null || true
    dmsetup remove --noudevsync "$dm" 2>/dev/null || true
    losetup -d "$sdev" "$ldev" 2>/dev/null || true
    losetup -j "$SCRATCH/work.img" 2>/dev/null | cut -d: -f1 | xargs -r losetup -d 2>/dev/null || true
}
trap cleanup EXIT
dmsetup create "$dm" --noudevsync --table "0 $(blockdev --getsz "$sdev") log-writes $sdev $ldev" \
    || fail "creating the dm-log-writes target failed"
dmsetup mknodes "$dm"
mark() { dmsetup message "$dm" 0 mark "$1" || fail "marking $1 in the log failed"; }

mkfs.ext4 -q -F -E nodiscard "/dev/mapper/$dm"
mkdir -p "$SCRATCH/fs" && mount "/dev/mapper/$dm" "$SCRATCH/fs"
store=$SCRATCH/fs/store
"$CASBLK" --store "$store" image create vm --size ${image_mib}M >/dev/null
# A small log quota and a 1 s compaction interval: compaction and log
# reclamation run all through the rounds.
dev=$(add_image "$store" vm --log-quota 16M)
sync "$dev"
mark created
head -c $((image_mib * mib)) /dev/zero >"$SCRATCH/expect"
cp "$SCRATCH/expect" "$SCRATCH/expect.0"
: >"$SCRATCH/ranges.0"

# Round r: three 512 KiB writes at random 4 KiB-aligned offsets (one of
# them a copy of earlier data, so chunks are shared), a FLUSH, then the
# mark flush<r>. expect.<r> is what every point after the mark must hold;
# ranges.<r> lists what round r wrote (in flight before its mark): offset,
# length and the file holding the data (w.<r>.<w>). Writes of one round
# may overlap, so a block in flight may hold any of them.
for r in $(seq 1 "$rounds"); do
    : >"$SCRATCH/ranges.$r"
    for w in 1 2 3; do
        off=$(( (RANDOM * 32768 + RANDOM) % (image_mib * 256 - 128) * 4096 ))
        if [ "$w" -eq 3 ] && [ "$r" -gt 1 ]; then
            dd if="$SCRATCH/expect" of="$SCRATCH/w" bs=4096 skip=$(( (RANDOM % (image_mib * 256 - 128)) )) \
                count=128 status=none
        else
            head -c $((512 * 1024)) /dev/urandom >"$SCRATCH/w"
        fi
        dd if="$SCRATCH/w" of="$dev" bs=4096 seek=$((off / 4096)) oflag=direct status=none
        dd if="$SCRATCH/w" of="$SCRATCH/expect" bs=4096 seek=$((off / 4096)) conv=notrunc status=none
        mv "$SCRATCH/w" "$SCRATCH/w.$r.$w"
        echo "$off $((512 * 1024)) $SCRATCH/w.$r.$w" >>"$SCRATCH/ranges.$r"
    done
    sync "$dev"
    mark "flush$r"
    cp "$SCRATCH/expect" "$SCRATCH/expect.$r"
    [ $((r % 2)) -eq 0 ] && wait_compacted "$store"
    [ $((r % 3)) -eq 0 ] && { "$CASBLK" --store "$store" gc >/dev/null || fail "gc during the rounds failed"; }
done
"$CASBLK" del -a
umount "$SCRATCH/fs"
dmsetup remove --noudevsync "$dm"
losetup -d "$sdev" "$ldev"

"$replay" "$SCRATCH/log.img" list >"$SCRATCH/entries" || fail "the log did not read"
note "log: $(wc -l <"$SCRATCH/entries") entries, $(grep -c ' mark ' "$SCRATCH/entries") marks, $(grep -c flush "$SCRATCH/entries") flush entries"
# One driver for every point (a Python start per step is slow under
# emulation). Points: every flush mark (the state just before it) and
# random entries after "created", $points in all. At each: replay the log
# up to it onto a zeroed file, mount a copy, fsck (only repairable
# findings allowed), export the image (this opens the store) and compare,
# fsck again (clean), unmount.
truncate -s 160M "$SCRATCH/replay.img"
python3 - "$SCRATCH" "$points" "$rounds" "$replay" "$CASBLK" "$store" <<'PY' || fail "power-cut replay failed (above)"
import json, random, subprocess, sys
d, want, rounds, replay, casblk, store = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]
def sh(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return r
marks = {}
for line in open(f"{d}/entries"):
    f = line.split()
    if len(f) >= 5 and f[1] == "mark":
        marks[f[4]] = int(f[0])
start = marks["created"]
flush = [marks[f"flush{r}"] for r in range(1, rounds + 1)]
chosen = {start + 1} | {m + 1 for m in flush}
random.seed(want)
pool = [i for i in range(start + 2, flush[-1] + 1) if i not in chosen]
chosen |= set(random.sample(pool, max(0, min(len(pool), want - len(chosen)))))
expect = {r: open(f"{d}/expect.{r}", "rb").read() for r in range(rounds + 1)}
def writes(r):
    out = []
    for line in open(f"{d}/ranges.{r}"):
        off, n, path = line.split()
        out.append((int(off), int(n), open(path, "rb").read()))
    return out
ranges = {r: writes(r) for r in range(rounds + 1)}
at, tried, repaired = 0, 0, 0
for p in sorted(chosen):
    done = sum(1 for m in flush if m < p)
    sh(replay, f"{d}/log.img", "replay", f"{d}/replay.img", str(at), str(p))
    at = p
    sh("cp", "--sparse=always", f"{d}/replay.img", f"{d}/work.img")
    dev = sh("losetup", "-f", "--show", f"{d}/work.img").stdout.strip()
    try:
        if sh("mount", dev, f"{d}/fs", check=False).returncode != 0:
            sys.exit(f"point {p}: the store's filesystem does not mount")
        r = sh(casblk, "--store", store, "fsck", "--json", check=False)
        if r.returncode not in (0, 1):
            sys.exit(f"point {p}: fsck could not run (exit {r.returncode}): {r.stderr.strip()}")
        rep = json.loads(r.stdout)
        bad = [f for f in rep["problems"] if f["repair"] is None]
        if bad or rep["problems_unlisted"]:
            for f in bad:
                print(f"  {f['kind']}: {f['path']} at {f['offset']}: {f['detail']}")
            sys.exit(f"point {p}: fsck found damage an open does not repair")
        repaired += r.returncode == 1
        r = sh(casblk, "--store", store, "image", "export", "vm", f"{d}/back", check=False)
        if r.returncode != 0:
            sys.exit(f"point {p} (after round {done}): the store does not open: {r.stderr.strip()}")
        back = open(f"{d}/back", "rb").read()
        old = expect[done]
        flight = ranges.get(done + 1, [])
        for b in range(0, len(old), 4096):
            got = back[b:b + 4096]
            if got == old[b:b + 4096]:
                continue
            # In flight: any write of the next round that covers the block,
            # sector by sector (a write split across two log records may be
            # half durable; a record is whole or absent).
            cover = [data[b - o:b - o + 4096] for o, n, data in flight if o <= b < o + n]
            if any(got == c for c in cover) or all(
                got[i:i + 512] in [old[b + i:b + i + 512]] + [c[i:i + 512] for c in cover]
                for i in range(0, 4096, 512)
            ):
                continue
            covering = [(o // 4096, n // 4096) for o, n, _ in flight if o <= b < o + n]
            older = [r for r in range(rounds + 1) if got == expect[r][b:b + 4096]]
            sys.exit(f"point {p}: block {b // 4096} is neither round {done}'s flushed data nor a write of round "
                     f"{done + 1} (writes of that round covering it: {covering}; rounds whose data it matches: "
                     f"{older}; zeros: {got == bytes(4096)})")
        r = sh(casblk, "--store", store, "fsck", check=False)
        if r.returncode != 0:
            sys.exit(f"point {p}: fsck after the open exited {r.returncode}:\n{r.stdout}{r.stderr}")
        last = r.stdout.strip().splitlines()[-1]
    finally:
        sh("umount", f"{d}/fs", check=False)
        sh("losetup", "-d", dev, check=False)
    tried += 1
    print(f"  point {p} (after round {done}): flushed data reads back, fsck clean", flush=True)
open(f"{d}/tried", "w").write(f"{tried} {repaired}\n{last}\n")
PY
read -r tried repairs <"$SCRATCH/tried"
sum=$(sed -n 2p "$SCRATCH/tried")
[ "$tried" -ge "$points" ] || fail "only $tried of the $points replay points asked for were tried (the log holds too few entries: record more rounds, E2E_POWERCUT_ROUNDS)"
tally powercut_points "$tried"
tally powercut_flush_marks "$rounds"
note "power-cut replay points tried: $tried ($rounds FLUSH marks and random points between); lost writes: 0; $repairs points left leftovers an open removed; last fsck: $sum"
