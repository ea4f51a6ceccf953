//! A client mounted in this test process over a failure-injecting engine
//! ([`FaultyEngine`]): the test chooses which engine calls fail or hang (tests/faults.rs,
//! tests/uring.rs).

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use tierfs_client::config::ClientConfig;
use tierfs_client::daemon::{mount, MountRequest};
use tierfs_meta::faulty::{FaultPlan, FaultyEngine};
use tierfs_meta::{open_engine, MetaEngine};

use super::{is_fuse_mounted, TestFs};

/// A client mounted in this process over a failure-injecting engine.
pub struct FaultyMount {
    pub mnt: PathBuf,
    pub plan: Arc<FaultPlan>,
    serve: Option<thread::JoinHandle<()>>,
}

impl FaultyMount {
    pub fn new(fs: &TestFs, name: &str) -> FaultyMount {
        let config = ClientConfig {
            client_name: Some(name.to_string()),
            ..ClientConfig::default()
        };
        FaultyMount::with_config(fs, name, config)
    }

    pub fn with_config(fs: &TestFs, name: &str, config: ClientConfig) -> FaultyMount {
        let mnt = fs.root().join(format!("faulty-{name}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let plan = FaultPlan::new();
        let inner = open_engine(&fs.meta_url()).expect("open the engine");
        let engine: Arc<dyn MetaEngine> = Arc::new(FaultyEngine::new(inner, Arc::clone(&plan)));
        let req = MountRequest {
            meta_url: fs.meta_url(),
            mountpoint: mnt.clone(),
            config,
            engine: Some(engine),
        };
        let (tx, rx) = mpsc::channel();
        let serve = thread::Builder::new()
            .name(format!("faulty-{name}"))
            .spawn(move || {
                let tx2 = tx.clone();
                let r = mount(req, move |ready| {
                    let _ = tx2.send(ready);
                });
                if let Err(e) = r {
                    let _ = tx.send(Err(e.to_string()));
                }
            })
            .unwrap();
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(())) => {}
            other => panic!("in-process mount failed: {other:?}"),
        }
        assert!(is_fuse_mounted(&mnt));
        FaultyMount {
            mnt,
            plan,
            serve: Some(serve),
        }
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }
}

impl Drop for FaultyMount {
    fn drop(&mut self) {
        self.plan.clear();
        let _ = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .status();
        if is_fuse_mounted(&self.mnt) {
            let _ = std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
        }
        if let Some(h) = self.serve.take() {
            // The session ends once the kernel lets go of the mount; bounded.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !h.is_finished() && std::time::Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}
