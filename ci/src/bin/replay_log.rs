//! Reads a dm-log-writes log and replays a prefix of it onto a file: the
//! power-cut test's tool (`ci/e2e/t-cas-powercut.sh`).
//!
//! ```text
//! replay_log LOG list                    one line per entry: index kind sector sectors [mark]
//! replay_log LOG replay TARGET FROM TO   apply entries FROM..TO (TO exclusive) to TARGET
//! ```
//!
//! The log's layout (the kernel's Documentation/admin-guide/device-mapper/
//! log-writes.rst): a super block at byte 0 (magic, version, entry count,
//! block size), then from byte `block` on, per entry one block holding the
//! entry (sector, sectors, flags, data length, all u64 LE; a mark's name
//! follows it), then `sectors` blocks of data (none for discards and
//! marks). Sectors count in the logged device's logical blocks. Entries are
//! in the order writes reached the device's stable storage, so the state
//! after any prefix is one a power cut could have left.
//!
//! Replay writes data where the entry says and zeros where a discard was
//! (a discarded range reads as anything; zeros is one such thing). Bad
//! input gets one line on stderr and exit status 2.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::process::ExitCode;

const MAGIC: u64 = 0x006a_7366_7773_6872;
const FLAG_FLUSH: u64 = 1 << 0;
const FLAG_FUA: u64 = 1 << 1;
const FLAG_DISCARD: u64 = 1 << 2;
const FLAG_MARK: u64 = 1 << 3;
/// The largest write replayed in one piece (bigger entries are split).
const COPY_BYTES: u64 = 1 << 20;

