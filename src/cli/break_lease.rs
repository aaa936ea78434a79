//! `blobdrive break-lease C/B`: break a stale mount lock left by a host that
//! crashed, so the drive can be mounted read-write (or deleted) again.
//!
//! The break takes effect at once (break period 0). A blob that holds no lease
//! is not an error: the command says so and exits 0, so it is safe in scripts.

use clap::Args;

use super::drives::{self, blob_err};
use super::{output, CmdResult, Context};

/// Arguments of `break-lease`.
#[derive(Debug, Args)]
pub struct BreakLeaseArgs {
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
}

/// Run `break-lease`.
pub fn run(ctx: &Context, args: &BreakLeaseArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, None)?;
    drives::require_base(&path, "snapshots have no lease")?;
    let client = drives::connect_for(ctx, &args.blob)?;
    drives::block_on(async move {
        let props = drives::properties(&client, &path).await?;
        let was = drives::lease_text(props.lease_state, props.lease_duration);
        if !drives::is_leased(props.lease_state) {
            output::print_text(&format!(
                "{path} was not leased ({was}); nothing to break\n"
            ));
            return Ok(());
        }
        match client.break_lease(&path, Some(0)).await {
            Ok(_) => {
                tracing::info!(drive = %path, "lease broken");
                output::print_text(&format!(
                    "broke the lease on {path} (was {was}); it can be mounted read-write again\n"
                ));
                Ok(())
            }
            // Released or broken by its holder between the two requests.
            Err(e) if e.code() == Some("LeaseNotPresentWithLeaseOperation") => {
                output::print_text(&format!(
                    "{path} was not leased any more; nothing to break\n"
                ));
                Ok(())
            }
            Err(e) => Err(blob_err(e)),
        }
    })
}
