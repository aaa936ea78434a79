//! `blobdrive csi --endpoint unix:///PATH --node-id ID [--controller-only |
//! --node-only]`: serve the Kubernetes CSI plugin (`crate::csi`) on a Unix
//! socket until SIGTERM or SIGINT.
//!
//! The account a call works in comes from its CSI secrets, else from the
//! global flags and the environment, as for every command. Errors before
//! serving (a bad endpoint, a path that is not a stale socket of ours) end
//! in the usual one line.

use clap::Args;

use super::{CmdResult, CodedError, Context};
use crate::csi::credentials::AccountSource;
use crate::csi::server::{bind, serve, socket_path, Plugin, Roles};

/// Arguments of `csi`.
#[derive(Debug, Args)]
pub struct CsiArgs {
    /// The socket to serve on, unix:///PATH (as the CSI sidecars give it).
    #[arg(long, value_name = "unix:///PATH", env = "CSI_ENDPOINT")]
    pub endpoint: String,
    /// This node's id, as Kubernetes names the node.
    #[arg(long, value_name = "ID")]
    pub node_id: String,
    /// Serve Identity and Controller only (the controller Deployment).
    #[arg(long, conflicts_with = "node_only")]
    pub controller_only: bool,
    /// Serve Identity and Node only (the node DaemonSet).
    #[arg(long)]
    pub node_only: bool,
}

/// Run `csi`.
pub fn run(ctx: &Context, args: &CsiArgs) -> CmdResult {
    let path = socket_path(&args.endpoint).map_err(CodedError::usage)?;
    if args.node_id.trim().is_empty() {
        return Err(CodedError::usage("--node-id is empty").into());
    }
    let plugin = Plugin {
        node_id: args.node_id.clone(),
        roles: Roles {
            controller: !args.node_only,
            node: !args.controller_only,
        },
        accounts: AccountSource {
            connection_string: ctx.connection_string.clone(),
            options: ctx.account_options.clone(),
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    rt.block_on(async move {
        let listener = bind(&path)?;
        let stop = async {
            use tokio::signal::unix::{signal, SignalKind};
            match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => std::future::pending::<()>().await,
            }
            tracing::info!("stopping the CSI plugin");
        };
        serve(plugin, listener, &path, stop).await
    })
}
