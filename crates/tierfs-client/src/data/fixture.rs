//! The data path of the unit tests: a fresh filesystem in a temporary directory.

use std::path::Path;
use std::sync::Arc;

use tierfs_meta::{format_engine, FormatParams, Kind, MetaEngine, NewNode, ROOT_INO};
use tierfs_store::TargetSet;

use super::{DataConfig, DataPath};
use crate::metrics::Metrics;

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub rt: tokio::runtime::Runtime,
    pub data: DataPath,
    pub targets: Arc<TargetSet>,
    pub ino: u64,
}

/// A data path on SQLite and two local targets, with one empty file (1 MiB stripes, nothing
/// inline).
pub fn fixture() -> Fixture {
    fixture_with(|m| m)
}

/// [`fixture`] with the engine wrapped by `wrap` (a [`tierfs_meta::faulty::FaultyEngine`]).
pub fn fixture_with(wrap: impl FnOnce(Arc<dyn MetaEngine>) -> Arc<dyn MetaEngine>) -> Fixture {
    fixture_configured(DataConfig::default(), wrap)
}

/// [`fixture_with`] on a data path configured by `cfg`.
pub fn fixture_configured(
    cfg: DataConfig,
    wrap: impl FnOnce(Arc<dyn MetaEngine>) -> Arc<dyn MetaEngine>,
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let (meta, targets, rt, data) = data_path(dir.path(), "durability", 1, 1 << 20, cfg, wrap);
    let layout = data.choose_layout(ROOT_INO).unwrap();
    let node = NewNode {
        kind: Kind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        symlink: None,
    };
    let ino = meta
        .create(ROOT_INO, b"f", &node, Some(layout), None)
        .unwrap()
        .ino;
    Fixture {
        _dir: dir,
        rt,
        data,
        targets,
        ino,
    }
}

impl Fixture {
    /// Ends a test: the data path goes first, then the runtime, without waiting for its tasks.
    pub fn finish(self) {
        let Fixture { data, rt, .. } = self;
        drop(data);
        rt.shutdown_background();
    }
}

/// A filesystem formatted in `dir` (SQLite, two local targets `dir/ost0` and `dir/ost1`,
/// nothing inline) and a data path on it: the engine as `wrap` returns it, the targets, the
/// runtime the data path runs on, and the data path.
pub fn data_path(
    dir: &Path,
    name: &str,
    stripe_count: u32,
    stripe_size: u64,
    cfg: DataConfig,
    wrap: impl FnOnce(Arc<dyn MetaEngine>) -> Arc<dyn MetaEngine>,
) -> (
    Arc<dyn MetaEngine>,
    Arc<TargetSet>,
    tokio::runtime::Runtime,
    DataPath,
) {
    let t = |i: usize| format!("file://{}", dir.join(format!("ost{i}")).display());
    for i in 0..2 {
        std::fs::create_dir_all(dir.join(format!("ost{i}"))).unwrap();
    }
    let meta = format_engine(
        &format!("sqlite://{}", dir.join("meta.db").display()),
        &FormatParams {
            name: name.into(),
            targets: vec![(t(0), 0), (t(1), 0)],
            stripe_count,
            stripe_size,
            inline_threshold: 0,
            force: false,
        },
    )
    .unwrap();
    let meta = wrap(meta);
    let list: Vec<(u32, String, u64)> = meta
        .targets()
        .unwrap()
        .into_iter()
        .map(|t| (t.id, t.url, t.capacity))
        .collect();
    let targets = Arc::new(TargetSet::open(&list).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let data = DataPath::new(
        Arc::clone(&meta),
        Arc::clone(&targets),
        rt.handle().clone(),
        Arc::new(Metrics::new()),
        0,
        cfg,
    );
    (meta, targets, rt, data)
}
