//! A mount's metrics exporters (`--metrics-listen`, `--metrics-textfile`):
//! started once the mount serves, stopped when it ends. The listener is bound
//! before the mount reports ready, so a port in use fails the mount with one
//! line instead of leaving it silently unscraped; the textfile is removed at
//! the end so node_exporter does not keep reporting a mount that is gone.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::fs::FsCore;
use crate::metrics::export;

/// Where a mount's metrics go (both off by default).
#[derive(Debug, Clone, Default)]
pub struct MetricsOptions {
    /// Serve `GET /metrics` here (already checked: loopback unless asked).
    pub listen: Option<SocketAddr>,
    /// Write `blobdrive_<mount key>.prom` into this directory.
    pub textfile_dir: Option<PathBuf>,
}

/// The running exporters of one mount.
pub(crate) struct Exporters {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    textfile: Option<PathBuf>,
}

/// The listener of `opts`, bound now (inside the runtime), if one is asked for.
pub(crate) fn bind(opts: &MetricsOptions) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    opts.listen.map(export::bind).transpose()
}

impl Exporters {
    /// Start serving `listener` and writing the textfile of the mount at
    /// `mountpoint` (canonical), rendering from `core`.
    pub fn start(
        runtime: &tokio::runtime::Runtime,
        listener: Option<tokio::net::TcpListener>,
        opts: &MetricsOptions,
        core: Arc<FsCore>,
        mountpoint: &Path,
    ) -> Self {
        let render: export::Render = Arc::new(move || super::control::metrics_text(&core));
        let mut tasks = Vec::new();
        if let Some(listener) = listener {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving metrics at http://{addr}/metrics");
            }
            tasks.push(runtime.spawn(export::serve(listener, render.clone())));
        }
        let textfile = opts
            .textfile_dir
            .as_ref()
            .map(|dir| export::textfile_path(dir, &super::mountpoint::mount_key(mountpoint)));
        if let Some(path) = &textfile {
            tasks.push(runtime.spawn(export::write_periodically(path.clone(), render)));
        }
        Exporters { tasks, textfile }
    }

    /// Stop both and remove the textfile.
    pub fn stop(self) {
        for task in self.tasks {
            task.abort();
        }
        if let Some(path) = self.textfile {
            let _ = std::fs::remove_file(path);
        }
    }
}
