//! The data every workload writes: a pseudo-random byte stream keyed by a per-file seed and the
//! absolute file offset, so any range of any file can be regenerated and compared on read. A
//! block at the wrong offset, a stale block, zeros or a short file are all caught.

use std::path::Path;

use crate::error::BenchError;

fn mix(seed: u64, word: u64) -> u64 {
    // splitmix64 of (seed, word index)
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(word.wrapping_mul(0xD1B5_4A32_D192_ED03))
        .wrapping_add(0x632B_E59B_D9B4_E019);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed for file `parts` (e.g. task number and file index).
pub fn seed_of(parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(0x1234_5678_9ABC_DEF0u64, |acc, &p| mix(acc, p))
}

/// Fills `buf` with the bytes of file `seed` at offsets `off..off + buf.len()`.
pub fn fill(buf: &mut [u8], seed: u64, off: u64) {
    let mut pos = 0usize;
    let mut o = off;
    // unaligned head
    while pos < buf.len() && !o.is_multiple_of(8) {
        buf[pos] = mix(seed, o / 8).to_le_bytes()[(o % 8) as usize];
        pos += 1;
        o += 1;
    }
    let mut chunks = buf[pos..].chunks_exact_mut(8);
    let mut w = o / 8;
    for c in &mut chunks {
        c.copy_from_slice(&mix(seed, w).to_le_bytes());
        w += 1;
    }
    let rest = chunks.into_remainder();
    let b = mix(seed, w).to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&b[..n]);
}

/// Checks that `data` holds file `seed`'s bytes at `off`; `scratch` is reused between calls.
pub fn verify(
    data: &[u8],
    seed: u64,
    off: u64,
    scratch: &mut Vec<u8>,
    path: &Path,
) -> Result<(), BenchError> {
    scratch.resize(data.len(), 0);
    fill(scratch, seed, off);
    if scratch[..] == *data {
        return Ok(());
    }
    let i = data
        .iter()
        .zip(scratch.iter())
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    let end = (i + 8).min(data.len());
    Err(BenchError::Verify {
        path: path.to_path_buf(),
        offset: off + i as u64,
        detail: format!(
            "expected {:02x?}, read {:02x?}",
            &scratch[i..end],
            &data[i..end]
        ),
    })
}

/// A heap buffer aligned for O_DIRECT (4 KiB).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is owned memory, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub const ALIGN: usize = 4096;

    pub fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(1), Self::ALIGN)
            .expect("alignment is a power of two");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len, layout }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the buffer's life.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in new().
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_offset_consistent() {
        let mut whole = vec![0u8; 1000];
        fill(&mut whole, 7, 13);
        for (a, b) in [(0usize, 5usize), (5, 100), (100, 333), (333, 1000)] {
            let mut part = vec![0u8; b - a];
            fill(&mut part, 7, 13 + a as u64);
            assert_eq!(part, whole[a..b]);
        }
        let mut other = vec![0u8; 1000];
        fill(&mut other, 8, 13);
        assert_ne!(other, whole);
    }

    #[test]
    fn verify_reports_first_bad_offset() {
        let mut d = vec![0u8; 4096];
        fill(&mut d, 3, 8192);
        let mut s = Vec::new();
        verify(&d, 3, 8192, &mut s, Path::new("f")).unwrap();
        d[100] ^= 1;
        match verify(&d, 3, 8192, &mut s, Path::new("f")) {
            Err(BenchError::Verify { offset, .. }) => assert_eq!(offset, 8292),
            other => panic!("{other:?}"),
        }
        // zeros are never the pattern
        let z = vec![0u8; 64];
        assert!(verify(&z, 3, 0, &mut s, Path::new("f")).is_err());
    }

    #[test]
    fn aligned_buffer_is_aligned() {
        let b = AlignedBuf::new(47008);
        assert_eq!(b.as_ptr() as usize % AlignedBuf::ALIGN, 0);
        assert_eq!(b.len(), 47008);
    }
}
