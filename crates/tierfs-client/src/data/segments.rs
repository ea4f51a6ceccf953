//! Which slice supplies each byte of a chunk: later slices cover earlier ones ("newest wins").

use tierfs_meta::{Slice, SliceData};

/// Where one visible piece of a chunk comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `target`/`obj` from byte `obj_off`.
    Object {
        target: u32,
        obj: u64,
        obj_off: u64,
    },
    /// Inline bytes of slice `slice_idx`, from byte `data_off`.
    Inline {
        slice_idx: usize,
        data_off: u64,
    },
    Zero,
}

/// `len` bytes at chunk offset `off`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub off: u64,
    pub len: u64,
    pub src: Source,
}

/// The segments covering `[start, end)` of a chunk, in offset order, holes as `Zero`.
pub fn visible(slices: &[Slice], start: u64, end: u64) -> Vec<Segment> {
    let mut uncovered: Vec<(u64, u64)> = vec![(start, end)];
    let mut out: Vec<Segment> = Vec::new();
    for (idx, s) in slices.iter().enumerate().rev() {
        if uncovered.is_empty() {
            break;
        }
        let (s0, s1) = (s.off, s.off + s.len);
        let mut next = Vec::with_capacity(uncovered.len() + 1);
        for &(u0, u1) in &uncovered {
            let a = u0.max(s0);
            let b = u1.min(s1);
            if a >= b {
                next.push((u0, u1));
                continue;
            }
            let src = match &s.data {
                SliceData::Object {
                    target,
                    obj,
                    obj_off,
                    ..
                } => Source::Object {
                    target: *target,
                    obj: *obj,
                    obj_off: obj_off + (a - s0),
                },
                SliceData::Inline(_) => Source::Inline {
                    slice_idx: idx,
                    data_off: a - s0,
                },
                SliceData::Zero => Source::Zero,
            };
            out.push(Segment {
                off: a,
                len: b - a,
                src,
            });
            if u0 < a {
                next.push((u0, a));
            }
            if b < u1 {
                next.push((b, u1));
            }
        }
        uncovered = next;
    }
    for (u0, u1) in uncovered {
        out.push(Segment {
            off: u0,
            len: u1 - u0,
            src: Source::Zero,
        });
    }
    out.sort_by_key(|s| s.off);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn obj(off: u64, len: u64, obj: u64) -> Slice {
        Slice {
            seq: 0,
            chunk: 0,
            off,
            len,
            data: SliceData::Object {
                target: 0,
                obj,
                obj_off: 0,
                obj_size: len,
            },
        }
    }

    #[test]
    fn newest_wins_and_holes_are_zero() {
        let s = vec![obj(0, 100, 1), obj(50, 10, 2)];
        let v = visible(&s, 0, 120);
        assert_eq!(
            v,
            vec![
                Segment {
                    off: 0,
                    len: 50,
                    src: Source::Object {
                        target: 0,
                        obj: 1,
                        obj_off: 0
                    }
                },
                Segment {
                    off: 50,
                    len: 10,
                    src: Source::Object {
                        target: 0,
                        obj: 2,
                        obj_off: 0
                    }
                },
                Segment {
                    off: 60,
                    len: 40,
                    src: Source::Object {
                        target: 0,
                        obj: 1,
                        obj_off: 60
                    }
                },
                Segment {
                    off: 100,
                    len: 20,
                    src: Source::Zero
                },
            ]
        );
    }

    #[test]
    fn shared_object_offsets_carry_through() {
        let mut s = obj(10, 20, 7);
        s.data = SliceData::Object {
            target: 1,
            obj: 7,
            obj_off: 100,
            obj_size: 500,
        };
        let v = visible(&[s], 15, 25);
        assert_eq!(
            v,
            vec![Segment {
                off: 15,
                len: 10,
                src: Source::Object {
                    target: 1,
                    obj: 7,
                    obj_off: 105
                }
            }]
        );
    }

    proptest! {
        /// Against a byte-by-byte model: replaying the slices in order over a buffer gives the
        /// same owner for every byte as the segments say.
        #[test]
        fn matches_a_byte_model(writes in proptest::collection::vec((0u64..200, 1u64..80), 0..20),
                                start in 0u64..100, len in 0u64..200) {
            let slices: Vec<Slice> = writes.iter().enumerate()
                .map(|(i, (o, l))| obj(*o, *l, i as u64 + 1)).collect();
            let mut model = vec![0u64; 400];
            for s in &slices {
                if let SliceData::Object { obj, .. } = s.data {
                    for b in s.off..s.off + s.len { model[b as usize] = obj; }
                }
            }
            let end = start + len;
            let segs = visible(&slices, start, end);
            let mut pos = start;
            for seg in &segs {
                prop_assert_eq!(seg.off, pos);
                for b in seg.off..seg.off + seg.len {
                    let owner = match seg.src { Source::Object { obj, .. } => obj, _ => 0 };
                    prop_assert_eq!(owner, model[b as usize]);
                }
                pos += seg.len;
            }
            prop_assert_eq!(pos, end);
        }
    }
}
