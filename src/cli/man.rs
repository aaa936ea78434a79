//! `blobdrive man DIR`: write the manual pages into DIR: `blobdrive.1`, one
//! `blobdrive-COMMAND.1` per command (from the clap definitions, plus the
//! hand-written sections of [`super::manpages`]) and `mount.blobdrive.8`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use super::{CmdResult, Context};

/// Arguments of `man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing), e.g.
    /// /usr/local/share/man/man1; section 8 goes there too.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Write every page and list the files written.
pub fn run(_ctx: &Context, args: &ManArgs) -> CmdResult {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let mut written = Vec::new();
    for (name, text) in super::manpages::all_pages() {
        let path = args.dir.join(&name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
    }
    super::output::print_text(&format!("{}\n", written.join("\n")));
    Ok(())
}
