//! Checksums of an HSM archive copy (docs/hsm.md, "Movers"): the CRC-32 of the whole copy and
//! the CRC-32 of every chunk of it, so that a restore verifies each chunk BEFORE committing it
//! (an early reader of a file being restored never reads an unverified byte).
//!
//! Recorded as the copy's checksum string (`ArchiveCopy::checksum`):
//! `crc32:<whole, 8 hex>;chunks:<chunk bytes>:<8 hex per chunk>`. A copy recorded with the
//! whole checksum only (`crc32:<8 hex>`) is verified at its end ([`SumReader::whole_only`]: its
//! restore reads it once to verify it before reading it again to commit); one with no
//! checksum (an import) has nothing to verify.

use tierfs_store::archive::checksum_string;

/// The smallest chunk a checksum covers: the restore's first commit, hence the first bytes an
/// early reader gets, waits for this much.
pub const SUM_CHUNK: u64 = 4 << 20;
/// The chunk doubles from [`SUM_CHUNK`] until a copy has at most this many (the checksum
/// string stays under 128 KiB: 64 GiB in 4 MiB chunks).
pub const MAX_SUM_CHUNKS: u64 = 16384;

/// The chunk size of the sums of a copy of `size` bytes.
pub fn chunk_for(size: u64) -> u64 {
    let mut c = SUM_CHUNK;
    while size.div_ceil(c) > MAX_SUM_CHUNKS {
        c *= 2;
    }
    c
}

/// Computes a copy's checksums as its bytes go by (ARCHIVE).
pub struct SumWriter {
    chunk: u64,
    whole: crc32fast::Hasher,
    cur: crc32fast::Hasher,
    in_cur: u64,
    sums: Vec<u32>,
}

impl SumWriter {
    pub fn new(chunk: u64) -> SumWriter {
        SumWriter {
            chunk: chunk.max(1),
            whole: crc32fast::Hasher::new(),
            cur: crc32fast::Hasher::new(),
            in_cur: 0,
            sums: Vec::new(),
        }
    }

    pub fn update(&mut self, mut b: &[u8]) {
        self.whole.update(b);
        while !b.is_empty() {
            let n = ((self.chunk - self.in_cur) as usize).min(b.len());
            self.cur.update(&b[..n]);
            self.in_cur += n as u64;
            b = &b[n..];
            if self.in_cur == self.chunk {
                let h = std::mem::replace(&mut self.cur, crc32fast::Hasher::new());
                self.sums.push(h.finalize());
                self.in_cur = 0;
            }
        }
    }

    /// The checksum string to record.
    pub fn finish(mut self) -> String {
        if self.in_cur > 0 {
            self.sums.push(self.cur.finalize());
        }
        let mut s = format!(
            "{};chunks:{}:",
            checksum_string(self.whole.finalize()),
            self.chunk
        );
        for c in self.sums {
            s.push_str(&format!("{c:08x}"));
        }
        s
    }
}

/// A checksum that did not match: which bytes of the copy, what was recorded and read.
#[derive(Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub at: u64,
    pub want: String,
    pub got: String,
}

/// Verifies a copy's bytes as they are read in order (RESTORE) and says how far they are
/// verified: the restore commits nothing past [`SumReader::verified`].
pub struct SumReader {
    size: u64,
    whole_want: Option<String>,
    chunks: Option<(u64, Vec<u32>)>,
    whole: crc32fast::Hasher,
    cur: crc32fast::Hasher,
    in_cur: u64,
    read: u64,
    verified: u64,
}

