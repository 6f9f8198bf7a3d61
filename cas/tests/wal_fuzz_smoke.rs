//! Stable-toolchain smoke run of the WAL decoder fuzz target: feeds
//! `cas::wal::fuzz_decode` (the body of `fuzz/fuzz_targets/wal_record.rs`)
//! a few hundred thousand seeded random and mutated inputs. It must never
//! panic. `CAS_FUZZ_ITERS` scales the count (default 300000).

use cas::wal::{fuzz_decode, RecordHeader, RecordKind, SegmentHeader};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn valid_record(rng: &mut StdRng) -> Vec<u8> {
    let seq = rng.gen_range(1..1000u64);
    let durable = rng.gen_range(0..seq);
    let offset = rng.gen_range(0..1u64 << 20) * 512;
    let h = match rng.gen_range(0..4) {
        0 => RecordHeader::range(RecordKind::WriteZeroes, seq, durable, offset, rng.gen_range(1..64) * 512),
        1 => RecordHeader::range(RecordKind::Discard, seq, durable, offset, rng.gen_range(1..64) * 512),
        2 => RecordHeader::pad(seq, durable, 64 * rng.gen_range(1..20)),
        _ => RecordHeader::write(seq, durable, offset, 512 * rng.gen_range(1..4)),
    };
    let payload: Vec<u8> = (0..h.payload_bytes()).map(|_| rng.gen()).collect();
    let mut v = h.encode(&payload).to_vec();
    v.extend_from_slice(&payload);
    v
}

fn valid_segment(rng: &mut StdRng) -> Vec<u8> {
    let first = rng.gen_range(1..100u64);
    let mut v = SegmentHeader { index: 1, segment_bytes: 1 << 20, first_seq: first, log_id: rng.gen() }
        .encode()
        .to_vec();
    // Records with consecutive seqs, as a real segment holds.
    for seq in first..first + rng.gen_range(0..5) {
        let payload = vec![seq as u8; 512 * rng.gen_range(1..3)];
        let h = RecordHeader::write(seq, seq - 1, 0, payload.len());
        v.extend_from_slice(&h.encode(&payload));
        v.extend_from_slice(&payload);
    }
    v
}

fn mutate(rng: &mut StdRng, v: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(0..4) {
        match rng.gen_range(0..5) {
            0 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !v.is_empty() => {
                let n = rng.gen_range(0..v.len());
                v.truncate(n);
            }
            2 => v.extend((0..rng.gen_range(0..128)).map(|_| rng.gen::<u8>())),
            3 if v.len() > 16 => {
                let i = rng.gen_range(0..v.len() - 8);
                v[i..i + 8].copy_from_slice(&rng.gen::<u64>().to_le_bytes());
            }
            _ => {}
        }
    }
}

#[test]
fn wal_decoders_never_panic() {
    let iters: u64 = std::env::var("CAS_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(300_000);
    let mut rng = StdRng::seed_from_u64(0xF0225);
    let mut decoded = 0u64;
    for i in 0..iters {
        let mut input = match i % 4 {
            0 => (0..rng.gen_range(0..700)).map(|_| rng.gen::<u8>()).collect(),
            1 => valid_segment(&mut rng),
            _ => valid_record(&mut rng),
        };
        mutate(&mut rng, &mut input);
        decoded += u64::from(cas::wal::record::decode(&input).is_ok());
        if let Err(p) = std::panic::catch_unwind(|| fuzz_decode(&input)) {
            panic!("fuzz_decode panicked on input {i} ({:02x?}): {p:?}", input);
        }
    }
    // Mutations must leave plenty of valid records, or the run tests
    // little beyond the magic check.
    assert!(decoded > iters / 10, "only {decoded} of {iters} inputs decoded");
}
