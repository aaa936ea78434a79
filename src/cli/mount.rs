//! `blobdrive mount C/B DIR` attaches one drive (lease, FUSE file, loop device,
//! filesystem at DIR); `blobdrive mount [C] DIR` mounts the account or one
//! container as directories. Which one is decided by the source: a name with a
//! `/` (or a URL) is a drive, a bare name a container, none the account.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context as _};
use clap::Args;

use super::{CmdResult, CodedError, Context};
use crate::blob::{self, BlobClient, BlobPath, BlobType, LeaseState};
use crate::daemon::{run_mount, AttachOptions, MetricsOptions, MountOptions, PartitionArea};
use crate::drive::DriveOptions;
use crate::fs::azure::AzureCatalog;
use crate::fs::one_drive::OneDriveCatalog;
use crate::fs::{Catalog, EntryPath};
use crate::partition::choose::{choose, describe_fs, DriveNames};
use crate::partition::Selector;
use crate::units::VHD_FOOTER_BYTES;

/// Arguments of `mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// `C/B DIR` for a drive, `C DIR` for a container, `DIR` for the account.
    /// A drive may be a blob URL, also one with a SAS, which is safer off the
    /// command line: in AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_SAS_TOKEN with
    /// C/B as the drive, or in mount.blobdrive's credentials= file.
    #[arg(value_name = "SOURCE", num_args = 1..=2, required = true)]
    pub operands: Vec<String>,
    /// Mount read-only (no lease; any number of hosts may do this).
    #[arg(long, short = 'r')]
    pub read_only: bool,
    /// Mount this snapshot (always read-only).
    #[arg(long, value_name = "TIME")]
    pub snapshot: Option<String>,
    /// The drive engine's memory, flush and disk tier settings.
    #[command(flatten)]
    pub cache: super::attach_flags::CacheFlags,
    /// Stay in the foreground instead of detaching.
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// Take the drive over from a host that holds its lease (breaks the lease).
    #[arg(long)]
    pub break_lease: bool,
    /// Let users other than the one mounting use the mount (FUSE allow_other).
    #[arg(long)]
    pub allow_other: bool,
    /// Where a background daemon writes its log (default: nowhere; -v sets the level).
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Options for the drive's filesystem, as for mount -o (e.g. noatime,discard);
    /// `ro` is the same as --read-only, `partition=N` as --partition N.
    #[arg(long = "fs-options", short = 'o', value_name = "OPTS")]
    pub fs_options: Vec<String>,
    /// Which partition of an MBR or GPT drive to attach: its number, or `auto`
    /// (the whole disk when it has no partition table, else the one partition
    /// holding a filesystem, else the largest Linux one; it says which).
    #[arg(long, value_name = "N|auto")]
    pub partition: Option<Selector>,
    /// Where the metrics go.
    #[command(flatten)]
    pub metrics: super::attach_flags::MetricsFlags,
    /// The key of an encrypted drive (a passphrase is asked for on a
    /// terminal when neither flag is given).
    #[command(flatten)]
    pub key: super::key::KeyFlags,
}

impl MountArgs {
    /// The drive engine's settings these flags ask for.
    pub fn drive_options(&self) -> DriveOptions {
        self.cache.drive_options()
    }

    /// Where the metrics go; a bad or non-loopback `--metrics-listen` is a
    /// usage error.
    pub fn metrics_options(&self) -> anyhow::Result<MetricsOptions> {
        self.metrics.metrics_options()
    }

    /// The source (`C/B`, `C`, or none for the account) and the mount point.
    pub fn source_and_dir(&self) -> (Option<&str>, PathBuf) {
        match self.operands.as_slice() {
            [source, dir] => (Some(source.as_str()), PathBuf::from(dir)),
            [dir] => (None, PathBuf::from(dir)),
            // clap guarantees one or two operands.
            _ => (None, PathBuf::new()),
        }
    }
}

/// Run `mount`.
pub fn run(ctx: &Context, args: &MountArgs) -> CmdResult {
    // Usage errors first, before any request or privilege check.
    args.metrics_options()?;
    let (source, dir) = args.source_and_dir();
    match source {
        Some(s) if s.contains('/') => mount_drive(ctx, s, &dir, args),
        container => mount_namespace(ctx, container, &dir, args),
    }
}

