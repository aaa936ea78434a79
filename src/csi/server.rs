//! The socket the plugin serves on, and which services it serves there.
//!
//! The endpoint is a Unix socket, `unix:///PATH` (kubelet and the CSI
//! sidecars speak to the plugin through it; `unix:/PATH` is taken too). At
//! start a socket file left by an earlier plugin that no longer answers is
//! removed; a socket that answers (another plugin is serving) and anything
//! that is not a socket (a file, a directory, a link) are refused, never
//! removed. The socket is made with mode 0600 (the sidecars run as root)
//! and removed again when the plugin stops (calls under way get
//! [`SHUTDOWN_GRACE`] to finish; open idle connections do not hold it up).
//!
//! Roles: Identity is always served; Controller unless `node_only`; Node
//! unless `controller_only` (the usual layout is a controller Deployment and
//! a node DaemonSet, each with one role).

use std::future::Future;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use super::controller::ControllerService;
use super::credentials::AccountSource;
use super::identity::IdentityService;
use super::node::NodeService;
use super::services::{
    controller::controller_server::ControllerServer, identity::identity_server::IdentityServer,
    node::node_server::NodeServer,
};

/// How long calls under way may run on after the plugin is told to stop.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Which services one plugin process serves besides Identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// The Controller service (volumes made and deleted).
    pub controller: bool,
    /// The Node service (volumes attached on this host).
    pub node: bool,
}

/// What a plugin process is started with.
#[derive(Debug, Clone)]
pub struct Plugin {
    /// This node's id (NodeGetInfo returns it).
    pub node_id: String,
    /// The services served.
    pub roles: Roles,
    /// The account a call uses when its secrets name none.
    pub accounts: AccountSource,
}

/// The socket path of a `unix:///PATH` (or `unix:/PATH`) endpoint.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let Some(rest) = endpoint.strip_prefix("unix:") else {
        return Err(format!(
            "endpoint {endpoint} is not a Unix socket; give unix:///PATH"
        ));
    };
    // `unix:///p` (an empty authority) and `unix:/p` both name /p.
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if !path.starts_with('/') || path.len() < 2 {
        return Err(format!(
            "endpoint {endpoint} does not name an absolute socket path; give unix:///PATH"
        ));
    }
    Ok(PathBuf::from(path))
}

/// Binds the plugin's socket at `path` as the module comment says: a stale
/// socket is replaced, anything else there is refused.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!(
                    "another process already serves on {}; stop it first",
                    path.display()
                );
            }
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
            tracing::info!(socket = %path.display(), "removed a stale socket");
        }
        Ok(_) => bail!(
            "{} exists and is not a socket, so it was left alone; give another endpoint",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot check {}", path.display())),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot bind {}", path.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", path.display()))?;
    }
    Ok(listener)
}

/// Serves `plugin` on `listener` (bound at `path`) until `shutdown`
/// completes, then removes the socket.
pub async fn serve(
    plugin: Plugin,
    listener: UnixListener,
    path: &Path,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let identity = IdentityServer::new(IdentityService {
        controller: plugin.roles.controller,
    });
    let controller = plugin
        .roles
        .controller
        .then(|| ControllerServer::new(ControllerService::new(plugin.accounts.clone())));
    let node = plugin.roles.node.then(|| {
        NodeServer::new(NodeService::new(
            plugin.node_id.clone(),
            plugin.accounts.clone(),
        ))
    });
    tracing::info!(
        socket = %path.display(),
        node_id = %plugin.node_id,
        controller = plugin.roles.controller,
        node = plugin.roles.node,
        "serving CSI"
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .add_service(identity)
        .add_optional_service(controller)
        .add_optional_service(node)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
            let _ = stopped.await;
        });
    tokio::pin!(server);
    let served = tokio::select! {
        served = &mut server => served,
        () = shutdown => {
            // Calls under way may finish; a client that keeps its
            // connection open (kubelet does) must not hold the stop up.
            let _ = stop.send(());
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                Ok(served) => served,
                Err(_) => {
                    tracing::warn!("calls still open after {SHUTDOWN_GRACE:?}; stopping anyway");
                    Ok(())
                }
            }
        }
    };
    let _ = std::fs::remove_file(path);
    served.context("the CSI server failed")
}
