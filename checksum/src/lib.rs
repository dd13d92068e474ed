//! XXH3-64 (seed 0, default secret), the hash behind a block's checksum
//! (`store_client::block::checksum`: its low 32 bits), whole or over pieces.
//!
//! Why not CRC-32C, which blocks carried before (docs/CHANGELOG.md): a
//! warm local get reads each block and checks it, and the CRC was a
//! quarter of the get's time. XXH3 with AVX-512 or AVX2 hashes a block
//! several times faster than CRC-32C's carry-less multiply kernels, and
//! `xxhash-rust`'s own XXH3 picks its SIMD kernel when it is compiled, so
//! a portable build gets SSE2 at a third of the speed (PERFORMANCE.md has
//! the figures). So the long-input loop is here, with its kernel picked at
//! run time (AVX-512, AVX2, or portable code), and `xxhash-rust` hashes
//! short inputs and is the reference the tests hold this module to. XXH3
//! catches a corrupted block as surely for this purpose (a random change
//! passes a 32-bit check with probability 2⁻³²) and is a published
//! format: `xxhsum -H3` on a version file's payload prints the 64 bits
//! whose low half the header holds.

const P32_1: u64 = 0x9E37_79B1;
const P32_2: u64 = 0x85EB_CA77;
const P32_3: u64 = 0xC2B2_AE3D;
const P64_1: u64 = 0x9E37_79B1_85EB_CA87;
const P64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P64_3: u64 = 0x1656_67B1_9E37_79F9;
const P64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const P64_5: u64 = 0x27D4_EB2F_1656_67C5;

/// XXH3's default secret (the specification's `kSecret`).
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90,
    0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d,
    0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28,
    0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e,
    0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b,
    0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,
    0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16,
    0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

/// Bytes hashed between two scrambles of the accumulators: 16 stripes of 64.
const BLOCK: usize = 1024;
const STRIPE: usize = 64;
const STRIPES_PER_BLOCK: usize = 16;
/// Up to this length XXH3 hashes otherwise (`xxhash-rust` does it).
const MIDSIZE_MAX: usize = 240;
/// Where the scramble's key starts in the secret.
const SCRAMBLE_KEY: usize = SECRET.len() - STRIPE;
/// Where the last stripe's key starts.
const LAST_STRIPE_KEY: usize = SECRET.len() - STRIPE - 7;
const INIT_ACC: [u64; 8] = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];

/// XXH3-64 of `input`.
pub fn xxh3_64(input: &[u8]) -> u64 {
    if input.len() <= MIDSIZE_MAX {
        return xxhash_rust::xxh3::xxh3_64(input);
    }
    let whole = (input.len() - 1) / BLOCK * BLOCK;
    let mut acc = INIT_ACC;
    blocks(&mut acc, &input[..whole]);
    let last: &[u8; STRIPE] = input[input.len() - STRIPE..].try_into().expect("a stripe");
    finish(acc, &input[whole..], last, input.len())
}

/// XXH3-64 over input that comes in pieces, equal to [`xxh3_64`] of the
/// pieces joined. The last block's bytes are held back (copied, at most
/// 1 KiB a piece), since XXH3 hashes the input's last block differently.
#[derive(Clone)]
pub struct Xxh3 {
    acc: [u64; 8],
    total: u64,
    /// The bytes after the whole blocks hashed so far: 1..=1024 of them
    /// once any input came.
    held: Box<[u8; BLOCK]>,
    held_len: usize,
    /// The 64 bytes before `held`'s, once a block was hashed: the last
    /// stripe may reach back into them.
    before: [u8; STRIPE],
}

impl Xxh3 {
    pub fn new() -> Xxh3 {
        Xxh3 { acc: INIT_ACC, total: 0, held: Box::new([0; BLOCK]), held_len: 0, before: [0; STRIPE] }
    }

