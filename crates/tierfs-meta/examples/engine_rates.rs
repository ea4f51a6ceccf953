//! Raw metadata-engine rates, without FUSE: `cargo run --release --example engine_rates -- DIR N`
//! (SQLite in DIR/m.db), or `-- postgres://user@host/db N` (PostgreSQL; the database must exist
//! and is formatted anew). Tells how much of a create/stat/unlink through a mount is the engine
//! itself.

use std::time::Instant;

use tierfs_meta::postgres::PgMeta;
use tierfs_meta::sqlite::SqliteMeta;
use tierfs_meta::{FormatParams, Kind, Layout, MetaEngine, NewNode, ROOT_INO};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let place = args
        .get(1)
        .map(String::as_str)
        .unwrap_or("/tmp/engine-rates");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let p = FormatParams {
        name: "rates".into(),
        targets: vec![("file:///tmp/x".into(), 0)],
        stripe_count: 1,
        stripe_size: 1 << 20,
        inline_threshold: 65536,
        force: true,
    };
    let e: Box<dyn MetaEngine> =
        if place.starts_with("postgres://") || place.starts_with("postgresql://") {
            Box::new(PgMeta::format(place, &p).expect("format"))
        } else {
            let dir = std::path::PathBuf::from(place);
            std::fs::create_dir_all(&dir).expect("create dir");
            Box::new(SqliteMeta::format(&dir.join("m.db"), &p).expect("format"))
        };
    let node = NewNode {
        kind: Kind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink: None,
    };
    let layout = Layout {
        stripe_size: 1 << 20,
        targets: vec![0],
    };
    let t = Instant::now();
    for i in 0..n {
        e.create(
            ROOT_INO,
            format!("f{i}").as_bytes(),
            &node,
            Some(layout.clone()),
            Some(1),
        )
        .expect("create");
    }
    let c = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..n {
        e.lookup(ROOT_INO, format!("f{i}").as_bytes())
            .expect("lookup");
    }
    let l = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..n {
        e.unlink(ROOT_INO, format!("f{i}").as_bytes())
            .expect("unlink");
    }
    let u = t.elapsed().as_secs_f64();
    println!(
        "engine: create {:.0}/s ({:.1} us), lookup {:.0}/s ({:.1} us), unlink {:.0}/s ({:.1} us)",
        n as f64 / c,
        c * 1e6 / n as f64,
        n as f64 / l,
        l * 1e6 / n as f64,
        n as f64 / u,
        u * 1e6 / n as f64
    );
}