/// One logged entry and where its data starts in the log.
struct Entry {
    sector: u64,
    sectors: u64,
    flags: u64,
    mark: Option<String>,
    data_at: u64,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads the super block and every entry header.
fn entries(log: &File) -> Result<(u64, Vec<Entry>), String> {
    let mut sup = [0u8; 28];
    log.read_exact_at(&mut sup, 0).map_err(|e| format!("reading the log's super block: {e}"))?;
    if u64_at(&sup, 0) != MAGIC {
        return Err("not a dm-log-writes log (bad magic)".into());
    }
    let version = u64_at(&sup, 8);
    if version != 1 {
        return Err(format!("dm-log-writes log version {version}; this tool reads version 1"));
    }
    let count = u64_at(&sup, 16);
    let block = u64::from(u32::from_le_bytes(sup[24..28].try_into().expect("4 bytes")));
    if !block.is_power_of_two() || !(512..=65536).contains(&block) {
        return Err(format!("block size {block} in the super block is not a device block size"));
    }
    let len = log.metadata().map_err(|e| e.to_string())?.len();
    let len = if len == 0 { u64::MAX } else { len };
    let mut out = Vec::new();
    let mut at = block;
    let mut head = vec![0u8; block as usize];
    for i in 0..count {
        if at.saturating_add(block) > len {
            return Err(format!("entry {i} of {count} starts at byte {at}, past the log's end"));
        }
        log.read_exact_at(&mut head, at).map_err(|e| format!("reading entry {i} at byte {at}: {e}"))?;
        let (sector, sectors, flags, data_len) =
            (u64_at(&head, 0), u64_at(&head, 8), u64_at(&head, 16), u64_at(&head, 24));
        let mark = (flags & FLAG_MARK != 0).then(|| {
            let n = (data_len as usize).min(block as usize - 32);
            String::from_utf8_lossy(&head[32..32 + n]).into_owned()
        });
        let data_at = at + block;
        at = data_at;
        if flags & (FLAG_DISCARD | FLAG_MARK) == 0 {
            at = sectors
                .checked_mul(block)
                .and_then(|b| at.checked_add(b))
                .ok_or_else(|| format!("entry {i} claims {sectors} blocks"))?;
        }
        out.push(Entry { sector, sectors, flags, mark, data_at });
    }
    Ok((block, out))
}

fn kind(e: &Entry) -> String {
    let mut k = Vec::new();
    for (flag, name) in
        [(FLAG_MARK, "mark"), (FLAG_DISCARD, "discard"), (FLAG_FLUSH, "flush"), (FLAG_FUA, "fua")]
    {
        if e.flags & flag != 0 {
            k.push(name);
        }
    }
    if k.is_empty() || (e.sectors > 0 && e.flags & (FLAG_DISCARD | FLAG_MARK) == 0) {
        k.insert(0, "write");
    }
    k.join("+")
}

fn replay(
    log: &File,
    block: u64,
    list: &[Entry],
    target: &File,
    from: usize,
    to: usize,
) -> Result<(), String> {
    let mut buf = vec![0u8; COPY_BYTES as usize];
    for (i, e) in list.iter().enumerate().take(to).skip(from) {
        if e.flags & FLAG_MARK != 0 || e.sectors == 0 {
            continue;
        }
        let bytes = e.sectors * block;
        let dst = e.sector * block;
        let mut done = 0;
        while done < bytes {
            let n = (bytes - done).min(COPY_BYTES) as usize;
            if e.flags & FLAG_DISCARD != 0 {
                buf[..n].fill(0);
            } else {
                log.read_exact_at(&mut buf[..n], e.data_at + done)
                    .map_err(|err| format!("reading entry {i}'s data: {err}"))?;
            }
            target.write_all_at(&buf[..n], dst + done).map_err(|err| format!("writing entry {i}: {err}"))?;
            done += n as u64;
        }
    }
    target.sync_data().map_err(|e| format!("syncing the target: {e}"))
}

fn run(args: &[String]) -> Result<(), String> {
    let usage = "usage: replay_log LOG list | replay_log LOG replay TARGET FROM TO";
    let log_path = args.first().ok_or(usage)?;
    let log = File::open(log_path).map_err(|e| format!("{log_path}: {e}"))?;
    let (block, list) = entries(&log)?;
    match args.get(1).map(String::as_str) {
        Some("list") => {
            for (i, e) in list.iter().enumerate() {
                let mark = e.mark.as_deref().map_or(String::new(), |m| format!(" {m}"));
                println!("{i} {} {} {}{mark}", kind(e), e.sector, e.sectors);
            }
            Ok(())
        }
        Some("replay") => {
            let [target, from, to] = &args[2..] else { return Err(usage.into()) };
            let parse = |s: &str| s.parse::<usize>().map_err(|_| format!("{s:?} is not an entry index"));
            let (from, to) = (parse(from)?, parse(to)?);
            if from > to || to > list.len() {
                return Err(format!("entries {from}..{to} are not within the log's {} entries", list.len()));
            }
            let t =
                std::fs::OpenOptions::new().write(true).open(target).map_err(|e| format!("{target}: {e}"))?;
            replay(&log, block, &list, &t, from, to)
        }
        _ => Err(usage.into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replay_log: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log as dm-log-writes lays it out, block size 512: a write of two
    /// blocks, a mark, a discard of one block, a flush.
    fn sample_log() -> Vec<u8> {
        let block = 512usize;
        let mut log = vec![0u8; block];
        log[..8].copy_from_slice(&MAGIC.to_le_bytes());
        log[8..16].copy_from_slice(&1u64.to_le_bytes());
        log[16..24].copy_from_slice(&4u64.to_le_bytes());
        log[24..28].copy_from_slice(&512u32.to_le_bytes());
        let mut entry = |sector: u64, sectors: u64, flags: u64, extra: &[u8], data: &[u8]| {
            let mut b = vec![0u8; block];
            b[..8].copy_from_slice(&sector.to_le_bytes());
            b[8..16].copy_from_slice(&sectors.to_le_bytes());
            b[16..24].copy_from_slice(&flags.to_le_bytes());
            b[24..32].copy_from_slice(&(extra.len() as u64).to_le_bytes());
            b[32..32 + extra.len()].copy_from_slice(extra);
            log.extend_from_slice(&b);
            log.extend_from_slice(data);
        };
        entry(2, 2, 0, &[], &[7u8; 1024]);
        entry(0, 0, FLAG_MARK, b"one", &[]);
        entry(3, 1, FLAG_DISCARD, &[], &[]);
        entry(0, 0, FLAG_FLUSH, &[], &[]);
        log
    }

    #[test]
    fn lists_and_replays_prefixes() {
        let dir = std::env::temp_dir().join(format!("replay-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (log_path, target_path) = (dir.join("log"), dir.join("target"));
        std::fs::write(&log_path, sample_log()).unwrap();
        std::fs::write(&target_path, vec![1u8; 4096]).unwrap();
        let log = File::open(&log_path).unwrap();
        let (block, list) = entries(&log).unwrap();
        assert_eq!(block, 512);
        let kinds: Vec<String> = list.iter().map(kind).collect();
        assert_eq!(kinds, ["write", "mark", "discard", "flush"]);
        assert_eq!(list[1].mark.as_deref(), Some("one"));
        let target = std::fs::OpenOptions::new().write(true).open(&target_path).unwrap();
        replay(&log, block, &list, &target, 0, 2).unwrap();
        let got = std::fs::read(&target_path).unwrap();
        assert!(got[..1024].iter().all(|&b| b == 1) && got[1024..2048].iter().all(|&b| b == 7));
        replay(&log, block, &list, &target, 2, 4).unwrap();
        let got = std::fs::read(&target_path).unwrap();
        assert!(got[1536..2048].iter().all(|&b| b == 0), "the discard reads as zeros");
        assert!(got[1024..1536].iter().all(|&b| b == 7) && got[2048..].iter().all(|&b| b == 1));
        let mut bad = sample_log();
        bad[0] ^= 1;
        std::fs::write(&log_path, bad).unwrap();
        assert!(entries(&File::open(&log_path).unwrap()).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
