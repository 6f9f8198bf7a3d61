//! crc32c (Castagnoli) of long buffers by carry-less multiplication
//! (PCLMULQDQ folding, as in Gopal et al., "Fast CRC Computation for
//! Generic Polynomials Using PCLMULQDQ Instruction", Intel, 2009), with the
//! `crc32c` crate for short buffers, the last bytes, and CPUs without it.
//!
//! Why not the crate alone: it uses the SSE4.2 `crc32` instruction, and
//! emulators run that one bit by bit (QEMU's TCG helper: 64 shift-and-xor
//! steps per 8 bytes). In this project's test VM a 4 KiB check took about
//! 27 us that way and was 40% of a chunk read's time; a folded check costs
//! about one emulated multiply per 8 bytes. On hardware both run at a few
//! bytes per cycle.
//!
//! The fold: four 128-bit lanes take 64 bytes per step, each lane moved
//! 512 bits forward by two carry-less multiplies with constants
//! `x^(512±32) mod P` (bit-reflected, as every crc32c bit order is); the
//! lanes are then folded into one with `x^(128±32) mod P`, and those 16
//! bytes are the message's remainder: the crate's crc over them, then over
//! the bytes past the last whole 64, is the crc of the whole buffer.

#![allow(unsafe_code)] // x86 intrinsics, run only after their CPU features are detected

/// Buffers shorter than this go to the crate: folding has a fixed cost
/// (three lane merges and a 16-byte crc) that short buffers do not repay.
const FOLD_MIN_BYTES: usize = 256;

/// Continues crc32c `crc` (a finished value, as `crc32c::crc32c_append`
/// takes) over `bytes`.
pub fn append(crc: u32, bytes: &[u8]) -> u32 {
    if bytes.len() >= FOLD_MIN_BYTES {
        if let Some(crc) = folded(crc, bytes) {
            return crc;
        }
    }
    crc32c::crc32c_append(crc, bytes)
}

/// [`append`] by folding, for buffers of 64 bytes or more; `None` where
/// the CPU lacks the instructions.
fn folded(crc: u32, bytes: &[u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() >= 64
        && std::arch::is_x86_feature_detected!("pclmulqdq")
        && std::arch::is_x86_feature_detected!("sse4.1")
    {
        let whole = bytes.len() - bytes.len() % 64;
        // SAFETY: both features the function enables were detected above.
        let rest = unsafe { x86::fold(!crc, &bytes[..whole]) };
        return Some(crc32c::crc32c_append(crc32c::crc32c_append(!0, &rest), &bytes[whole..]));
    }
    let _ = (crc, bytes);
    None
}

/// The folding constants, `x^n mod P` bit-reflected and shifted left by
/// one (the reflected product of two 64-bit halves lands one bit low).
/// The test derives them from the polynomial.
const K1: i64 = 0x740e_ef02; // n = 4 * 128 + 32
const K2: i64 = 0x9e4a_ddf8; // n = 4 * 128 - 32
const K3: i64 = 0xf20c_0dfe; // n = 128 + 32
const K4: i64 = 0x1_4cd0_0bd6; // n = 128 - 32

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{K1, K2, K3, K4};
    use std::arch::x86_64::*;

    /// Folds `data` (a non-zero multiple of 64 bytes), with CRC register
    /// `register` xored into its first four bytes, into 16 bytes whose
    /// crc from a zero register equals the data's.
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    pub(super) fn fold(register: u32, data: &[u8]) -> [u8; 16] {
        // Once per call: chunks_exact would drop a tail silently.
        assert!(!data.is_empty() && data.len().is_multiple_of(64), "fold takes whole 64-byte blocks");
        // Whole 64-byte blocks, loaded by pointer: no bounds check or
        // iterator arithmetic per lane. Under emulation every instruction
        // costs, and the loop body is all there is (4 KiB: 63 rounds).
        let load4 = |block: &[u8]| -> [__m128i; 4] {
            assert_eq!(block.len(), 64);
            let p = block.as_ptr();
            // SAFETY: four unaligned 16-byte loads inside the 64 bytes
            // `block` borrows (its length is checked above).
            unsafe {
                [
                    _mm_loadu_si128(p.cast()),
                    _mm_loadu_si128(p.add(16).cast()),
                    _mm_loadu_si128(p.add(32).cast()),
                    _mm_loadu_si128(p.add(48).cast()),
                ]
            }
        };
        let k1k2 = _mm_set_epi64x(K2, K1);
        let mut blocks = data.chunks_exact(64);
        let mut x = load4(blocks.next().expect("at least 64 bytes"));
        x[0] = _mm_xor_si128(x[0], _mm_cvtsi32_si128(register as i32));
        for block in blocks {
            let y = load4(block);
            x = [
                merge(x[0], y[0], k1k2),
                merge(x[1], y[1], k1k2),
                merge(x[2], y[2], k1k2),
                merge(x[3], y[3], k1k2),
            ];
        }
        let k3k4 = _mm_set_epi64x(K4, K3);
        let one = merge(merge(merge(x[0], x[1], k3k4), x[2], k3k4), x[3], k3k4);
        let mut out = [0u8; 16];
        // SAFETY: an unaligned store into the 16 bytes `out` owns.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), one) };
        out
    }

    /// `a` moved forward past `b` (by the distance `k` encodes), plus `b`.
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    fn merge(a: __m128i, b: __m128i, k: __m128i) -> __m128i {
        let low = _mm_clmulepi64_si128(a, k, 0x00);
        let high = _mm_clmulepi64_si128(a, k, 0x11);
        _mm_xor_si128(_mm_xor_si128(b, low), high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// `x^n mod P` for crc32c's P (0x1EDC6F41, normal bit order).
    fn x_pow_mod(n: u32) -> u64 {
        let mut r: u64 = 1;
        for _ in 0..n {
            r <<= 1;
            if r & (1 << 32) != 0 {
                r ^= (1 << 32) | 0x1EDC_6F41;
            }
        }
        r
    }

    #[test]
    fn constants_are_the_powers_of_x_they_name() {
        let k = |n| i64::from((x_pow_mod(n) as u32).reverse_bits()) << 1;
        assert_eq!([K1, K2, K3, K4], [k(4 * 128 + 32), k(4 * 128 - 32), k(128 + 32), k(128 - 32)]);
    }

    #[test]
    fn matches_the_crate_at_every_length_and_start() {
        let mut data = vec![0u8; 9016];
        StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15).fill(&mut data[..]);
        let mut folds = 0;
        for len in (0..600).chain([4096, 4097, 4096 + 63, 8192, 8999]) {
            for start in [0usize, 1, 7] {
                let bytes = &data[start..start + len];
                for crc in [0u32, !0, 0x1234_5678] {
                    let want = crc32c::crc32c_append(crc, bytes);
                    assert_eq!(append(crc, bytes), want, "len {len} start {start}");
                    if let Some(got) = folded(crc, bytes) {
                        assert_eq!(got, want, "folded: len {len} start {start}");
                        folds += 1;
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("pclmulqdq") && std::arch::is_x86_feature_detected!("sse4.1") {
            assert!(folds > 1000, "this CPU folds: every length from 64 on was checked so");
        }
        assert_eq!(append(0, b"123456789"), 0xe306_9283, "the check value");
    }
}