    pub fn update(&mut self, mut input: &[u8]) {
        if input.is_empty() {
            return;
        }
        self.total += input.len() as u64;
        if self.held_len > 0 {
            let take = (BLOCK - self.held_len).min(input.len());
            self.held[self.held_len..self.held_len + take].copy_from_slice(&input[..take]);
            self.held_len += take;
            input = &input[take..];
            if input.is_empty() {
                return;
            }
            // A full block with more behind it: not the last.
            blocks(&mut self.acc, &self.held[..]);
            self.before.copy_from_slice(&self.held[BLOCK - STRIPE..]);
        }
        let hold = (input.len() - 1) % BLOCK + 1;
        let whole = input.len() - hold;
        if whole > 0 {
            blocks(&mut self.acc, &input[..whole]);
            self.before.copy_from_slice(&input[whole - STRIPE..whole]);
        }
        self.held[..hold].copy_from_slice(&input[whole..]);
        self.held_len = hold;
    }

    pub fn digest(&self) -> u64 {
        let held = &self.held[..self.held_len];
        if self.total as usize == self.held_len {
            // No block hashed yet: all of it is here.
            return xxh3_64(held);
        }
        let mut last = [0u8; STRIPE];
        if held.len() >= STRIPE {
            last.copy_from_slice(&held[held.len() - STRIPE..]);
        } else {
            let from_before = STRIPE - held.len();
            last[..from_before].copy_from_slice(&self.before[held.len()..]);
            last[from_before..].copy_from_slice(held);
        }
        finish(self.acc, held, &last, self.total as usize)
    }
}

impl Default for Xxh3 {
    fn default() -> Self {
        Xxh3::new()
    }
}

/// Hashes whole blocks (`data.len()` a multiple of [`BLOCK`]) into `acc`,
/// each followed by a scramble, with the widest kernel this CPU has.
fn blocks(acc: &mut [u64; 8], data: &[u8]) {
    debug_assert_eq!(data.len() % BLOCK, 0);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { x86::blocks_avx512(acc, data) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { x86::blocks_avx2(acc, data) };
        }
    }
    for block in data.chunks_exact(BLOCK) {
        for s in 0..STRIPES_PER_BLOCK {
            accumulate(acc, &block[STRIPE * s..STRIPE * (s + 1)], 8 * s);
        }
        scramble(acc);
    }
}