/// `mount C/B DIR`: lease, private FUSE file, loop device, filesystem at DIR.
fn mount_drive(ctx: &Context, source: &str, dir: &Path, args: &MountArgs) -> CmdResult {
    let mut path = BlobPath::parse(source)?;
    if let Some(time) = &args.snapshot {
        if path.snapshot.as_ref().is_some_and(|t| t != time) {
            return Err(CodedError::usage(format!(
                "{source} names snapshot {} but --snapshot says {time}",
                path.snapshot.as_deref().unwrap_or_default()
            ))
            .into());
        }
        path.snapshot = Some(time.clone());
    }
    let (fs_options, ro_option, partition_option) = split_fs_options(&args.fs_options)?;
    let selector = match (args.partition, partition_option) {
        (Some(a), Some(b)) if a != b => {
            return Err(CodedError::usage(format!(
                "--partition and -o partition= name different partitions ({a}, {b}): give one"
            ))
            .into())
        }
        (a, b) => a.or(b).unwrap_or_default(),
    };
    let read_only = args.read_only || ro_option || path.snapshot.is_some();
    if args.break_lease && read_only {
        return Err(CodedError::usage(
            "--break-lease takes a drive over for writing; a read-only or snapshot \
             attach holds no lease and needs none",
        )
        .into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(anyhow::anyhow!(
            "attaching a drive needs root: it sets up a loop device and mounts a filesystem; \
             run it with sudo, or use a namespace mount ('blobdrive mount {} DIR') to get the drive as a file",
            path.container
        ));
    }
    // A bad DIR is said before anything is asked of storage.
    crate::daemon::check_mountpoint(dir)?;
    // Checked before the fork, so a bad account fails in the user's terminal.
    let account = ctx.account_for(source)?;
    // Read before the fork, so what the drive holds, and which partition was
    // chosen, is said in the user's terminal; the key too, so a missing or
    // wrong one fails there, before anything is leased or mounted.
    let (partition, data_key) = choose_area(&account, &path, selector, !read_only, &args.key)?;
    let drive = EntryPath {
        container: path.container.clone(),
        blob: path.name.clone(),
        snapshot: path.snapshot.clone(),
    };
    let drive_options = args.drive_options();
    let opts = MountOptions {
        read_only,
        foreground: args.foreground,
        allow_other: false,
        container: Some(path.container.clone()),
        log_file: args.log_file.clone(),
        source: Some(format!("blobdrive:{path}")),
        attach: Some(AttachOptions {
            drive: drive.clone(),
            account: account.name.clone(),
            fs_options,
            partition,
            write_log_bytes: write_log_bytes(&drive_options),
            data_key: data_key.clone(),
        }),
        metrics: args.metrics_options()?,
    };
    let break_lease = args.break_lease;
    run_mount(dir, &opts, move |takeover| {
        let (account, path, drive) = (account.clone(), path.clone(), drive.clone());
        let (mut drive_options, data_key) = (drive_options.clone(), data_key.clone());
        // Every serving process of this attach (a later one takes over after
        // a crash or an upgrade) proposes the attach's one lease id.
        if let Some(id) = crate::daemon::holder::attach_lease_id() {
            drive_options.lease_id = Some(id);
            // A successor continues the attach's writer lineage: it takes
            // the lease again only if no one wrote since (`blob/lineage.rs`).
            drive_options.lineage = crate::daemon::holder::attach_lineage(takeover);
        }
        async move {
            let client = BlobClient::new(account)?;
            // Only the first: a takeover's lease is its own.
            if break_lease && !takeover {
                break_stale_lease(&client, &path.base()).await?;
            }
            let size_bytes = drive_size(&client, &path).await?;
            crate::daemon::holder::record_drive_bytes(size_bytes);
            let inner: Arc<dyn Catalog> =
                Arc::new(AzureCatalog::new(client, drive_options).with_data_key(data_key));
            let catalog: Arc<dyn Catalog> =
                Arc::new(OneDriveCatalog::new(inner, drive, size_bytes));
            Ok(catalog)
        }
    })
}

/// The write log of a read-write attach holds what the drive's dirty limit
/// lets the cache keep, plus the writes the kernel may have in flight
/// meanwhile (the log asks for a flush when half full).
fn write_log_bytes(drive: &DriveOptions) -> u64 {
    let in_flight = crate::fs::fuse::MAX_WRITE_DATA_IN_FLIGHT as u64;
    drive.memory_budget().dirty_bytes + 2 * in_flight
}

/// Splits `-o` values into the inner filesystem's options, whether `ro` was
/// among them (`rw` is the default and dropped), and the `partition=N` asked for.
pub fn split_fs_options(
    values: &[String],
) -> Result<(Vec<String>, bool, Option<Selector>), CodedError> {
    let mut options = Vec::new();
    let mut read_only = false;
    let mut partition = None;
    for option in values.iter().flat_map(|v| v.split(',')).map(str::trim) {
        match option {
            "" | "rw" => {}
            "ro" => read_only = true,
            other => match other.strip_prefix("partition=") {
                Some(n) => {
                    partition = Some(
                        n.parse::<Selector>()
                            .map_err(|e| CodedError::usage(format!("-o partition: {e}")))?,
                    )
                }
                None => options.push(other.to_string()),
            },
        }
    }
    Ok((options, read_only, partition))
}

/// Unlocks an encrypted drive's data key, then reads the drive's partition
/// table (through that key: an encrypted drive's layout is plaintext only
/// once unlocked) and picks what to attach: `None` for the whole disk (no
/// table), else the partition. Says which one `auto` picked. Returns the
/// area and the key.
fn choose_area(
    account: &crate::blob::Account,
    path: &BlobPath,
    selector: Selector,
    read_write: bool,
    key_flags: &super::key::KeyFlags,
) -> anyhow::Result<(Option<PartitionArea>, Option<Arc<crate::crypt::DataKey>>)> {
    let client = BlobClient::new(account.clone())?;
    let size_bytes = super::drives::block_on_value(drive_size(&client, path))?;
    if read_write {
        // Credentials that may not write fail here, as they would at the
        // lease, before anything is said about what the drive holds.
        super::drives::block_on_value(require_write(&client, path))?;
    }
    let base = path.base().to_string();
    let (layout, key) = super::drives::block_on_value(async {
        let key = super::key::unlock(&client, path, key_flags).await?;
        let store = crate::lifecycle::layout::store_for(&client, path, key.clone());
        let layout =
            crate::lifecycle::layout::read_layout(store, &path.to_string(), size_bytes).await?;
        Ok((layout, key))
    })?;
    let layout =
        layout.map_err(|e| anyhow!("drive {path}: {e}; nothing was attached or changed"))?;
    if let Some(table) = &layout.table {
        for w in &table.warnings {
            eprintln!("blobdrive: warning: drive {path}: {w}");
        }
    }
    let names = DriveNames {
        drive: &base,
        container: &path.container,
        blob: &path.name,
    };
    let choice = choose(&layout, selector, &names).map_err(|line| anyhow!(line))?;
    let Some(number) = choice.number else {
        return Ok((None, key));
    };
    if let Some(reason) = &choice.reason {
        eprintln!(
            "blobdrive: attaching partition {number} of {path} ({}, {}): {reason}; \
             --partition N picks another",
            describe_fs(choice.filesystem.as_ref()),
            crate::units::format_size(choice.size_bytes)
        );
    }
    Ok((
        Some(PartitionArea {
            number,
            offset_bytes: choice.offset_bytes,
            size_bytes: choice.size_bytes,
        }),
        key,
    ))
}

/// CloudDrive's Mount(Force): breaks whatever lease the drive has, so this
/// host can take it. The host that held it loses its unflushed writes.
async fn break_stale_lease(client: &BlobClient, path: &BlobPath) -> anyhow::Result<()> {
    let props = client
        .get_properties(path)
        .await
        .map_err(|e| not_found_or(e, path))?;
    if props.lease_state == Some(LeaseState::Leased) {
        tracing::warn!(
            drive = %path,
            "breaking the lease of {path} (--break-lease): a host that still has it \
             mounted can no longer write to it"
        );
        client
            .break_lease(path, Some(0))
            .await
            .with_context(|| format!("cannot break the lease of {path}"))?;
    }
    Ok(())
}

/// The disk size of drive `path`, after checking it is one (page blob with a
/// valid fixed VHD footer).
/// Fails with one line when the credentials may not write `path` (asked
/// with a probe that changes nothing: `blob::probe::may_write`).
pub(super) async fn require_write(client: &BlobClient, path: &BlobPath) -> anyhow::Result<()> {
    let blob_bytes = client
        .get_properties(path)
        .await
        .map_err(|e| not_found_or(e, path))?
        .content_length;
    let allowed = blob::probe::may_write(client, path, blob_bytes)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    if allowed {
        return Ok(());
    }
    let name = &client.account().name;
    Err(match client.account().credential {
        blob::Credential::Sas(_) => anyhow!(
            "the SAS token for account '{name}' does not allow this operation (writing \
             {path}): a read-write mount needs write permission; with a read-only SAS, \
             mount with --read-only"
        ),
        _ => anyhow!(
            "the credentials for account '{name}' may not write {path}: a read-write mount \
             needs write permission; mount it with --read-only"
        ),
    })
}

pub(super) async fn drive_size(client: &BlobClient, path: &BlobPath) -> anyhow::Result<u64> {
    let props = client
        .get_properties(path)
        .await
        .map_err(|e| not_found_or(e, path))?;
    let size = props.content_length;
    if props.blob_type != Some(BlobType::PageBlob) || size < 2 * VHD_FOOTER_BYTES {
        bail!("{path} is not a drive: not a page blob holding a fixed VHD");
    }
    // At the end, or (a grow interrupted after the blob grew, as its
    // recorded intent says) at the old size: the drive then opens at it.
    let store = crate::drive::BlobPageStore::new(client.clone(), path.clone());
    let found = crate::drive::resize::locate_footer(&store, size)
        .await
        .map_err(|e| match e {
            crate::drive::Error::Backend(b) => anyhow!("cannot read the VHD footer of {path}: {b}"),
            crate::drive::Error::NotADrive { reason } => anyhow!("{path} is not a drive: {reason}"),
            other => anyhow!("cannot open {path}: {other}"),
        })?;
    Ok(found.offset_bytes)
}

fn not_found_or(err: blob::Error, path: &BlobPath) -> anyhow::Error {
    if err.is_not_found() {
        match &path.snapshot {
            Some(t) => anyhow!(
                "drive {} has no snapshot {t} (or does not exist)",
                path.base()
            ),
            None => anyhow!("drive {path} does not exist"),
        }
    } else {
        anyhow::Error::new(err).context(format!("cannot read drive {path}"))
    }
}

/// The account (or one container) as directories, drives as files.
fn mount_namespace(
    ctx: &Context,
    container: Option<&str>,
    dir: &Path,
    args: &MountArgs,
) -> CmdResult {
    if args.snapshot.is_some() {
        return Err(CodedError::usage(
            "--snapshot applies to a drive (C/B DIR); a namespace mount shows \
             snapshots as read-only files anyway",
        )
        .into());
    }
    if args.break_lease {
        return Err(CodedError::usage("--break-lease applies to a drive (C/B DIR)").into());
    }
    // Read here, before the fork: a missing or malformed key file fails in
    // the user's terminal. Which drives it opens is found at each open.
    let user_key = if args.key.source().is_given() {
        args.key.source().read("", false)?
    } else {
        None
    };
    if !args.fs_options.is_empty() {
        return Err(
            CodedError::usage("-o/--fs-options applies to a drive's filesystem (C/B DIR)").into(),
        );
    }
    if let Some(c) = container {
        blob::path::validate_container_name(c)?;
    }
    // Checked before the fork, so a bad account fails in the user's terminal.
    let account = ctx.account()?;
    let opts = MountOptions {
        read_only: args.read_only,
        foreground: args.foreground,
        allow_other: args.allow_other,
        container: container.map(str::to_string),
        log_file: args.log_file.clone(),
        source: Some(match container {
            Some(c) => format!("{}/{c}", account.name),
            None => account.name.clone(),
        }),
        attach: None,
        metrics: args.metrics_options()?,
    };
    let drive_options = args.drive_options();
    let container = container.map(str::to_string);
    // A namespace mount's catalog is made once (no takeover): the key moves
    // into it.
    let user_key = std::sync::Mutex::new(user_key);
    run_mount(dir, &opts, move |_takeover| {
        let (account, container) = (account.clone(), container.clone());
        let drive_options = drive_options.clone();
        let user_key = user_key.lock().expect("user key mutex poisoned").take();
        async move {
            let client = blob::BlobClient::new(account)?;
            match &container {
                Some(c) => {
                    // Fail now, not at the first `ls`, when the container is missing.
                    let probe = blob::ListBlobsOptions {
                        max_results: Some(1),
                        ..Default::default()
                    };
                    client
                        .list_blobs(c, &probe)
                        .await
                        .with_context(|| format!("cannot mount container {c}"))?;
                }
                None => {
                    client
                        .list_containers()
                        .await
                        .context("cannot list the account's containers")?;
                }
            }
            let catalog: Arc<dyn Catalog> =
                Arc::new(AzureCatalog::new(client, drive_options).with_user_key(user_key));
            Ok(catalog)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn mount_args(argv: &[&str]) -> MountArgs {
        let all = ["blobdrive", "mount"].iter().chain(argv.iter());
        match Cli::try_parse_from(all).expect("parses").command {
            Command::Mount(a) => a,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn partition_comes_from_the_flag_or_from_o() {
        let a = mount_args(&["c/d.vhd", "/mnt/d", "--partition", "2"]);
        assert_eq!(a.partition, Some(Selector::Number(2)));
        let (opts, ro, part) =
            split_fs_options(&["noatime,partition=auto".into(), "ro".into()]).unwrap();
        assert_eq!(
            (opts, ro, part),
            (vec!["noatime".to_string()], true, Some(Selector::Auto))
        );
        assert!(split_fs_options(&["partition=0".into()]).is_err());
    }

    #[test]
    fn one_operand_is_the_mount_point_of_the_account() {
        let a = mount_args(&["/mnt/ns"]);
        assert_eq!(a.source_and_dir(), (None, PathBuf::from("/mnt/ns")));
        assert_eq!(a.cache.cache_size, 512 << 20);
    }

    #[test]
    fn two_operands_are_source_then_mount_point() {
        let a = mount_args(&["c/disk.vhd", "/mnt/d", "--cache-size", "2G"]);
        assert_eq!(
            a.source_and_dir(),
            (Some("c/disk.vhd"), PathBuf::from("/mnt/d"))
        );
        assert_eq!(a.cache.cache_size, 2 << 30);
    }
}
