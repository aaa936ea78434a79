//! The metrics exporters of a mount or an NBD server (`--metrics-listen`,
//! `--metrics-textfile`): started once the daemon serves, stopped when it
//! ends. The listener is bound
//! before the mount reports ready, so a port in use fails the mount with one
//! line instead of leaving it silently unscraped; the textfile is removed at
//! the end so node_exporter does not keep reporting a mount that is gone.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::metrics::export;

/// Where a mount's metrics go (both off by default).
#[derive(Debug, Clone, Default)]
pub struct MetricsOptions {
    /// Serve `GET /metrics` here (already checked: loopback unless asked).
    pub listen: Option<SocketAddr>,
    /// Write `blobdrive_<mount key>.prom` into this directory.
    pub textfile_dir: Option<PathBuf>,
}

/// The running exporters of one daemon.
pub struct Exporters {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    textfile: Option<PathBuf>,
}

/// The listener of `opts`, bound now (inside the runtime), if one is asked for.
pub fn bind(opts: &MetricsOptions) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    opts.listen.map(export::bind).transpose()
}

impl Exporters {
    /// Start serving `listener` and writing the textfile named by `key`
    /// (a mount key: `mountpoint::mount_key` of the canonical mount point,
    /// or of an NBD server's endpoint), rendering with `render`.
    pub fn start(
        runtime: &tokio::runtime::Handle,
        listener: Option<tokio::net::TcpListener>,
        opts: &MetricsOptions,
        render: export::Render,
        key: &str,
    ) -> Self {
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
            .map(|dir| export::textfile_path(dir, key));
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
