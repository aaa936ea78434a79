//! A private in-memory Azurite on a loopback port of its own, for the tests
//! that push the most data through the emulator (the exerciser, the 2 GiB
//! write): the shared emulator slows down as the data of the whole suite
//! piles up in its memory, and these tests would time out behind it (and
//! slow every other test down). Used only when the tests run against the
//! local emulator; against a real account the shared one is kept.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blobdrive::blob::Account;

/// A running private Azurite; stopped (killed) on drop.
pub struct PrivateAzurite {
    child: Child,
    port: u16,
}

/// `$BLOBDRIVE_AZURITE_BIN`, else the pinned Azurite that
/// `scripts/azurite.sh install` puts in the repository's `.azurite/`.
fn azurite_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("BLOBDRIVE_AZURITE_BIN").filter(|b| !b.is_empty()) {
        return Some(PathBuf::from(bin));
    }
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join(".azurite/node_modules/.bin/azurite-blob");
    bin.exists().then_some(bin)
}

/// The account of `azurite` when one started, else the shared test account.
pub fn account_or_shared(azurite: &Option<PrivateAzurite>) -> Account {
    azurite
        .as_ref()
        .map_or_else(super::account, PrivateAzurite::account)
}

impl PrivateAzurite {
    /// Starts one when the tests use the local emulator and its binary is
    /// installed; `None` otherwise (the caller uses the shared account).
    pub fn start() -> Option<PrivateAzurite> {
        if super::account().endpoint.host_str() != Some("127.0.0.1") {
            return None;
        }
        let bin = azurite_bin()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        // In memory (Azurite refuses --location with it): nothing on disk.
        let child = Command::new(bin)
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .args([
                "--skipApiVersionCheck",
                "--loose",
                "--silent",
                "--inMemoryPersistence",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut me = PrivateAzurite { child, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            // Exited (a bad flag, a taken port) or too slow: use the shared one.
            if me.child.try_wait().ok().flatten().is_some()
                || started.elapsed() > Duration::from_secs(30)
            {
                println!("private Azurite did not start; using the shared one");
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        println!("private Azurite on 127.0.0.1:{port}");
        Some(me)
    }

    /// The development account on this emulator.
    pub fn account(&self) -> Account {
        let mut account = Account::development();
        account
            .endpoint
            .set_port(Some(self.port))
            .expect("an http URL takes a port");
        account
    }
}

impl Drop for PrivateAzurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