/// The input's last 1..=1024 bytes (`tail`) and its last stripe, then the
/// accumulators merged into the hash.
fn finish(mut acc: [u64; 8], tail: &[u8], last: &[u8; STRIPE], len: usize) -> u64 {
    for s in 0..(tail.len() - 1) / STRIPE {
        accumulate(&mut acc, &tail[STRIPE * s..STRIPE * (s + 1)], 8 * s);
    }
    accumulate(&mut acc, last, LAST_STRIPE_KEY);
    let mut h = (len as u64).wrapping_mul(P64_1);
    for i in 0..4 {
        let a = acc[2 * i] ^ secret_u64(11 + 16 * i);
        let b = acc[2 * i + 1] ^ secret_u64(11 + 16 * i + 8);
        let product = a as u128 * b as u128;
        h = h.wrapping_add(product as u64 ^ (product >> 64) as u64);
    }
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

fn secret_u64(at: usize) -> u64 {
    u64::from_le_bytes(SECRET[at..at + 8].try_into().expect("8 bytes"))
}

fn accumulate(acc: &mut [u64; 8], stripe: &[u8], key_at: usize) {
    for i in 0..8 {
        let data = u64::from_le_bytes(stripe[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let key = data ^ secret_u64(key_at + 8 * i);
        acc[i ^ 1] = acc[i ^ 1].wrapping_add(data);
        acc[i] = acc[i].wrapping_add((key & 0xFFFF_FFFF).wrapping_mul(key >> 32));
    }
}

fn scramble(acc: &mut [u64; 8]) {
    for (i, a) in acc.iter_mut().enumerate() {
        let mut x = *a;
        x ^= x >> 47;
        x ^= secret_u64(SCRAMBLE_KEY + 8 * i);
        *a = x.wrapping_mul(P32_1);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The block loop in SIMD. A block's sixteen stripe sums are added up
    //! apart and then to the accumulators (wrapping sums commute), so no
    //! chain of additions runs through the accumulators; the secret's keys
    //! stay in registers. (Written as XXH3's reference loop, one addition
    //! into the accumulators a stripe, it ran 9.3 µs per 512 KiB here.)
    use super::{BLOCK, P32_1, SCRAMBLE_KEY, SECRET, STRIPE};
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must have AVX-512F; `data.len()` a multiple of [`BLOCK`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn blocks_avx512(acc: &mut [u64; 8], data: &[u8]) {
        let sec = SECRET.as_ptr();
        let keys: [__m512i; 16] = std::array::from_fn(|s| _mm512_loadu_si512(sec.add(8 * s).cast()));
        let scramble_key = _mm512_loadu_si512(sec.add(SCRAMBLE_KEY).cast());
        let prime = _mm512_set1_epi32(P32_1 as i32);
        let mut a = _mm512_loadu_si512(acc.as_ptr().cast());
        for block in data.chunks_exact(BLOCK) {
            let p = block.as_ptr();
            // One stripe's sum: the data with its halves swapped, plus the
            // product of each keyed lane's 32-bit halves. (Macros, not
            // closures, so that every intrinsic is compiled with AVX-512.)
            macro_rules! stripe {
                ($s:expr) => {{
                    let d = _mm512_loadu_si512(p.add(STRIPE * $s).cast());
                    let k = _mm512_xor_si512(d, keys[$s]);
                    let product = _mm512_mul_epu32(k, _mm512_srli_epi64(k, 32));
                    _mm512_add_epi64(product, _mm512_shuffle_epi32(d, _MM_PERM_BADC))
                }};
            }
            macro_rules! quad {
                ($s:expr) => {
                    _mm512_add_epi64(_mm512_add_epi64(stripe!($s), stripe!($s + 1)), _mm512_add_epi64(stripe!($s + 2), stripe!($s + 3)))
                };
            }
            let sum = _mm512_add_epi64(_mm512_add_epi64(quad!(0), quad!(4)), _mm512_add_epi64(quad!(8), quad!(12)));
            a = _mm512_add_epi64(a, sum);
            // Scramble: x ^= x >> 47; x ^= key; x *= P32_1 (as 32 × 32
            // products of each half).
            let k = _mm512_ternarylogic_epi32(scramble_key, a, _mm512_srli_epi64(a, 47), 0x96);
            let lo = _mm512_mul_epu32(k, prime);
            let hi = _mm512_mul_epu32(_mm512_srli_epi64(k, 32), prime);
            a = _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
        }
        _mm512_storeu_si512(acc.as_mut_ptr().cast(), a);
    }

    /// # Safety
    /// The CPU must have AVX2; `data.len()` a multiple of [`BLOCK`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn blocks_avx2(acc: &mut [u64; 8], data: &[u8]) {
        let sec = SECRET.as_ptr();
        let keys: [[__m256i; 2]; 16] =
            std::array::from_fn(|s| [_mm256_loadu_si256(sec.add(8 * s).cast()), _mm256_loadu_si256(sec.add(8 * s + 32).cast())]);
        let scramble_key = [_mm256_loadu_si256(sec.add(SCRAMBLE_KEY).cast()), _mm256_loadu_si256(sec.add(SCRAMBLE_KEY + 32).cast())];
        let prime = _mm256_set1_epi32(P32_1 as i32);
        let mut a = [_mm256_loadu_si256(acc.as_ptr().cast()), _mm256_loadu_si256(acc.as_ptr().add(4).cast())];
        for block in data.chunks_exact(BLOCK) {
            let p = block.as_ptr();
            for (h, a) in a.iter_mut().enumerate() {
                macro_rules! stripe {
                    ($s:expr) => {{
                        let d = _mm256_loadu_si256(p.add(STRIPE * $s + 32 * h).cast());
                        let k = _mm256_xor_si256(d, keys[$s][h]);
                        let product = _mm256_mul_epu32(k, _mm256_srli_epi64(k, 32));
                        _mm256_add_epi64(product, _mm256_shuffle_epi32(d, 0b01_00_11_10))
                    }};
                }
                macro_rules! quad {
                    ($s:expr) => {
                        _mm256_add_epi64(_mm256_add_epi64(stripe!($s), stripe!($s + 1)), _mm256_add_epi64(stripe!($s + 2), stripe!($s + 3)))
                    };
                }
                let sum = _mm256_add_epi64(_mm256_add_epi64(quad!(0), quad!(4)), _mm256_add_epi64(quad!(8), quad!(12)));
                let x = _mm256_add_epi64(*a, sum);
                let k = _mm256_xor_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 47)), scramble_key[h]);
                let lo = _mm256_mul_epu32(k, prime);
                let hi = _mm256_mul_epu32(_mm256_srli_epi64(k, 32), prime);
                *a = _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
            }
        }
        _mm256_storeu_si256(acc.as_mut_ptr().cast(), a[0]);
        _mm256_storeu_si256(acc.as_mut_ptr().add(4).cast(), a[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Every length up to a few blocks (each way the last block and stripe
    /// can fall), and block sizes of this project: the reference's hash.
    #[test]
    fn whole_inputs_hash_as_the_reference_does() {
        let lens = (0..3 * BLOCK + 130).chain([64 << 10, (64 << 10) + 1, 512 << 10, (512 << 10) - 8, 8 << 20, (8 << 20) + 24]);
        for len in lens {
            let data = bytes(len, len as u64);
            assert_eq!(xxh3_64(&data), xxhash_rust::xxh3::xxh3_64(&data), "length {len}");
        }
    }

    /// Each kernel this CPU has, and the portable loop, against the
    /// reference (the dispatch picks only one of them).
    #[test]
    fn every_kernel_hashes_as_the_reference_does() {
        for len in [BLOCK + 1, 4 * BLOCK, 4 * BLOCK + 100, 100 * BLOCK + 63] {
            let data = bytes(len, 7);
            let whole = (len - 1) / BLOCK * BLOCK;
            let last: &[u8; STRIPE] = data[len - STRIPE..].try_into().unwrap();
            let expected = xxhash_rust::xxh3::xxh3_64(&data);
            let mut acc = INIT_ACC;
            for block in data[..whole].chunks_exact(BLOCK) {
                for s in 0..STRIPES_PER_BLOCK {
                    accumulate(&mut acc, &block[STRIPE * s..STRIPE * (s + 1)], 8 * s);
                }
                scramble(&mut acc);
            }
            assert_eq!(finish(acc, &data[whole..], last, len), expected, "portable, length {len}");
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    let mut acc = INIT_ACC;
                    unsafe { x86::blocks_avx512(&mut acc, &data[..whole]) };
                    assert_eq!(finish(acc, &data[whole..], last, len), expected, "AVX-512, length {len}");
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    let mut acc = INIT_ACC;
                    unsafe { x86::blocks_avx2(&mut acc, &data[..whole]) };
                    assert_eq!(finish(acc, &data[whole..], last, len), expected, "AVX2, length {len}");
                }
            }
        }
    }

    proptest! {
        /// Any input cut into any pieces hashes as it does whole.
        #[test]
        fn pieces_hash_as_the_whole(len in 0usize..5000, seed in any::<u64>(), cuts in proptest::collection::vec(0usize..5000, 0..6)) {
            let data = bytes(len, seed);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(len)).collect();
            cuts.sort_unstable();
            let mut h = Xxh3::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([len]) {
                h.update(&data[at..c]);
                at = c;
            }
            prop_assert_eq!(h.digest(), xxhash_rust::xxh3::xxh3_64(&data));
        }
    }

    /// Pieces the way the store reads and writes blocks: 512 KiB, 2 MiB and
    /// 128 KiB pieces of blocks of several sizes, and one short read.
    #[test]
    fn block_sized_pieces_hash_as_the_whole() {
        for (len, piece) in
            [(512 << 10, 512 << 10), (8 << 20, 512 << 10), (8 << 20, 2 << 20), (3 << 20, 128 << 10), (1200 * 1200 * 8, 2 << 20)]
        {
            let data = bytes(len, 3);
            let mut h = Xxh3::new();
            let mut rest = &data[..];
            // A short first read, as a `pread` may return.
            let (first, after) = rest.split_at(4093.min(rest.len()));
            h.update(first);
            rest = after;
            for p in rest.chunks(piece) {
                h.update(p);
            }
            assert_eq!(h.digest(), xxhash_rust::xxh3::xxh3_64(&data), "{len} bytes in pieces of {piece}");
        }
    }
}