impl SumReader {
    /// For a copy of `size` bytes recorded with `checksum`; Err when the string is not one
    /// this version writes (nothing could be verified).
    pub fn new(checksum: &str, size: u64) -> Result<SumReader, String> {
        let (whole, chunks) = match checksum.split_once(";chunks:") {
            Some((w, c)) => (w, Some(c)),
            None => (checksum, None),
        };
        let whole_want = if whole.is_empty() {
            None
        } else if whole.len() == 14 && whole.starts_with("crc32:") {
            Some(whole.to_string())
        } else {
            return Err(format!("unknown checksum '{checksum}'"));
        };
        let chunks = match chunks {
            None => None,
            Some(c) => {
                let bad = || format!("bad chunk checksums in '{checksum}'");
                let (n, hex) = c.split_once(':').ok_or_else(bad)?;
                let n: u64 = n.parse().map_err(|_| bad())?;
                if n == 0 || hex.len() % 8 != 0 || (hex.len() / 8) as u64 != size.div_ceil(n) {
                    return Err(bad());
                }
                let sums = (0..hex.len() / 8)
                    .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).map_err(|_| bad()))
                    .collect::<Result<Vec<u32>, String>>()?;
                Some((n, sums))
            }
        };
        Ok(SumReader {
            size,
            // nothing to verify: every byte read counts as verified
            verified: 0,
            whole_want,
            chunks,
            whole: crc32fast::Hasher::new(),
            cur: crc32fast::Hasher::new(),
            in_cur: 0,
            read: 0,
        })
    }

    /// The next bytes of the copy, in order. Err at the first chunk (or, without chunk sums,
    /// the whole copy) that does not match: nothing from it on may be committed.
    pub fn update(&mut self, mut b: &[u8]) -> Result<(), Mismatch> {
        self.whole.update(b);
        let Some((n, sums)) = &self.chunks else {
            self.read += b.len() as u64;
            if self.whole_want.is_none() {
                self.verified = self.read;
            }
            return self.check_whole();
        };
        let n = *n;
        while !b.is_empty() {
            let take = ((n - self.in_cur) as usize).min(b.len());
            self.cur.update(&b[..take]);
            self.in_cur += take as u64;
            self.read += take as u64;
            b = &b[take..];
            if self.in_cur == n || self.read == self.size {
                let i = ((self.read - 1) / n) as usize;
                let got = std::mem::replace(&mut self.cur, crc32fast::Hasher::new()).finalize();
                self.in_cur = 0;
                let want = sums.get(i).copied();
                if want != Some(got) {
                    return Err(Mismatch {
                        at: i as u64 * n,
                        want: want.map_or_else(|| "nothing".into(), checksum_string),
                        got: checksum_string(got),
                    });
                }
                self.verified = self.read;
            }
        }
        self.check_whole()
    }

    fn check_whole(&mut self) -> Result<(), Mismatch> {
        if self.read < self.size {
            return Ok(());
        }
        if let Some(want) = &self.whole_want {
            let got = checksum_string(self.whole.clone().finalize());
            if &got != want {
                self.verified = 0;
                return Err(Mismatch {
                    at: 0,
                    want: want.clone(),
                    got,
                });
            }
        }
        self.verified = self.read;
        Ok(())
    }

    /// The copy has a whole checksum and no chunk checksums: nothing is verified before its
    /// end (a restore reads it once to verify it first).
    pub fn whole_only(&self) -> bool {
        self.chunks.is_none() && self.whole_want.is_some()
    }

    /// The copy's bytes `0..verified()` are verified (all of them read so far when the copy
    /// has no checksum).
    pub fn verified(&self) -> u64 {
        self.verified
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn chunk_sums_round_trip_in_any_pieces() {
        let d = data(10_000);
        let mut w = SumWriter::new(4096);
        for p in d.chunks(777) {
            w.update(p);
        }
        let s = w.finish();
        assert!(s.starts_with(&checksum_string(crc32fast::hash(&d))));
        let mut r = SumReader::new(&s, d.len() as u64).unwrap();
        let mut seen = vec![];
        for p in d.chunks(1000) {
            r.update(p).unwrap();
            seen.push(r.verified());
        }
        // verified only at chunk ends, then all of it
        assert_eq!(seen[..5], [0, 0, 0, 0, 4096]);
        assert_eq!(*seen.last().unwrap(), 10_000);
    }

    #[test]
    fn a_corrupt_chunk_stops_verification_before_it() {
        let d = data(10_000);
        let mut w = SumWriter::new(4096);
        w.update(&d);
        let s = w.finish();
        let mut bad = d.clone();
        bad[5000] ^= 1;
        let mut r = SumReader::new(&s, d.len() as u64).unwrap();
        r.update(&bad[..4096]).unwrap();
        assert_eq!(r.verified(), 4096);
        let e = r.update(&bad[4096..]).unwrap_err();
        assert_eq!(e.at, 4096);
        assert_eq!(r.verified(), 4096, "nothing past the bad chunk is verified");
    }

    #[test]
    fn whole_checksum_only_verifies_at_the_end_and_none_verifies_nothing() {
        let d = data(5000);
        let s = checksum_string(crc32fast::hash(&d));
        let mut r = SumReader::new(&s, 5000).unwrap();
        r.update(&d[..4000]).unwrap();
        assert_eq!(r.verified(), 0);
        r.update(&d[4000..]).unwrap();
        assert_eq!(r.verified(), 5000);
        let mut r = SumReader::new(&s, 5000).unwrap();
        r.update(&d[..4000]).unwrap();
        assert!(r.update(&[0; 1000]).is_err());
        assert_eq!(r.verified(), 0);
        let mut r = SumReader::new("", 5000).unwrap();
        r.update(&d[..10]).unwrap();
        assert_eq!(r.verified(), 10);
    }

    #[test]
    fn bad_strings_are_refused_and_chunks_scale() {
        assert!(SumReader::new("md5:x", 1).is_err());
        assert!(SumReader::new("crc32:00000000;chunks:4:0000", 9).is_err());
        assert_eq!(chunk_for(1 << 30), SUM_CHUNK);
        assert_eq!(chunk_for(1 << 40), 64 << 20);
        assert!(SumReader::new("crc32:00000000;chunks:4096:", 0).is_ok());
    }
}
