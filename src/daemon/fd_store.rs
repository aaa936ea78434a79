//! systemd's file descriptor store, for an attach run by the unit template.
//!
//! The holder keeps the FUSE connection, the attach's state and its write
//! log, so a serving process may die at any time. Under systemd the holder
//! also hands those three descriptors to the service manager once the
//! first serving process is ready (`FDSTORE=1`, one name each): then even
//! the holder's own death (`kill -9` of the unit's main process, a bug in
//! the holder) costs a pause. Its serving process dies with it (a parent
//! death signal, so systemd need not wait for it), systemd starts the unit
//! again (`Restart=on-failure`) and passes the descriptors back
//! (`LISTEN_FDS`, `LISTEN_FDNAMES`), and the new holder takes the attach
//! over exactly as after a crash of its serving process. When the attach
//! ends (unmount, a failed start, a salvage), the holder asks systemd to
//! close them (`FDSTOREREMOVE=1`), so a later start attaches afresh.
//! systemd also drops by itself a stored FUSE descriptor whose connection
//! ended (it polls as an error).

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::readiness::notify_systemd_with_fds;

/// Name of the stored FUSE connection.
pub const FUSE: &str = "blobdrive-fuse";
/// Name of the stored attach state.
pub const STATE: &str = "blobdrive-state";
/// Name of the stored write log.
pub const LOG: &str = "blobdrive-log";
/// Environment variable giving the store's size (the unit's
/// `FileDescriptorStoreMax=`): systemd 254 and later set it; the unit
/// template sets it too, for older ones.
pub const SIZE_ENV: &str = "FDSTORE";
/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const FIRST_FD: RawFd = 3;
/// More passed descriptors than this is not an attach's store.
const MOST_FDS: usize = 16;

/// True when a service manager keeps descriptors for this process:
/// `$NOTIFY_SOCKET` is set and `$FDSTORE` allows at least the three.
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
        && std::env::var(SIZE_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .is_some_and(|n| n >= 3)
}

/// Hands the attach's descriptors to the service manager.
pub fn keep(
    dev: BorrowedFd<'_>,
    state: BorrowedFd<'_>,
    log: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    for (name, fd) in [(FUSE, Some(dev)), (STATE, Some(state)), (LOG, log)] {
        if let Some(fd) = fd {
            notify_systemd_with_fds(&format!("FDSTORE=1\nFDNAME={name}"), &[fd])?;
        }
    }
    Ok(())
}

/// Asks the service manager to close what [`keep`] stored (the attach
/// ended). Failures are logged: systemd closes the store when the unit
/// stops anyway.
pub fn forget() {
    for name in [FUSE, STATE, LOG] {
        if let Err(err) = notify_systemd_with_fds(&format!("FDSTOREREMOVE=1\nFDNAME={name}"), &[]) {
            tracing::warn!(%err, name, "cannot ask systemd to drop a stored descriptor");
        }
    }
}

/// Marks the descriptors the service manager passed to this process
/// close-on-exec at once (call first thing): what runs before [`take`]
/// (`az` for a token) must not inherit the connection or the log.
pub fn close_passed_at_exec() {
    let var = |name: &str| std::env::var(name).ok();
    let (Some(pid), Some(count)) = (var("LISTEN_PID"), var("LISTEN_FDS")) else {
        return;
    };
    let names = var("LISTEN_FDNAMES");
    for (fd, _) in parse(&pid, &count, names.as_deref(), std::process::id()).unwrap_or_default() {
        // SAFETY: only sets a flag on a descriptor passed to this process.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// The attach's descriptors the service manager passed back.
pub struct Stored {
    /// The FUSE connection.
    pub dev: OwnedFd,
    /// The attach's state.
    pub state: OwnedFd,
    /// The write log (a read-write attach).
    pub log: Option<OwnedFd>,
}

/// Takes the descriptors the service manager passed to this process and
/// removes `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` from the
/// environment. None without them, or without a FUSE connection among
/// them: systemd drops one whose connection ended, and the state and log
/// of an attach that is gone are closed (and forgotten by the store).
/// Call before any thread starts (it changes the environment).
pub fn take() -> Option<Stored> {
    let var = |name: &str| std::env::var(name).ok();
    let (pid, count, names) = (var("LISTEN_PID"), var("LISTEN_FDS"), var("LISTEN_FDNAMES"));
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(name);
    }
    let passed = parse(
        pid.as_deref()?,
        count.as_deref()?,
        names.as_deref(),
        std::process::id(),
    )?;
    let mut fds: HashMap<String, OwnedFd> = HashMap::new();
    for (fd, name) in passed {
        // SAFETY: the service manager passed descriptors FIRST_FD.. to this
        // process (LISTEN_PID matched); nothing else owns them. Closed at
        // exec: the tools this process runs must not hold them.
        let fd = unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            OwnedFd::from_raw_fd(fd)
        };
        fds.insert(name, fd);
    }
    let Some(dev) = fds.remove(FUSE) else {
        if fds.contains_key(STATE) {
            tracing::warn!(
                "systemd kept the state of an attach whose FUSE connection is gone; attaching afresh"
            );
            forget();
        }
        return None;
    };
    let Some(state) = fds.remove(STATE) else {
        tracing::warn!(
            "systemd kept a FUSE connection without its attach's state; attaching afresh"
        );
        forget();
        return None;
    };
    Some(Stored {
        dev,
        state,
        log: fds.remove(LOG),
    })
}

/// The passed descriptors and their names, when they are meant for process
/// `me`: (`LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES`).
fn parse(pid: &str, count: &str, names: Option<&str>, me: u32) -> Option<Vec<(RawFd, String)>> {
    if pid.trim().parse::<u32>().ok()? != me {
        return None;
    }
    let count = count.trim().parse::<usize>().ok()?;
    if count == 0 || count > MOST_FDS {
        return None;
    }
    let names: Vec<String> = match names {
        Some(names) => names.split(':').map(str::to_string).collect(),
        None => vec![String::new(); count],
    };
    if names.len() != count {
        return None;
    }
    Some(
        names
            .into_iter()
            .enumerate()
            .map(|(i, name)| (FIRST_FD + i as RawFd, name))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passed_descriptors_count_only_for_their_process_and_with_matching_names() {
        let got = parse(
            "42",
            "3",
            Some("blobdrive-fuse:blobdrive-state:blobdrive-log"),
            42,
        )
        .expect("for this process");
        assert_eq!(
            got,
            vec![
                (3, FUSE.to_string()),
                (4, STATE.to_string()),
                (5, LOG.to_string())
            ]
        );
        assert!(parse("41", "3", Some("a:b:c"), 42).is_none(), "another pid");
        assert!(
            parse("42", "2", Some("a:b:c"), 42).is_none(),
            "names miscounted"
        );
        assert!(parse("42", "0", None, 42).is_none());
        assert!(parse("42", "x", None, 42).is_none());
        assert!(parse("42", "100000", None, 42).is_none(), "bounded");
        assert_eq!(parse("42", "1", None, 42), Some(vec![(3, String::new())]));
    }
}
