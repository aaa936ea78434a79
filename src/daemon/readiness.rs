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

    /// Ready, with `lines` for the parent to print on its stdout (what a
    /// foreground run would have printed: `serve`'s URIs).
    pub fn ready_with(&mut self, lines: &str) {
        if let Some(mut pipe) = self.pipe.take() {
            if let Err(err) = pipe.write_all(format!("ready\n{lines}").as_bytes()) {
                tracing::warn!(%err, "cannot tell the parent process the daemon is ready");
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
    match send_notify(&target, state) {
        Ok(()) => tracing::debug!(state, "notified systemd"),
        Err(err) => tracing::warn!(%err, socket = %target, "cannot notify systemd"),
    }
}

/// Sends one sd_notify datagram to `target` (a path, or `@name` for an abstract socket).
fn send_notify(target: &str, state: &str) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    if let Some(name) = target.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        socket.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        socket.send_to(state.as_bytes(), target)?;
    }
    Ok(())
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

/// [`wait_in_parent`], and the lines the daemon sent after its `ready`
/// (see [`Readiness::ready_with`]).
pub fn wait_in_parent_for_lines(pipe: OwnedFd) -> (ParentView, String) {
    let mut text = String::new();
    let mut file = std::fs::File::from(pipe);
    let _ = file.read_to_string(&mut text);
    let mut lines = text.splitn(2, '\n');
    let view = match lines.next() {
        Some("ready") => ParentView::Ready,
        Some("") | None => ParentView::Vanished,
        Some(line) => match line.strip_prefix("error ") {
            Some(reason) => ParentView::Failed(reason.to_string()),
            None => ParentView::Failed(line.to_string()),
        },
    };
    (view, lines.next().unwrap_or_default().to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_datagram_reaches_path_and_abstract_notify_sockets() {
        let dir = std::env::temp_dir().join(format!("blobdrive-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).unwrap();
        send_notify(path.to_str().unwrap(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("blobdrive-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_listener = UnixDatagram::bind_addr(&addr).unwrap();
        send_notify(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = abstract_listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn parent_sees_ready_or_the_error_line() {
        let (read, write) = pipe().unwrap();
        let mut readiness = Readiness::pipe(write);
        readiness.failed("cannot mount FUSE at /x: busy\nsecond line");
        drop(readiness);
        match wait_in_parent(read) {
            ParentView::Failed(reason) => {
                assert_eq!(reason, "cannot mount FUSE at /x: busy second line")
            }
            _ => panic!("expected a failure line"),
        }
        let (read, write) = pipe().unwrap();
        drop(write);
        assert!(matches!(wait_in_parent(read), ParentView::Vanished));
    }
}
