//! Telling whoever started the daemon that the mount is ready (or why it is not):
//! a pipe to the parent of a background daemon, and `READY=1` to systemd.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;

/// Where readiness goes.
pub struct Readiness {
    pipe: Option<std::fs::File>,
}

impl Readiness {
    /// A foreground daemon: only systemd is told.
    pub fn foreground() -> Self {
        Readiness { pipe: None }
    }

    /// A background daemon: the parent waits on the other end of `pipe`.
    pub fn pipe(pipe: OwnedFd) -> Self {
        Readiness {
            pipe: Some(std::fs::File::from(pipe)),
        }
    }

    /// The mount serves requests: release the parent, tell systemd.
    pub fn ready(&mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            if let Err(err) = pipe.write_all(b"ready\n") {
                tracing::warn!(%err, "cannot tell the parent process the mount is ready");
            }
        }
        notify_systemd("READY=1");
    }

    /// Startup failed: hand the reason to the parent (which prints it).
    pub fn failed(&mut self, reason: &str) {
        if let Some(mut pipe) = self.pipe.take() {
            let line = reason.replace('\n', " ");
            let _ = pipe.write_all(format!("error {line}\n").as_bytes());
        }
    }

    /// True until `ready` or `failed` was called on a background daemon.
    pub fn pending(&self) -> bool {
        self.pipe.is_some()
    }
}

/// Sends `state` to `$NOTIFY_SOCKET` when it is set (a path, or `@name` for an
/// abstract socket); failures are logged, never fatal.
pub fn notify_systemd(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let target = target.to_string_lossy().into_owned();
    let result = (|| -> std::io::Result<()> {
        let socket = UnixDatagram::unbound()?;
        if let Some(name) = target.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            socket.send_to_addr(state.as_bytes(), &addr)?;
        } else {
            socket.send_to(state.as_bytes(), &target)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => tracing::debug!(state, "notified systemd"),
        Err(err) => tracing::warn!(%err, socket = %target, "cannot notify systemd"),
    }
}

/// What the parent of a background daemon learns.
pub enum ParentView {
    /// The mount is ready.
    Ready,
    /// The daemon failed with this line.
    Failed(String),
    /// The daemon ended without a word.
    Vanished,
}

/// Reads the daemon's readiness line from the parent's end of the pipe.
pub fn wait_in_parent(pipe: OwnedFd) -> ParentView {
    let mut text = String::new();
    let mut file = std::fs::File::from(pipe);
    let _ = file.read_to_string(&mut text);
    match text.lines().next() {
        Some("ready") => ParentView::Ready,
        Some(line) => match line.strip_prefix("error ") {
            Some(reason) => ParentView::Failed(reason.to_string()),
            None => ParentView::Failed(line.to_string()),
        },
        None => ParentView::Vanished,
    }
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
