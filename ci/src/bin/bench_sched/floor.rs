//! The interference floor: what the mixed arm's write load costs a reader
//! that does no I/O at all, measured in the same run.
//!
//! A read in place normally goes to the engine (manifest, chunk cache,
//! pack file through the page cache). The floor arms replace exactly that
//! call with [`spin`]: register arithmetic calibrated to take as long as an
//! engine read on this machine, touching no memory and making no system
//! call. Everything else (the closed loop, the scheduler, tracing, the
//! writers, compaction) is unchanged. Whatever the spinning reader's p99
//! loses between `floor_read_only` and `floor_mixed` is not the engine's
//! doing: interrupts, IPIs and CPU time on the reader's core. On a machine
//! with spare cores it is close to 1.0x; on a small VM it bounds from below
//! the ratio the engine's reads can reach.

use std::hint::black_box;
use std::time::Instant;

use cas::Image;
use casblk_ci::frontend::{block_pattern, Stream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sched::Op;
use serve::{DeviceCore, HeapBuffers};

/// Engine reads timed for the calibration.
const CALIBRATION_READS: u64 = 200_000;
/// Spin rounds timed for the calibration.
const CALIBRATION_ROUNDS: u64 = 20_000_000;

/// `rounds` steps of a dependent multiply-add chain: CPU time only.
pub fn spin(rounds: u64) {
    let mut x = black_box(0x9e37_79b9_7f4a_7c15u64);
    for i in 0..rounds {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i);
    }
    black_box(x);
}

/// Sets up a read stream's device to [`spin`] `rounds` in place of each
/// engine read in place (and to answer with the seeded pattern, so reads
/// still verify); other streams' devices are left as they are.
pub fn spin_reads(rounds: u64) -> impl Fn(&Stream, &mut DeviceCore<HeapBuffers>) {
    move |s, core| {
        if s.op == Op::Read {
            core.read_stand_in = Some(Box::new(move |offset, buf| {
                spin(rounds);
                buf[..8].copy_from_slice(&block_pattern(offset));
                Ok(true)
            }));
        }
    }
}

/// How long an engine read takes here, and the spin that takes as long.
#[derive(Clone, Copy, Debug)]
pub struct Calibration {
    pub read_ns: f64,
    pub spin_rounds: u64,
}

/// Times reads in place of 4 KiB blocks of `image` (below `span_bytes`,
/// already compacted) on this thread, then the spin.
pub fn calibrate(image: &Image, span_bytes: u64) -> Calibration {
    let mut rng = StdRng::seed_from_u64(0xf100);
    let mut buf = vec![0u8; 4096];
    let blocks = span_bytes / 4096;
    let t = Instant::now();
    for _ in 0..CALIBRATION_READS {
        let offset = rng.gen_range(0..blocks) * 4096;
        // A read that would wait for the device counts its time all the same.
        image.read_nowait(offset, &mut buf).expect("a calibration read");
    }
    let read_ns = t.elapsed().as_nanos() as f64 / CALIBRATION_READS as f64;
    let t = Instant::now();
    spin(CALIBRATION_ROUNDS);
    let round_ns = t.elapsed().as_nanos() as f64 / CALIBRATION_ROUNDS as f64;
    Calibration { read_ns, spin_rounds: (read_ns / round_ns).round().max(1.0) as u64 }
}
