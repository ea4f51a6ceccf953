//! Reads racing changes: an answer the engine gave before a change (a punch-hole, a commit)
//! must not be kept once the change is known, or later reads serve the bytes from before it.
//! The engine's reply is held ([`Fault::HoldReply`]) while the change lands, which is what the
//! kernel's readahead did to fsx (a READ in flight across a FALLOC_FL_PUNCH_HOLE).

use std::sync::Arc;
use std::time::Duration;

use tierfs_meta::faulty::{Fault, FaultPlan, FaultyEngine};

use super::fixture::{fixture_with, Fixture};

const LEN: usize = 64 << 10;

fn written(plan: &Arc<FaultPlan>) -> Fixture {
    let p = Arc::clone(plan);
    let f = fixture_with(|m| Arc::new(FaultyEngine::new(m, p)));
    f.data.write(f.ino, 0, &vec![0xAA; LEN]).unwrap();
    f.data.flush(f.ino).unwrap();
    f
}

/// Punches the whole written range while a read holds the engine's answer to `op`, then lets
/// the answer go; returns what a read made after all that sees.
fn punch_while_held(f: &Fixture, plan: &FaultPlan, op: &str, sequential: bool) -> Vec<u8> {
    plan.fail_next(op, 1, Fault::HoldReply);
    std::thread::scope(|s| {
        let racing = s.spawn(|| f.data.read(f.ino, 0, 4096, sequential));
        assert!(
            plan.wait_held(Duration::from_secs(10)),
            "the read never asked the engine for {op}"
        );
        let a = f
            .data
            .meta
            .fallocate(f.ino, 0, LEN as u64, true, true)
            .unwrap();
        f.data.invalidate(f.ino, Some(&a));
        plan.release();
        // Concurrent with the punch: either answer is right for this one.
        racing.join().unwrap().unwrap();
    });
    f.data.read(f.ino, 0, 4096, sequential).unwrap()
}

/// `got`, read after the punch, holds only zeros.
fn assert_punched(got: &[u8], context: &str) {
    assert!(
        got.iter().all(|&b| b == 0),
        "{context}: the punched range read back as {:#x}",
        got[0]
    );
}

#[test]
fn a_slice_list_read_before_a_punch_is_not_kept_after_it() {
    for sequential in [false, true] {
        let plan = FaultPlan::new();
        let f = written(&plan);
        let got = punch_while_held(&f, &plan, "read_chunk", sequential);
        assert_punched(&got, &format!("read_chunk held, sequential={sequential}"));
        f.finish();
    }
}

#[test]
fn an_attribute_read_before_a_punch_is_not_kept_after_it() {
    let plan = FaultPlan::new();
    let f = written(&plan);
    // The whole chunk is in the read cache under the data version from before the punch, and
    // the attributes are forgotten (as after another client's change).
    assert_eq!(f.data.read(f.ino, 0, 4096, true).unwrap(), vec![0xAA; 4096]);
    f.data.invalidate(f.ino, None);
    let got = punch_while_held(&f, &plan, "getattr", true);
    assert_punched(&got, "getattr held across the punch");
    f.finish();
}

/// An open whose attributes were read before a punch this client already knows of (another
/// handle's fallocate landed while the open was under way) keeps the newer attributes: reads
/// go by the data version after the punch, not the one whose chunks are in the read cache.
#[test]
fn an_open_with_attributes_from_before_a_punch_keeps_the_newer_ones() {
    let plan = FaultPlan::new();
    let f = written(&plan);
    assert_eq!(f.data.read(f.ino, 0, 4096, true).unwrap(), vec![0xAA; 4096]);
    let before = f.data.meta.getattr(f.ino).unwrap();
    let a = f
        .data
        .meta
        .fallocate(f.ino, 0, LEN as u64, true, true)
        .unwrap();
    assert!(a.data_version > before.data_version);
    f.data.invalidate(f.ino, Some(&a));
    let keep = f.data.open(&before, false);
    assert!(
        !keep,
        "the page cache is not kept for attributes older than what is known"
    );
    let got = f.data.read(f.ino, 0, 4096, true).unwrap();
    assert_punched(&got, "open with attributes from before the punch");
    f.finish();
}
