//! `blobdrive resize C/B --size S [--allow-shrink] [--json]`: change a
//! drive's size. Attached read-write on this host: grown in place (blob,
//! FUSE file, loop device, filesystem) with no remount. Not attached:
//! resized offline under a lease of 60 s renewed while it runs, released
//! at the end and on Ctrl-C (SIGINT) or SIGTERM. Leased by another host:
//! refused.
//! The work is in `crate::lifecycle::resize`.

use clap::Args;

use super::drives;
use super::{output, values, CmdResult, CodedError, Context};
use crate::daemon::registry;
use crate::lifecycle::resize::{self, ResizeReport};
use crate::units::format_size;

/// Arguments of `resize`.
#[derive(Debug, Args)]
#[command(
    after_help = "Offline (not attached here), the drive is locked by a 60-second lease, renewed while the \
                  resize runs and released when it ends. Ctrl-C or SIGTERM stops it between two steps \
                  (run it again to finish) and releases the lease; after kill -9 the lease expires by \
                  itself within 60 s ('blobdrive break-lease' frees it at once)."
)]
pub struct ResizeArgs {
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// The new disk size: a whole number of MiB (512M, 10G, 1T).
    #[arg(long, value_name = "SIZE", value_parser = values::drive_size)]
    pub size: u64,
    /// Allow a smaller size (offline only, and only when no filesystem reaches past it).
    #[arg(long)]
    pub allow_shrink: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// The key of an encrypted drive, for a shrink's check of what it holds
    /// (without it, an encrypted drive's layout is unknown and a shrink is
    /// allowed only when no data is stored past the new end).
    #[command(flatten)]
    pub key: super::key::KeyFlags,
}

/// Run `resize`.
pub fn run(ctx: &Context, args: &ResizeArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, None)?;
    drives::require_base(&path, "a snapshot cannot be resized")?;
    let client = drives::connect_for(ctx, &args.blob)?;
    let drive = format!("{}/{}", path.container, path.name);
    let report = match registry::find_read_write(&client.account().name, &drive) {
        Some(entry) => resize::resize_online(&entry, args.size)?,
        None => {
            let size = args.size;
            let allow = args.allow_shrink;
            let mut out = None;
            drives::block_on(async {
                // Only a given key is used: a grow needs none, so no prompt.
                let key = if args.key.source().is_given() {
                    super::key::unlock(&client, &path, &args.key).await?
                } else {
                    None
                };
                let cancel = super::copy::stop_signals("resize")?;
                out = Some(resize::resize_offline(&client, &path, size, allow, key, cancel).await?);
                Ok(())
            })
            .map_err(|e| match e.downcast::<resize::ShrinkNotAllowed>() {
                Ok(refusal) => CodedError::usage(refusal.0).into(),
                Err(other) => other,
            })?;
            out.expect("block_on ran the resize")
        }
    };
    if args.json {
        output::print_json(&report);
    } else {
        output::print_text(&summary(&report));
    }
    Ok(())
}

/// The lines printed after a resize.
pub fn summary(r: &ResizeReport) -> String {
    let how = if r.online {
        match (&r.filesystem, r.filesystem_grown) {
            (Some(fs), true) => format!(" in place (loop device and {fs} filesystem grown)"),
            _ => " in place (loop device grown)".to_string(),
        }
    } else {
        String::new()
    };
    let mut out = format!(
        "resized {} from {} to {}{how}\n",
        r.drive,
        format_size(r.old_size_bytes),
        format_size(r.new_size_bytes)
    );
    if r.finished_interrupted {
        out.push_str("  (an interrupted resize was finished)\n");
    }
    if let Some(todo) = &r.todo {
        out.push_str(&format!("  left to do: {todo}\n"));
    }
    out
}
