//! Shared integration-test harness: finds Azurite (or the account named by
//! `BLOBDRIVE_TEST_CONNECTION_STRING`), builds clients and hands each test
//! its own uniquely named container, deleted when the guard drops.
#![allow(dead_code)]

pub mod fault_proxy;
pub mod https_azurite;
pub mod private_azurite;
pub mod qemu;
pub mod token_server;

use std::sync::atomic::{AtomicU32, Ordering};

use blobdrive::blob::{Account, BlobClient, BlobPath};
use blobdrive::vhd::Footer;

/// Azurite's blob endpoint (or the one of `BLOBDRIVE_TEST_CONNECTION_STRING`).
pub fn azurite_url() -> String {
    account()
        .endpoint
        .as_str()
        .trim_end_matches('/')
        .to_string()
}

/// The test account: `BLOBDRIVE_TEST_CONNECTION_STRING` if set, else Azurite.
pub fn account() -> Account {
    match std::env::var("BLOBDRIVE_TEST_CONNECTION_STRING") {
        Ok(cs) if !cs.trim().is_empty() => {
            Account::from_connection_string(&cs).expect("BLOBDRIVE_TEST_CONNECTION_STRING is valid")
        }
        _ => Account::development(),
    }
}

/// The connection string of the test account (for other tools, e.g. Python).
pub fn connection_string() -> String {
    account().connection_string()
}

/// Where the binary under test saves recovery files: a directory of this
/// test process, so a flush that fails in a test never leaves a file in
/// the machine's own recovery directory (/var/lib/blobdrive/recovery).
/// Pass it as `BLOBDRIVE_RECOVERY_DIR` to every `blobdrive` run.
pub fn recovery_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("blobdrive-test-recovery-{}", std::process::id()))
}

/// A client for the test account; panics with a hint if the emulator is down.
pub async fn client() -> BlobClient {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BLOBDRIVE_TEST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_test_writer()
        .try_init();
    BlobClient::new(account()).expect("client builds")
}

/// A container name unique to this process and call: `PREFIX-PID-N-RAND`.
pub fn unique_name(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let rand = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(30)
        .collect();
    format!(
        "{}-{}-{n}-{rand}",
        prefix.trim_matches('-'),
        std::process::id()
    )
}

/// Create a fresh, uniquely named container and return its name.
pub async fn fresh_container(client: &BlobClient, prefix: &str) -> String {
    let name = unique_name(prefix);
    match client.create_container(&name).await {
        Ok(true) => name,
        // The name is unique to this call: an existing container is our own
        // first attempt, answered too late (a stalled emulator) and retried.
        Ok(false) => name,
        Err(e) => panic!(
            "cannot create test container {name} at {}: {e}\n(is Azurite running? scripts/azurite.sh start --memory)",
            azurite_url()
        ),
    }
}

/// A fresh container that is deleted when the guard drops (best effort, on
/// a helper thread so it works inside and outside a runtime).
pub struct ContainerGuard {
    /// The client the container was made with.
    pub client: BlobClient,
    /// Container name.
    pub name: String,
}

impl ContainerGuard {
    /// Create a fresh container with `prefix`.
    pub async fn new(prefix: &str) -> ContainerGuard {
        let client = client().await;
        let name = fresh_container(&client, prefix).await;
        ContainerGuard { client, name }
    }

    /// Create a fresh container with `prefix` in `account`.
    pub async fn new_in(account: &Account, prefix: &str) -> ContainerGuard {
        let _ = client().await; // sets up test logging
        let client = BlobClient::new(account.clone()).expect("client builds");
        let name = fresh_container(&client, prefix).await;
        ContainerGuard { client, name }
    }

    /// A blob path in this container.
    pub fn path(&self, blob: &str) -> blobdrive::blob::BlobPath {
        blobdrive::blob::BlobPath::new(&self.name, blob).expect("valid test blob name")
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        if std::env::var_os("BLOBDRIVE_TEST_KEEP").is_some() {
            return;
        }
        // A fresh client: the test's connection pool belongs to its runtime,
        // which is blocked in this drop.
        let account = self.client.account().clone();
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                if let Ok(client) = BlobClient::new(account) {
                    let _ = rt.block_on(client.delete_container(&name));
                }
            }
        })
        .join();
    }
}

/// A fresh drive: a page blob of `size_bytes` + 512 with a fixed VHD footer.
pub async fn make_drive(client: &BlobClient, path: &BlobPath, size_bytes: u64) {
    client
        .create_page_blob(path, size_bytes + 512)
        .await
        .expect("create page blob");
    client
        .put_pages(
            path,
            size_bytes,
            Footer::new_fixed(size_bytes).to_bytes().to_vec().into(),
            None,
        )
        .await
        .expect("write the VHD footer");
}

/// Runs a Python script (`python3 -c SCRIPT ARGS`) with the test account's
/// connection string in `CS`, for the official `azure-storage-blob` SDK as
/// an independent client; returns its trimmed stdout.
pub fn python(script: &str, args: &[&str]) -> String {
    python_with(&connection_string(), script, args)
}

/// [`python`] against the account of `connection_string` (a private
/// emulator, say) instead of the shared one.
pub fn python_with(connection_string: &str, script: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .env("CS", connection_string)
        .output()
        .expect("python3 runs (the azure-storage-blob SDK is required for this test)");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
