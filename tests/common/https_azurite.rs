//! An Azurite blob service of the test's own, on a free loopback port, over
//! HTTPS with a certificate made here (a throwaway CA signs a server
//! certificate for 127.0.0.1 and localhost) and with `--oauth basic`, so it
//! accepts Microsoft Entra-style bearer tokens. Stopped when dropped.
//!
//! Azurite is found at `BLOBDRIVE_AZURITE_BIN`, else under the crate's
//! `.azurite/` (installed by `scripts/azurite.sh install`, which is run once
//! here if it is missing).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A throwaway certificate authority and a server certificate it signed.
pub struct TestPki {
    /// Where the PEM files are.
    pub dir: tempfile::TempDir,
    /// The CA's certificate (what `--ca-file` must name).
    pub ca_path: PathBuf,
    /// The server's certificate.
    pub cert_path: PathBuf,
    /// The server's private key.
    pub key_path: PathBuf,
}

impl TestPki {
    /// A CA and a certificate for `127.0.0.1` / `localhost` signed by it.
    pub fn new() -> TestPki {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "blobdrive test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "azurite test server");
        let cert = params
            .signed_by(&server_key, &issuer)
            .expect("server certificate");
        let write = |name: &str, text: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).expect("write PEM");
            p
        };
        TestPki {
            ca_path: write("ca.pem", ca_cert.pem()),
            cert_path: write("server.pem", cert.pem()),
            key_path: write("server-key.pem", server_key.serialize_pem()),
            dir,
        }
    }
}

/// The Azurite blob binary, installing it with the project's script if needed.
pub fn azurite_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("BLOBDRIVE_AZURITE_BIN") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = root.join(".azurite/node_modules/.bin/azurite-blob");
    if !bin.exists() {
        let status = Command::new(root.join("scripts/azurite.sh"))
            .arg("install")
            .status();
        assert!(
            matches!(status, Ok(s) if s.success()) && bin.exists(),
            "Azurite is not installed at {} and 'scripts/azurite.sh install' failed (it needs npm); set BLOBDRIVE_AZURITE_BIN to an azurite-blob binary",
            bin.display()
        );
    }
    bin
}

/// A free loopback port (bound, then released for the child to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A running HTTPS + OAuth Azurite.
pub struct HttpsAzurite {
    /// Its certificates.
    pub pki: TestPki,
    /// Its blob port.
    pub port: u16,
    child: Child,
}

impl HttpsAzurite {
    /// Start one and wait until it accepts connections.
    pub fn start() -> HttpsAzurite {
        let pki = TestPki::new();
        let bin = azurite_bin();
        let mut last_err = String::new();
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(&bin)
                .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                .args(["--inMemoryPersistence", "--silent", "--skipApiVersionCheck"])
                .args(["--oauth", "basic"])
                .arg("--cert")
                .arg(&pki.cert_path)
                .arg("--key")
                .arg(&pki.key_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return HttpsAzurite { pki, port, child };
                }
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    last_err = format!("azurite exited ({status}): {err}");
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_err = "azurite did not listen within 30 s".into();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("cannot start HTTPS Azurite: {last_err}");
    }

    /// Its blob endpoint: `https://127.0.0.1:PORT/devstoreaccount1`.
    pub fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}/devstoreaccount1", self.port)
    }
}

impl Drop for HttpsAzurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
