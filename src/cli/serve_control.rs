//! The daemon side of `blobdrive serve` (`serve.rs`): its exports as the
//! control socket answers for them (`daemon::control::Controlled`: stats
//! with each export's NBD counters, the Prometheus text, flush) and as the
//! mount's end closes them (`daemon::closing::Closing`), and the binding of
//! that control socket.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::daemon::closing::{self, Closing};
use crate::daemon::control::{self, Controlled};
use crate::fs::handles::SavedUnflushed;
use crate::fs::FsError;
use crate::nbd::{Export, Exports};

/// The drives an NBD server exports, as its control socket and its end see
/// them (`daemon::control::Controlled`, `daemon::closing::Closing`).
pub(super) struct Served {
    /// The exports, shared with the accept loop.
    pub exports: Arc<Exports>,
    /// `unix:PATH` or `tcp:IP:PORT`.
    pub endpoint: String,
    /// Set once the server stops: its final flush is under way (`stats`
    /// says `"state": "stopping"`).
    pub stopping: AtomicBool,
}

impl Served {
    /// Serves `exports` at `endpoint` (not stopping).
    pub fn new(exports: Arc<Exports>, endpoint: String) -> Served {
        Served {
            exports,
            endpoint,
            stopping: AtomicBool::new(false),
        }
    }

    /// `"serving"`, or `"stopping"` once the final flush began.
    fn state(&self) -> &'static str {
        if self.stopping.load(Ordering::Acquire) {
            "stopping"
        } else {
            "serving"
        }
    }

    /// Each export's drive counters, with its NBD counters (`nbd_*`) added.
    fn devices(&self) -> serde_json::Map<String, serde_json::Value> {
        self.exports
            .all()
            .iter()
            .map(|e| {
                let mut stats = e.device.stats();
                if let (Some(map), Ok(serde_json::Value::Object(nbd))) = (
                    stats.as_object_mut(),
                    serde_json::to_value(e.counters.snapshot()),
                ) {
                    for (k, v) in nbd {
                        map.insert(format!("nbd_{k}"), v);
                    }
                }
                (e.name.clone(), stats)
            })
            .collect()
    }

    /// The Prometheus text: the drives' metrics, then the NBD counters.
    pub fn metrics_text(&self) -> String {
        let devices = self.devices();
        crate::metrics::text::render(&devices, &crate::metrics::registry().snapshot())
            + &self.exports.prometheus()
    }

    fn writable(&self) -> impl Iterator<Item = &Arc<Export>> {
        self.exports.all().iter().filter(|e| !e.read_only)
    }
}

#[async_trait::async_trait]
impl Controlled for Served {
    fn stats(&self) -> serde_json::Value {
        serde_json::json!({
            "endpoint": self.endpoint,
            "pid": std::process::id(),
            "state": self.state(),
            "devices": self.devices(),
        })
    }

    fn metrics(&self) -> String {
        self.metrics_text()
    }

    async fn flush(&self) -> Result<(), String> {
        let errors = Closing::flush_all(self).await;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(closing::join_errors(&errors))
        }
    }
}

#[async_trait::async_trait]
impl Closing for Served {
    fn storage_unanswered(&self) -> bool {
        self.writable().any(|e| e.device.storage_unanswered())
    }

    async fn save_unflushed_all(&self, reason: &str) -> SavedUnflushed {
        let mut saved = SavedUnflushed::default();
        for export in self.writable() {
            match export.device.save_unflushed(reason).await {
                Ok(Some(path)) => saved.files.push(path),
                Ok(None) => {}
                Err(err) => {
                    saved.failed = true;
                    tracing::error!(export = %export.name, %err, "saving unflushed data failed");
                }
            }
        }
        saved
    }

    async fn flush_all(&self) -> Vec<FsError> {
        let mut errors = Vec::new();
        for export in self.writable() {
            if let Err(mut e) = export.device.flush().await {
                e.message = format!("flushing {}: {}", export.name, e.message);
                errors.push(e);
            }
        }
        errors
    }

    async fn close_all(&self) -> Vec<FsError> {
        let mut errors = Vec::new();
        for export in self.exports.all() {
            if let Err(mut e) = export.device.close().await {
                e.message = format!("closing {}: {}", export.name, e.message);
                errors.push(e);
            }
        }
        errors
    }
}

/// The control socket of the server: bound under the name of its endpoint
/// (`daemon::served`), so `blobdrive stats` and `unmount` reach it. It
/// answers until the server's very end, so a second `unmount` (or `stats`,
/// or a service manager's stop) during the final flush waits for it rather
/// than taking the server for dead. A run directory this user may not use,
/// or another daemon answering under that name, fails the start (as it
/// fails a mount).
pub(super) struct ControlSocket {
    /// Where it is bound.
    pub path: PathBuf,
    /// Its device and inode once bound: removed at the end only if the
    /// path still names this socket.
    identity: Option<(u64, u64)>,
}

impl ControlSocket {
    /// Binds the control socket for the server whose control key is `key`.
    pub fn bind(key: &Path) -> anyhow::Result<(ControlSocket, tokio::net::UnixListener)> {
        let path = control::socket_path_of_canonical(key);
        let listener = control::bind(&path)
            .map_err(|err| anyhow::anyhow!("no control socket for this server: {err:#}"))?;
        let identity = identity(&path);
        Ok((ControlSocket { path, identity }, listener))
    }

    /// Removes the socket file if it is still the one bound here (another
    /// server may have bound its own at the path since).
    pub fn remove_if_ours(&self) {
        if self.identity.is_some() && identity(&self.path) == self.identity {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}
