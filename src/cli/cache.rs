//! `blobdrive cache clear [--cache-dir DIR]`: empty the disk tier.
//!
//! Removes every drive's cache under the cache directory (default
//! `/var/cache/blobdrive`, the default of `mount --cache-dir`), in the
//! tier's current layout and in an older one (`disk_cache::clear`), except those a
//! running mount holds (their lock is taken): they are counted and left, and
//! the command still exits 0, so it is safe to run at any time. Only
//! directories shaped like a drive's cache are removed; anything else there
//! (or a layout directory that is a symbolic link) is left and named.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use super::{output, CmdResult, Context};
use crate::drive::disk_cache::{self, DEFAULT_CACHE_DIR};

/// Arguments of `cache`.
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// What to do with the cache.
    #[command(subcommand)]
    pub action: CacheAction,
}

/// The `cache` actions.
#[derive(Debug, Subcommand)]
pub enum CacheAction {
    /// Remove every cached drive not in use by a mount.
    Clear {
        /// The cache directory (as given to `mount --cache-dir`).
        #[arg(long, value_name = "DIR", default_value = DEFAULT_CACHE_DIR)]
        cache_dir: PathBuf,
    },
}

/// Run `cache`.
pub fn run(_ctx: &Context, args: &CacheArgs) -> CmdResult {
    match &args.action {
        CacheAction::Clear { cache_dir } => {
            let done = disk_cache::clear(cache_dir)
                .with_context(|| format!("cannot clear the cache in {}", cache_dir.display()))?;
            let mut text = format!(
                "removed the cache of {} drive(s) from {}\n",
                done.removed,
                cache_dir.display()
            );
            if done.in_use > 0 {
                text.push_str(&format!(
                    "left {} in use by a mount; unmount it and run this again\n",
                    done.in_use
                ));
            }
            if !done.left.is_empty() {
                let names: Vec<String> =
                    done.left.iter().map(|p| p.display().to_string()).collect();
                text.push_str(&format!(
                    "left alone, not the cache of a drive: {}\n",
                    names.join(", ")
                ));
            }
            output::print_text(&text);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    #[test]
    fn clear_defaults_to_the_system_cache_dir() {
        let cli = Cli::try_parse_from(["blobdrive", "cache", "clear"]).unwrap();
        let Command::Cache(a) = cli.command else {
            panic!("not cache")
        };
        let CacheAction::Clear { cache_dir } = a.action;
        assert_eq!(cache_dir, PathBuf::from(DEFAULT_CACHE_DIR));
    }

    #[test]
    fn clear_of_a_missing_dir_succeeds() {
        let tmp = tempfile::tempdir().unwrap();
        let args = CacheArgs {
            action: CacheAction::Clear {
                cache_dir: tmp.path().join("none"),
            },
        };
        run(&Context::default(), &args).unwrap();
    }
}
