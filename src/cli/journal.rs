//! Logging to the systemd journal. A process whose stderr is the journal
//! (systemd says so in `JOURNAL_STREAM=DEV:INODE`, which must match stderr:
//! children of a unit inherit the variable even when their stderr goes
//! elsewhere, e.g. a test run from a shell started by a unit) sends its log
//! events to journald as structured entries instead: the
//! message, the priority from the level, every event field as an upper-case
//! journal field (`op` becomes `OP`), and `DRIVE=container/blob` on every
//! entry of a process that attaches one drive, so
//! `journalctl -u blobdrive@data DRIVE=disks/data.vhd` finds them. Without
//! a journal socket, logs stay on stderr.

/// The journal layer, when this process runs under systemd and journald
/// listens; `None` means log to stderr.
pub fn layer(drive: Option<&str>) -> Option<tracing_journald::Layer> {
    if !stderr_is_journal(std::env::var("JOURNAL_STREAM").ok().as_deref()) {
        return None;
    }
    let layer = tracing_journald::layer().ok()?;
    let mut layer = layer
        .with_field_prefix(None)
        .with_syslog_identifier("blobdrive".into());
    if let Some(drive) = drive {
        layer = layer.with_custom_fields([("DRIVE", drive)]);
    }
    Some(layer)
}

/// Whether `journal_stream` (`DEV:INODE`) names the file stderr is.
fn stderr_is_journal(journal_stream: Option<&str>) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Some((dev, ino)) = journal_stream.and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse::<u64>() == Ok(meta.dev()) && ino.parse::<u64>() == Ok(meta.ino())
}

/// The drive a command line attaches (`mount C/B DIR`), for the `DRIVE` field.
pub fn drive_of(command: &super::Command) -> Option<String> {
    match command {
        super::Command::Mount(args) => args
            .source_and_dir()
            .0
            .filter(|s| s.contains('/'))
            .map(str::to_string),
        _ => None,
    }
}
