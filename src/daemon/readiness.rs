//! Telling whoever started the daemon that the mount is ready (or why it is not):
//! a pipe to the parent of a background daemon, and `READY=1` to systemd.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
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

    /// Something the user should hear before the mount is ready: handed to
    /// the parent, which prints it (a foreground daemon's log has it).
    pub fn warn(&mut self, line: &str) {
        if let Some(pipe) = self.pipe.as_mut() {
            let line = line.replace('\n', " ");
            let _ = pipe.write_all(format!("warning {line}\n").as_bytes());
        }
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
    let Some(target) = notify_socket() else {
        return;
    };
    match send_notify(&target, state, &[]) {
        Ok(()) => tracing::debug!(state, "notified systemd"),
        Err(err) => tracing::warn!(%err, socket = %target, "cannot notify systemd"),
    }
}

/// Sends `state` with the descriptors `fds` attached (`FDSTORE=1` and the
/// like) to `$NOTIFY_SOCKET`; Ok(false) when it is not set.
pub fn notify_systemd_with_fds(state: &str, fds: &[BorrowedFd<'_>]) -> std::io::Result<bool> {
    let Some(target) = notify_socket() else {
        return Ok(false);
    };
    send_notify(&target, state, fds)?;
    Ok(true)
}

fn notify_socket() -> Option<String> {
    std::env::var_os("NOTIFY_SOCKET").map(|t| t.to_string_lossy().into_owned())
}

/// Sends one sd_notify datagram to `target` (a path, or `@name` for an
/// abstract socket), with `fds` as SCM_RIGHTS. (Written here rather than
/// taken from a crate: the small ones connect to paths only, and systemd
/// may name an abstract socket.)
fn send_notify(target: &str, state: &str, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    if let Some(name) = target.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        socket.connect_addr(&addr)?;
    } else {
        socket.connect(target)?;
    }
    if fds.is_empty() {
        socket.send(state.as_bytes())?;
        return Ok(());
    }
    let raw: Vec<libc::c_int> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let payload = std::mem::size_of_val(raw.as_slice()) as u32;
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    // u64 words: the control buffer must be aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: state.as_ptr() as *mut libc::c_void,
        iov_len: state.len(),
    };
    // SAFETY: a zeroed msghdr is valid; the fields set point at `iov` and
    // `control`, which outlive the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `control` holds CMSG_SPACE(payload) bytes, so the first header
    // exists and its data has room for `raw`.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as usize;
        std::ptr::copy_nonoverlapping(
            raw.as_ptr(),
            libc::CMSG_DATA(cmsg).cast::<libc::c_int>(),
            raw.len(),
        );
    }
    // SAFETY: `msg` is fully initialised above; the socket is open.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What the parent of a background daemon learns.
pub enum ParentView {
    /// The mount is ready; the warnings the daemon handed over first.
    Ready(Vec<String>),
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
    let mut warnings = Vec::new();
    for line in text.lines() {
        if let Some(warning) = line.strip_prefix("warning ") {
            warnings.push(warning.to_string());
            continue;
        }
        return match line {
            "ready" => ParentView::Ready(warnings),
            _ => match line.strip_prefix("error ") {
                Some(reason) => ParentView::Failed(reason.to_string()),
                None => ParentView::Failed(line.to_string()),
            },
        };
    }
    ParentView::Vanished
}

/// [`wait_in_parent`], and the lines the daemon sent after its `ready`
/// (see [`Readiness::ready_with`]).
pub fn wait_in_parent_for_lines(pipe: OwnedFd) -> (ParentView, String) {
    let mut text = String::new();
    let mut file = std::fs::File::from(pipe);
    let _ = file.read_to_string(&mut text);
    let mut warnings = Vec::new();
    let mut rest = text.as_str();
    while let Some((line, after)) = rest.split_once('\n') {
        if let Some(warning) = line.strip_prefix("warning ") {
            warnings.push(warning.to_string());
            rest = after;
            continue;
        }
        let view = match line {
            "ready" => return (ParentView::Ready(warnings), after.to_string()),
            _ => match line.strip_prefix("error ") {
                Some(reason) => ParentView::Failed(reason.to_string()),
                None => ParentView::Failed(line.to_string()),
            },
        };
        return (view, String::new());
    }
    (ParentView::Vanished, String::new())
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
        send_notify(path.to_str().unwrap(), "READY=1", &[]).unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("blobdrive-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_listener = UnixDatagram::bind_addr(&addr).unwrap();
        send_notify(&format!("@{name}"), "STOPPING=1", &[]).unwrap();
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
        let (read, write) = pipe().unwrap();
        let mut readiness = Readiness::pipe(write);
        readiness.warn("mounted with nouuid");
        readiness.ready();
        match wait_in_parent(read) {
            ParentView::Ready(warnings) => assert_eq!(warnings, ["mounted with nouuid"]),
            _ => panic!("expected ready"),
        }
    }
}
