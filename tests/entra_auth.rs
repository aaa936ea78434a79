//! Signing in the way production does: Microsoft Entra ID bearer tokens over
//! HTTPS. Each test starts its own Azurite with HTTPS (a certificate made
//! here) and `--oauth basic`, and a local token endpoint that speaks the
//! managed-identity and client-credentials protocols (tests/common); the
//! Azure CLI and the Azure Developer CLI are stand-in scripts that hand out
//! a token from that endpoint.
//!
//! Every log line of this test binary is captured at trace level, and the
//! final checks look for every secret and token in it.

mod common;
mod mount_support;
mod system;

use std::collections::HashMap;
use std::io::Write;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use blobdrive::blob::{
    Account, AccountOptions, AuthMode, BlobClient, BlobPath, BlobType, ErrorKind, LeaseDuration,
    LeaseState, ListBlobsOptions,
};
use blobdrive::units::ByteRange;
use bytes::Bytes;
use common::https_azurite::HttpsAzurite;
use common::token_server::{TokenServer, CLIENT_ID, CLIENT_SECRET, IDENTITY_HEADER, TENANT};

// ------------------------------------------------------------ log capture

#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// All log output of this process, at trace level for every crate.
fn logs() -> &'static LogBuffer {
    static LOGS: OnceLock<LogBuffer> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = LogBuffer::default();
        let writer = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .try_init();
        buf
    })
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().0.lock().unwrap()).to_string()
}

// ------------------------------------------------------------ helpers

type Vars = Vec<(&'static str, String)>;

fn lookup(vars: Vars) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<&'static str, String> = vars.into_iter().collect();
    move |k| map.get(k).cloned()
}

/// The account the global flags would give: `--auth MODE --account URL
/// --ca-file CA`, with `vars` as the environment.
fn account(az: &HttpsAzurite, mode: AuthMode, vars: Vars, ca: bool) -> Account {
    let opts = AccountOptions {
        auth: Some(mode),
        account: Some(az.endpoint()),
        ca_file: ca.then(|| az.pki.ca_path.clone()),
        allow_http: false,
    };
    Account::from_lookup_with(None, &opts, lookup(vars)).expect("account builds")
}

fn imds_vars(ts: &TokenServer) -> Vars {
    vec![("BLOBDRIVE_IMDS_ENDPOINT", ts.imds_endpoint())]
}

fn sp_vars(ts: &TokenServer, secret: &str) -> Vars {
    vec![
        ("AZURE_TENANT_ID", TENANT.to_string()),
        ("AZURE_CLIENT_ID", CLIENT_ID.to_string()),
        ("AZURE_CLIENT_SECRET", secret.to_string()),
        ("AZURE_AUTHORITY_HOST", ts.url.clone()),
    ]
}

/// What AKS puts in a pod that uses workload identity: the federated token
/// file and the app it is federated with.
fn workload_vars(ts: &TokenServer, token_file: &std::path::Path) -> Vars {
    vec![
        (
            "AZURE_FEDERATED_TOKEN_FILE",
            token_file.display().to_string(),
        ),
        ("AZURE_TENANT_ID", TENANT.to_string()),
        ("AZURE_CLIENT_ID", CLIENT_ID.to_string()),
        ("AZURE_AUTHORITY_HOST", ts.url.clone()),
    ]
}

/// A fresh federated token (the kubelet's are service account JWTs of
/// about 1 KB; the token server only checks that one arrives). Longer than
/// a message's description may be, and with characters that change when
/// URL-encoded.
fn federated_token() -> String {
    format!(
        "federated-{}-never-print-me~{}",
        uuid::Uuid::new_v4().simple(),
        "a+b/c=".repeat(120)
    )
}

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect::<Vec<_>>(),
    )
}

fn container() -> String {
    common::unique_name("entra")
}

/// What to look for when checking that `secret` is not in some text: a
/// JWT's claims part (unique to each token; the signature is fake), else
/// the secret itself.
fn secret_needle(secret: &str) -> &str {
    let parts: Vec<&str> = secret.split('.').collect();
    if parts.len() == 3 {
        parts[1]
    } else {
        secret
    }
}

/// Where in `text` any part of `secret` shows: its needle whole, or the
/// needle's first or last 32 characters (a message cut short, or a secret
/// quoted in part).
fn find_secret(text: &str, secret: &str) -> Option<usize> {
    let needle = secret_needle(secret);
    let mut parts = vec![needle];
    if needle.len() > 64 && needle.is_ascii() {
        parts.push(&needle[..32]);
        parts.push(&needle[needle.len() - 32..]);
    }
    parts.iter().find_map(|p| text.find(p))
}

/// Panics, naming what precedes it on its line, when `text` (described by
/// `what`) holds any part of any of `secrets` ([`find_secret`]).
fn assert_no_secret(what: &str, text: &str, secrets: &[String]) {
    for secret in secrets {
        if let Some(i) = find_secret(text, secret) {
            let start = text[..i].rfind('\n').map_or(0, |n| n + 1);
            let line = &text[start..i];
            panic!("a secret in {what}, after: {line}");
        }
    }
}

/// Every operation the blob client offers, once each (the lease ones in the
/// order a mount meets them), with its effect checked through another call.
async fn exercise_every_operation(client: &BlobClient) {
    let c = container();
    assert!(client.create_container(&c).await.unwrap());
    let path = BlobPath::new(&c, "disk.vhd").unwrap();
    let size = 1 << 20;
    client.create_page_blob(&path, size).await.unwrap();
    client
        .put_pages(&path, 4096, pattern(8192, 3), None)
        .await
        .unwrap();
    client
        .clear_pages(&path, ByteRange::new(8192, 12288), None)
        .await
        .unwrap();
    let ranges = client.get_page_ranges(&path, None).await.unwrap();
    assert_eq!(ranges.blob_size_bytes, size);
    assert_eq!(ranges.ranges, vec![ByteRange::new(4096, 8192)]);
    let got = client
        .get_blob_range(&path, ByteRange::new(4096, 8192))
        .await
        .unwrap();
    assert_eq!(got, pattern(8192, 3).slice(0..4096));

    // The mount lock: acquire, renew, change; the old id no longer writes.
    let lease = uuid::Uuid::new_v4().to_string();
    client.acquire_lease(&path, &lease, None).await.unwrap();
    client
        .put_pages(&path, 0, pattern(512, 9), Some(&lease))
        .await
        .unwrap();
    let snap = client.snapshot(&path).await.unwrap();
    client.renew_lease(&path, &lease).await.unwrap();
    let props = client.get_properties(&path).await.unwrap();
    assert_eq!(props.lease_state, Some(LeaseState::Leased));
    assert_eq!(props.lease_duration, Some(LeaseDuration::Infinite));
    let proposed = uuid::Uuid::new_v4().to_string();
    let changed = client.change_lease(&path, &lease, &proposed).await.unwrap();
    assert_eq!(changed, proposed);
    let e = client
        .put_pages(&path, 0, pattern(512, 1), Some(&lease))
        .await
        .unwrap_err();
    assert!(e.is_lease_lost(), "the old lease id still writes: {e}");

    // Metadata and resize under the changed lease.
    let metadata = vec![
        ("owner".to_string(), "entra-test".to_string()),
        ("Purpose".to_string(), "every operation".to_string()),
    ];
    client
        .set_metadata(&path, &metadata, Some(&changed))
        .await
        .unwrap();
    let grown = 2 << 20;
    client.resize(&path, grown, Some(&changed)).await.unwrap();
    client.release_lease(&path, &changed).await.unwrap();
    let props = client.get_properties(&path).await.unwrap();
    assert_eq!(props.content_length, grown);
    assert_eq!(props.lease_state, Some(LeaseState::Available));
    assert_eq!(
        props.metadata.get("owner").map(String::as_str),
        Some("entra-test")
    );
    assert_eq!(
        props.metadata.get("purpose").map(String::as_str),
        Some("every operation")
    );
    assert_eq!(
        client
            .get_page_ranges(&path, None)
            .await
            .unwrap()
            .blob_size_bytes,
        grown
    );

    // A stale lock, broken: a fixed lease, renewed, then broken at once.
    let fixed = uuid::Uuid::new_v4().to_string();
    client.acquire_lease(&path, &fixed, Some(15)).await.unwrap();
    client.renew_lease(&path, &fixed).await.unwrap();
    let props = client.get_properties(&path).await.unwrap();
    assert_eq!(props.lease_duration, Some(LeaseDuration::Fixed));
    assert_eq!(client.break_lease(&path, Some(0)).await.unwrap(), 0);
    let props = client.get_properties(&path).await.unwrap();
    assert_eq!(props.lease_state, Some(LeaseState::Broken));

    // A small block blob beside the drive.
    let notes = BlobPath::new(&c, "notes/readme.txt").unwrap();
    let text = Bytes::from_static(b"written with a bearer token");
    client.put_block_blob(&notes, text.clone()).await.unwrap();
    let props = client.get_properties(&notes).await.unwrap();
    assert_eq!(props.blob_type, Some(BlobType::BlockBlob));
    assert_eq!(props.content_length, text.len() as u64);
    let got = client
        .get_blob_range(&notes, ByteRange::new(0, text.len() as u64))
        .await
        .unwrap();
    assert_eq!(got, text);

    let listed = client
        .list_blobs(
            &c,
            &ListBlobsOptions {
                include_snapshots: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        listed.blobs.len(),
        3,
        "the drive, its snapshot and the block blob"
    );
    let all = client
        .list_all_blobs(
            &c,
            &ListBlobsOptions {
                include_metadata: true,
                max_results: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let names: Vec<&str> = all.blobs.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["disk.vhd", "notes/readme.txt"], "one page each");
    assert_eq!(
        all.blobs[0].metadata.get("owner").map(String::as_str),
        Some("entra-test")
    );
    let snap_path = path.clone().with_snapshot(Some(&snap));
    let old = client
        .get_blob_range(&snap_path, ByteRange::new(0, 512))
        .await
        .unwrap();
    assert_eq!(old, pattern(512, 9));
    assert_eq!(
        client
            .get_properties(&snap_path)
            .await
            .unwrap()
            .content_length,
        size,
        "the snapshot keeps the size it was taken at"
    );
    assert!(client
        .list_containers()
        .await
        .unwrap()
        .iter()
        .any(|x| x.name == c));
    client.delete_blob(&notes, false, None).await.unwrap();
    client.delete_blob(&path, true, None).await.unwrap();
    assert!(client
        .get_properties(&path)
        .await
        .unwrap_err()
        .is_not_found());
    client.delete_container(&c).await.unwrap();
}

// ------------------------------------------------------------ tests

#[tokio::test]
async fn every_blob_operation_works_with_a_managed_identity_token() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    let client = BlobClient::new(account(&az, AuthMode::Msi, imds_vars(&ts), true)).unwrap();
    exercise_every_operation(&client).await;
    assert_eq!(ts.state.count("imds"), 1, "one token serves every request");
    assert_eq!(client.token_fetches(), 1);
}

/// Move this thread (and every thread and process it starts from now on)
/// into a network namespace of its own, with loopback up and IMDS's address
/// on it. False (the test skips) when namespaces cannot be made here or
/// `ip` is missing; under `BLOBDRIVE_REQUIRE_FUSE=1` either fails the test.
fn own_network_with_imds_address(test: &str) -> bool {
    if !system::can_run(test, false) {
        return false;
    }
    // The check the many-hosts tests make (tests/netns) for the same tool.
    if !blobdrive::attach::tool_exists("ip") {
        assert_ne!(
            std::env::var(system::REQUIRE_ENV).as_deref(),
            Ok("1"),
            "{test}: ip (iproute2) not installed"
        );
        println!("SKIPPED: {test}: ip (iproute2) not installed");
        return false;
    }
    // SAFETY: unshare takes no pointers; CLONE_NEWNET changes only this
    // thread's network namespace, so other tests of the binary are untouched.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        let why = std::io::Error::last_os_error();
        assert_ne!(
            std::env::var(system::REQUIRE_ENV).as_deref(),
            Ok("1"),
            "{test}: cannot make a network namespace: {why}"
        );
        println!("SKIPPED: {test}: cannot make a network namespace: {why}");
        return false;
    }
    for args in [
        &["link", "set", "lo", "up"][..],
        &["addr", "add", "169.254.169.254/32", "dev", "lo"][..],
    ] {
        let status = Command::new("ip").args(args).status().expect("run ip");
        assert!(status.success(), "ip {args:?}: {status}");
    }
    true
}

#[test]
fn managed_identity_asks_imds_at_its_fixed_address() {
    logs();
    let test = "managed_identity_asks_imds_at_its_fixed_address";
    if !own_network_with_imds_address(test) {
        return;
    }
    // Everything below lives in the namespace: Azurite, the token server
    // on 169.254.169.254:80, the runtime's threads and the CLI's process.
    let ts = TokenServer::start_at("169.254.169.254:80", 3600);
    let az = HttpsAzurite::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // No BLOBDRIVE_IMDS_ENDPOINT: the well-known address.
        let client = BlobClient::new(account(&az, AuthMode::Msi, vec![], true)).unwrap();
        exercise_every_operation(&client).await;
        // The login chain's quick probe finds it too.
        let client = BlobClient::new(account(&az, AuthMode::Login, vec![], true)).unwrap();
        client.list_containers().await.unwrap();
    });
    assert_eq!(ts.state.count("imds"), 2);
    let out = Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["--auth", "msi", "--account", &az.endpoint()])
        .args(["--ca-file", &az.pki.ca_path.display().to_string(), "list"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ts.state.count("imds"), 3);
}

#[tokio::test]
async fn service_principal_with_a_secret_signs_in_with_client_credentials() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    let client = BlobClient::new(account(
        &az,
        AuthMode::Sp,
        sp_vars(&ts, CLIENT_SECRET),
        true,
    ))
    .unwrap();
    exercise_every_operation(&client).await;
    assert_eq!(ts.state.count("secret"), 1);
}

#[tokio::test]
async fn login_chain_uses_the_first_identity_available() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    // No service principal variables: the chain skips it and finds IMDS.
    let client = BlobClient::new(account(&az, AuthMode::Login, imds_vars(&ts), true)).unwrap();
    let c = container();
    assert!(client.create_container(&c).await.unwrap());
    client.delete_container(&c).await.unwrap();
    assert_eq!(ts.state.count("imds"), 1);
    // AZURE_STORAGE_AUTH_MODE=login means the same as --auth login.
    let opts = AccountOptions {
        account: Some(az.endpoint()),
        ca_file: Some(az.pki.ca_path.clone()),
        ..Default::default()
    };
    let mut vars = imds_vars(&ts);
    vars.push(("AZURE_STORAGE_AUTH_MODE", "login".into()));
    let acct = Account::from_lookup_with(None, &opts, lookup(vars)).unwrap();
    assert!(format!("{acct:?}").contains("Token("), "{acct:?}");
}

#[tokio::test]
async fn app_service_identity_endpoint_sends_its_header() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    let vars = vec![
        ("IDENTITY_ENDPOINT", ts.identity_endpoint()),
        ("IDENTITY_HEADER", IDENTITY_HEADER.to_string()),
    ];
    let acct = account(&az, AuthMode::Msi, vars, true);
    assert!(!format!("{acct:?}").contains(IDENTITY_HEADER));
    let client = BlobClient::new(acct).unwrap();
    client.list_containers().await.unwrap();
    assert_eq!(ts.state.count("app-service"), 1);
    assert_eq!(ts.state.count("imds"), 0);
}

#[tokio::test]
async fn service_principal_certificate_sends_a_verifiable_assertion() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    // An RSA key and a self-signed certificate in one PEM, as the SDKs take it.
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "blobdrive test app");
    let cert = params.self_signed(&key).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pem_path = dir.path().join("app.pem");
    std::fs::write(&pem_path, format!("{}{}", cert.pem(), key.serialize_pem())).unwrap();
    let vars = vec![
        ("AZURE_TENANT_ID", TENANT.to_string()),
        ("AZURE_CLIENT_ID", CLIENT_ID.to_string()),
        (
            "AZURE_CLIENT_CERTIFICATE_PATH",
            pem_path.display().to_string(),
        ),
        ("AZURE_AUTHORITY_HOST", ts.url.clone()),
    ];
    let acct = account(&az, AuthMode::Sp, vars, true);
    assert!(!format!("{acct:?}").contains("PRIVATE KEY"));
    let client = BlobClient::new(acct).unwrap();
    client.list_containers().await.unwrap();
    assert_eq!(ts.state.count("certificate"), 1);

    // The assertion: RS256, x5t = SHA-1 thumbprint, signed by the key.
    let assertion = ts.state.assertions.lock().unwrap()[0].clone();
    let parts: Vec<&str> = assertion.split('.').collect();
    assert_eq!(parts.len(), 3);
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header: serde_json::Value = serde_json::from_slice(&b64.decode(parts[0]).unwrap()).unwrap();
    assert_eq!(header["alg"], "RS256");
    let thumb = aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
        cert.der().as_ref(),
    );
    assert_eq!(header["x5t"], b64.encode(thumb.as_ref()));
    let claims: serde_json::Value = serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap();
    assert_eq!(claims["iss"], CLIENT_ID);
    assert_eq!(claims["sub"], CLIENT_ID);
    assert_eq!(
        claims["aud"],
        format!("{}/{TENANT}/oauth2/v2.0/token", ts.url)
    );
    let public = aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
        key.public_key_raw(),
    );
    public
        .verify(
            format!("{}.{}", parts[0], parts[1]).as_bytes(),
            &b64.decode(parts[2]).unwrap(),
        )
        .expect("the assertion is signed by the certificate's key");
}

#[tokio::test]
async fn workload_identity_sends_the_federated_token_and_reads_a_rotated_file() {
    logs();
    let az = HttpsAzurite::start();
    // Tokens that live 2 s are never handed out twice (none is used with
    // under 2 s to live), so every request asks the token server again.
    let ts = TokenServer::start(2);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("azure-identity-token");
    let first = federated_token();
    std::fs::write(&file, &first).unwrap();
    let acct = account(&az, AuthMode::Workload, workload_vars(&ts, &file), true);
    assert!(!format!("{acct:?}").contains(&first));
    let client = BlobClient::new(acct).unwrap();
    let c = container();
    assert!(client.create_container(&c).await.unwrap());
    assert_eq!(*ts.state.assertions.lock().unwrap(), vec![first.clone()]);

    // The kubelet replaces the file with a new token before the old expires.
    let second = federated_token();
    std::fs::write(&file, format!("{second}\n")).unwrap();
    let path = BlobPath::new(&c, "workload.vhd").unwrap();
    client.create_page_blob(&path, 1 << 20).await.unwrap();
    client
        .put_pages(&path, 4096, pattern(1024, 9), None)
        .await
        .unwrap();
    let got = client
        .get_blob_range(&path, ByteRange::new(4096, 5120))
        .await
        .unwrap();
    assert_eq!(got, pattern(1024, 9));
    client.delete_container(&c).await.unwrap();

    let seen = ts.state.assertions.lock().unwrap().clone();
    assert!(seen.len() >= 4, "{} token requests", seen.len());
    assert!(
        seen[1..].iter().all(|a| *a == second),
        "every request after the rotation sent the new file's token"
    );
    assert_eq!(ts.state.count("federated"), seen.len() as u64);
    assert_eq!(ts.state.count("secret") + ts.state.count("certificate"), 0);
    assert_eq!(client.token_fetches(), seen.len() as u64);
}

#[tokio::test]
async fn workload_identity_signs_in_at_an_https_authority_the_ca_file_vouches_for() {
    logs();
    let az = HttpsAzurite::start();
    // The authority over TLS, its certificate from the same test CA.
    let ts = TokenServer::start_https(3600, &az.pki);
    assert!(ts.url.starts_with("https://"), "{}", ts.url);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, federated_token()).unwrap();
    let client = BlobClient::new(account(
        &az,
        AuthMode::Workload,
        workload_vars(&ts, &file),
        true,
    ))
    .unwrap();
    exercise_every_operation(&client).await;
    assert_eq!(
        ts.state.count("federated"),
        1,
        "one token serves every request"
    );

    // Without the CA, the authority is not trusted: no token is asked for.
    let client = BlobClient::new(account(
        &az,
        AuthMode::Workload,
        workload_vars(&ts, &file),
        false,
    ))
    .unwrap();
    let started = Instant::now();
    let e = client.list_containers().await.unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("workload identity")
            && msg.contains("not trusted")
            && msg.contains("--ca-file"),
        "{msg}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a certificate refusal is not retried"
    );
    assert_eq!(ts.state.count("federated"), 1);
}

#[tokio::test]
async fn login_chain_takes_workload_identity_before_managed_identity() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, federated_token()).unwrap();
    // A pod on AKS: workload identity's variables, and IMDS reachable too.
    let mut vars = workload_vars(&ts, &file);
    vars.extend(imds_vars(&ts));
    let client = BlobClient::new(account(&az, AuthMode::Login, vars, true)).unwrap();
    client.list_containers().await.unwrap();
    assert_eq!(ts.state.count("federated"), 1);
    assert_eq!(ts.state.count("imds"), 0);

    // A token file that cannot be read is said, naming the variable.
    std::fs::remove_file(&file).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(workload_vars(&ts, &file))
        .args(["--auth", "workload", "--account", &az.endpoint()])
        .args(["--ca-file", &az.pki.ca_path.display().to_string(), "list"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.trim().lines().last().unwrap_or_default();
    assert!(last.starts_with("blobdrive: "), "{last}");
    assert!(last.contains("AZURE_FEDERATED_TOKEN_FILE"), "{last}");
    assert_eq!(ts.state.count("federated"), 1, "no request without a token");
}

/// `mount -t blobdrive` from /etc/fstab: mount(8) passes no environment,
/// so workload identity's variables come from the `credentials=` file.
/// The Azurite certificate is not trusted here (the helper has no
/// `--ca-file`), so the mount stops at the first blob request, after the
/// file's federated token was sent for a token.
#[tokio::test]
async fn an_fstab_mount_signs_in_with_workload_identity_from_its_credentials_file() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let federated = federated_token();
    std::fs::write(&token_file, &federated).unwrap();
    let credentials = dir.path().join("account.env");
    let mut lines = vec![
        format!("AZURE_STORAGE_ACCOUNT={}", az.endpoint()),
        "AZURE_STORAGE_AUTH_MODE=workload".to_string(),
    ];
    lines.extend(
        workload_vars(&ts, &token_file)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}")),
    );
    std::fs::write(&credentials, lines.join("\n") + "\n").unwrap();
    std::fs::set_permissions(&credentials, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .arg0("mount.blobdrive")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .arg(format!("{}/disk.vhd", container()))
        .arg(&mountpoint)
        .args(["-o", &format!("ro,credentials={}", credentials.display())])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("certificate"), "{stderr}");
    assert_eq!(ts.state.count("federated"), 1, "{stderr}");
    assert_eq!(
        *ts.state.assertions.lock().unwrap(),
        vec![federated.clone()]
    );
    assert_no_secret("the helper's output", &stderr, &[federated]);
}

/// Stand-ins for `az` and `azd` in `dir`: each records its arguments (one
/// a line) in `NAME.args` and its environment in `NAME.env`, and prints `NAME.json`, or, when `NAME.err`
/// exists, prints that to standard error and fails as a signed-out tool does.
fn fake_login_tools(dir: &std::path::Path, token: &str) {
    use std::os::unix::fs::PermissionsExt;
    let expires = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let az =
        serde_json::json!({"accessToken": token, "expires_on": expires, "tokenType": "Bearer"});
    let rfc3339 = time::OffsetDateTime::from_unix_timestamp(expires as i64)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let azd = serde_json::json!({"token": token, "expiresOn": rfc3339});
    for (name, answer) in [("az", az), ("azd", azd)] {
        let script = dir.join(name);
        std::fs::write(
            &script,
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$0.args\"\nenv > \"$0.env\"\nif [ -e \"$0.err\" ]; then cat \"$0.err\" >&2; exit 1; fi\ncat \"$0.json\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join(format!("{name}.json")), answer.to_string()).unwrap();
    }
}

#[tokio::test]
async fn azure_cli_and_developer_cli_sign_in_with_their_tokens() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    // The token each tool would hold after its login: one from the token server.
    let form = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("grant_type", "client_credentials")
        .append_pair("client_id", CLIENT_ID)
        .append_pair("client_secret", CLIENT_SECRET)
        .append_pair("scope", "https://storage.azure.com/.default")
        .finish();
    let body = reqwest::Client::new()
        .post(format!("{}/{TENANT}/oauth2/v2.0/token", ts.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let token = answer["access_token"].as_str().unwrap().to_string();
    let bin = tempfile::tempdir().unwrap();
    fake_login_tools(bin.path(), &token);
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    let ca = az.pki.ca_path.display().to_string();
    let run = |mode: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_blobdrive"))
            .env_clear()
            .env("PATH", &path)
            // The daemon's other credentials, which the tools must not see.
            .env("AZURE_STORAGE_KEY", "c2VjcmV0LWtleS1ieXRlcw==")
            .env("AZURE_STORAGE_SAS_TOKEN", "sv=2024&sig=never-shown")
            .env("AZURE_CLIENT_SECRET", CLIENT_SECRET)
            .env("IDENTITY_HEADER", IDENTITY_HEADER)
            .args([
                "--auth",
                mode,
                "--account",
                &az.endpoint(),
                "--ca-file",
                &ca,
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let c = container();
    for (mode, tool, expected) in [
        (
            "cli",
            "az",
            "account get-access-token --resource https://storage.azure.com/ -o json",
        ),
        (
            "azd",
            "azd",
            "auth token --output json --no-prompt --scope https://storage.azure.com/.default",
        ),
    ] {
        let drive = format!("{c}/{tool}.vhd");
        for args in [
            vec!["create", drive.as_str(), "--size", "16M"],
            vec!["info", drive.as_str()],
            vec!["delete", drive.as_str()],
        ] {
            let out = run(mode, &args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "--auth {mode} {args:?}: {stderr}");
            assert!(!stderr.contains(&token), "a token in: {stderr}");
        }
        let env = std::fs::read_to_string(bin.path().join(format!("{tool}.env"))).unwrap();
        for withheld in [
            "AZURE_STORAGE_KEY",
            "AZURE_STORAGE_SAS_TOKEN",
            "AZURE_CLIENT_SECRET",
            "IDENTITY_HEADER",
        ] {
            assert!(!env.contains(withheld), "{tool} saw {withheld}");
        }
        let seen = std::fs::read_to_string(bin.path().join(format!("{tool}.args"))).unwrap();
        assert_eq!(
            seen.split_whitespace().collect::<Vec<_>>().join(" "),
            expected
        );
    }

    // Signed out: the tool's own words, one line.
    std::fs::write(
        bin.path().join("azd.err"),
        r#"{"type":"consoleMessage","timestamp":"2026-01-18T00:00:00Z","data":{"message":"\nERROR: not logged in, run `azd auth login` to login\n"}}"#,
    )
    .unwrap();
    let out = run("azd", &["list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("Azure Developer CLI") && stderr.contains("run `azd auth login`"),
        "{stderr}"
    );

    // Run as root, an az that others may change is not run.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::PermissionsExt;
        let az_path = bin.path().join("az");
        std::fs::set_permissions(&az_path, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::remove_file(bin.path().join("az.args")).unwrap();
        let out = run("cli", &["list"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("refusing to run {} as root", az_path.display())),
            "{stderr}"
        );
        assert!(!bin.path().join("az.args").exists(), "az was run");
    }
}

#[tokio::test]
async fn short_lived_tokens_are_refreshed_during_a_long_run() {
    logs();
    let az = HttpsAzurite::start();
    // Tokens live 4 s; the client refreshes 2 s before expiry.
    let ts = TokenServer::start(4);
    let mut acct = account(&az, AuthMode::Msi, imds_vars(&ts), true);
    acct.options.token_refresh_margin = Duration::from_secs(2);
    let client = BlobClient::new(acct).unwrap();
    let c = container();
    client.create_container(&c).await.unwrap();
    let path = BlobPath::new(&c, "long.vhd").unwrap();
    client.create_page_blob(&path, 1 << 20).await.unwrap();
    let started = Instant::now();
    let mut ops = 0u64;
    let mut i = 0u64;
    // Several writers at once, so refreshes meet concurrent requests.
    while started.elapsed() < Duration::from_secs(11) {
        let mut tasks = Vec::new();
        for w in 0..4u64 {
            let client = client.clone();
            let path = path.clone();
            let off = ((i * 4 + w) % 2048) * 512;
            tasks.push(tokio::spawn(async move {
                client
                    .put_pages(&path, off, pattern(512, off as u8), None)
                    .await
                    .unwrap();
                let got = client
                    .get_blob_range(&path, ByteRange::new(off, off + 512))
                    .await
                    .unwrap();
                assert_eq!(got, pattern(512, off as u8));
            }));
        }
        for t in tasks {
            t.await.unwrap();
            ops += 2;
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client.delete_container(&c).await.unwrap();
    let fetched = ts.state.count("imds");
    eprintln!("{ops} operations in 11 s used {fetched} tokens");
    // 11 s of 4 s tokens refreshed at 2 s left: about 5 or 6 tokens.
    assert!((4..=8).contains(&fetched), "{fetched} token requests");
    assert_eq!(client.token_fetches(), fetched);
    assert_eq!(client.retries(), 0, "no request needed a retry");
}

/// Lifetime of the tokens the long mount gets, seconds.
const MOUNT_TOKEN_LIFE_S: u64 = 6;

#[test]
fn a_mount_outlives_its_tokens_and_keeps_reading_and_writing() {
    if !mount_support::can_run(
        "a_mount_outlives_its_tokens_and_keeps_reading_and_writing",
        false,
    ) {
        return;
    }
    logs();
    const MIB: u64 = 1 << 20;
    const SLOT_BYTES: u64 = MIB / 2;
    const IO_BYTES: usize = 64 << 10;
    let drive_bytes = 64 * MIB;
    let life = Duration::from_secs(MOUNT_TOKEN_LIFE_S);
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(MOUNT_TOKEN_LIFE_S as i64);
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    // The test's own client signs in as the service principal, so every
    // managed-identity token is one the daemon asked for.
    let acct = account(&az, AuthMode::Sp, sp_vars(&ts, CLIENT_SECRET), true);
    let client = BlobClient::new(acct).unwrap();
    let c = container();
    assert!(rt.block_on(client.create_container(&c)).unwrap());
    let path = BlobPath::new(&c, "long.vhd").unwrap();
    rt.block_on(common::make_drive(&client, &path, drive_bytes));
    // The upper half holds known bytes, for reads the daemon has not cached.
    let half = drive_bytes / 2;
    for off in (half..drive_bytes).step_by(4 * MIB as usize) {
        rt.block_on(client.put_pages(&path, off, pattern(4 * MIB as usize, off as u8), None))
            .unwrap();
    }
    let seeded = |off: u64| {
        let chunk = off - off % (4 * MIB);
        let at = (off - chunk) as usize;
        pattern(4 * MIB as usize, chunk as u8).slice(at..at + IO_BYTES)
    };

    // The daemon logs at trace level (checked for secrets at the end).
    let sandbox = mount_support::Sandbox::new(String::new())
        .with_env("BLOBDRIVE_IMDS_ENDPOINT", &ts.imds_endpoint())
        .with_env("RUST_LOG", "trace");
    let endpoint = az.endpoint();
    let ca = az.pki.ca_path.display().to_string();
    let started = Instant::now();
    let mount = sandbox.mount(
        "ns",
        Some(&c),
        &[
            "-vvv",
            "--auth",
            "msi",
            "--account",
            &endpoint,
            "--ca-file",
            &ca,
        ],
    );
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.path("long.vhd"))
        .expect("open the drive file");

    // One round: an unaligned write made durable with fsync and found in the
    // blob, and a read of bytes the daemon has to fetch.
    let mut slot = 0u64;
    let mut round = |what: &str| {
        use std::os::unix::fs::FileExt;
        assert!(slot < half / SLOT_BYTES, "out of slots");
        let data = pattern(IO_BYTES, slot as u8 ^ 0x5a);
        let at = slot * SLOT_BYTES + 1000;
        file.write_all_at(&data, at)
            .unwrap_or_else(|e| panic!("write {what}: {e}\n{}", mount.log_text()));
        file.sync_data()
            .unwrap_or_else(|e| panic!("fsync {what}: {e}\n{}", mount.log_text()));
        let stored = rt
            .block_on(client.get_blob_range(&path, ByteRange::new(at, at + IO_BYTES as u64)))
            .unwrap();
        assert!(
            stored == data,
            "{what}: the fsynced write is not in the blob"
        );
        let mut got = vec![0u8; IO_BYTES];
        let from = half + slot * SLOT_BYTES;
        file.read_exact_at(&mut got, from)
            .unwrap_or_else(|e| panic!("read {what}: {e}\n{}", mount.log_text()));
        assert!(got == seeded(from), "{what}: read the wrong bytes");
        slot += 1;
    };
    // Busy through two token lifetimes: refreshed while in use.
    while started.elapsed() < 2 * life {
        round("while busy");
        std::thread::sleep(Duration::from_millis(400));
    }
    // Idle for longer than a token lives: the daemon's token expires unused
    // (nothing is dirty, so nothing is sent), and the next request needs a
    // new one.
    let before_idle = ts.state.count("imds");
    std::thread::sleep(life + Duration::from_secs(1));
    assert_eq!(
        ts.state.count("imds"),
        before_idle,
        "an idle mount asks for no token"
    );
    let resumed = Instant::now();
    while resumed.elapsed() < life {
        round("after the token expired");
        std::thread::sleep(Duration::from_millis(400));
    }
    let stats = sandbox.stats(&mount.dir);
    let device = &stats["devices"][format!("{c}/long.vhd")];
    assert_eq!(
        device["retries"].as_u64(),
        Some(0),
        "no request failed: {stats}"
    );
    drop(file);
    let log_path = mount.log.clone();
    mount.unmount();
    let elapsed = started.elapsed();
    let props = rt.block_on(client.get_properties(&path)).unwrap();
    assert_eq!(
        props.lease_state,
        Some(LeaseState::Available),
        "lease released"
    );

    let fetched = ts.state.count("imds");
    assert!(fetched > before_idle, "no token after the idle one expired");
    eprintln!(
        "the mount lived {elapsed:.1?} on {MOUNT_TOKEN_LIFE_S}-s tokens, {slot} rounds of I/O, {fetched} tokens"
    );
    assert!(fetched >= 3, "only {fetched} token(s) for {elapsed:?}");
    // A token is refreshed once at most half its life is left (the default
    // margin of 5 minutes is longer than these tokens live), so the daemon
    // needs about two tokens per lifetime while busy; not one per request.
    let most = elapsed.as_secs() / (MOUNT_TOKEN_LIFE_S / 2) + 2;
    assert!(
        fetched <= most,
        "{fetched} tokens in {elapsed:?}: refreshed far more often than at half-life"
    );
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert_eq!(
        log.matches("got an access token").count() as u64,
        fetched,
        "the daemon logs each token it gets: {log}"
    );
    assert!(
        !log.contains("access token refused"),
        "the daemon sent a token the service called expired: {log}"
    );
    let mut secrets = ts.tokens();
    secrets.push(CLIENT_SECRET.to_string());
    assert_no_secret("the daemon's log", &log, &secrets);
    assert_no_secret("the logs", &log_text(), &secrets);
}

#[tokio::test]
async fn a_token_the_service_calls_expired_is_replaced_once() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    // The first token claims an hour but is already expired inside.
    ts.state.lie_about_expiry.store(true, Ordering::SeqCst);
    let client = BlobClient::new(account(&az, AuthMode::Msi, imds_vars(&ts), true)).unwrap();
    client.list_containers().await.unwrap();
    assert_eq!(ts.state.count("imds"), 2, "refused token replaced once");
    client.list_containers().await.unwrap();
    assert_eq!(ts.state.count("imds"), 2);
}

#[tokio::test]
async fn unknown_ca_is_refused_clearly_and_accepted_with_ca_file() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    let client = BlobClient::new(account(&az, AuthMode::Msi, imds_vars(&ts), false)).unwrap();
    let started = Instant::now();
    let e = client.list_containers().await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Tls, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("not trusted") && msg.contains("--ca-file"),
        "{msg}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a certificate refusal is not retried"
    );
    // The same with --ca-file works.
    let client = BlobClient::new(account(&az, AuthMode::Msi, imds_vars(&ts), true)).unwrap();
    client.list_containers().await.unwrap();

    // The command line: `list` refused without --ca-file, fine with it.
    let base = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobdrive"));
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("BLOBDRIVE_IMDS_ENDPOINT", ts.imds_endpoint())
            .args(["--auth", "msi", "--account", &az.endpoint(), "list"])
            .args(extra);
        cmd.output().unwrap()
    };
    let out = base(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--ca-file"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let ca = az.pki.ca_path.display().to_string();
    let out = base(&["--ca-file", &ca]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn refused_token_request_says_why_without_the_secret() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    let wrong = "Wr0ng~client-secret-value-do-not-print";
    let client = BlobClient::new(account(&az, AuthMode::Sp, sp_vars(&ts, wrong), true)).unwrap();
    let e = client.list_containers().await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credential, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("AADSTS7000215"), "{msg}");
    assert!(msg.contains("invalid_client"), "{msg}");
    assert!(
        !msg.contains(wrong) && !msg.contains(CLIENT_SECRET),
        "{msg}"
    );
    assert!(!format!("{e:?}").contains(wrong));
    assert_eq!(ts.state.count("secret"), 1, "a refusal is not retried");

    // An unknown application (AADSTS700016) through the command line.
    ts.state.refuse.store(true, Ordering::SeqCst);
    let out = Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(sp_vars(&ts, CLIENT_SECRET))
        .args(["-vvv", "--auth", "sp", "--account", &az.endpoint()])
        .args(["--ca-file", &az.pki.ca_path.display().to_string(), "list"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.trim().lines().last().unwrap_or_default();
    assert!(last.starts_with("blobdrive: "), "{last}");
    assert!(last.contains("AADSTS700016"), "{last}");
    assert!(!stderr.contains(CLIENT_SECRET), "{stderr}");
}

#[tokio::test]
async fn no_identity_available_names_every_source_tried() {
    logs();
    let az = HttpsAzurite::start();
    let closed = common::https_azurite::free_port();
    let empty_path = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .env_clear()
        .env("PATH", empty_path.path())
        .env(
            "BLOBDRIVE_IMDS_ENDPOINT",
            format!("http://127.0.0.1:{closed}/metadata/identity/oauth2/token"),
        )
        .env("AZURE_STORAGE_AUTH_MODE", "login")
        .env("AZURE_STORAGE_ACCOUNT", az.endpoint())
        .args(["--ca-file", &az.pki.ca_path.display().to_string(), "list"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for source in [
        "no Microsoft Entra identity is available",
        "environment service principal",
        "workload identity",
        "managed identity",
        "Azure CLI",
        "az login",
        "Azure Developer CLI",
        "azd auth login",
    ] {
        assert!(stderr.contains(source), "{source} missing: {stderr}");
    }
}

#[tokio::test]
async fn missing_role_assignment_names_the_role_needed() {
    logs();
    let ts = TokenServer::start(3600);
    // A loopback "account" whose every answer is 403 AuthorizationPermissionMismatch.
    let opts = AccountOptions {
        auth: Some(AuthMode::Msi),
        account: Some(format!("{}/denied", ts.url)),
        ..Default::default()
    };
    let acct = Account::from_lookup_with(None, &opts, lookup(imds_vars(&ts))).unwrap();
    let client = BlobClient::new(acct).unwrap();
    let e = client.list_containers().await.unwrap_err();
    assert_eq!(e.status, Some(403));
    assert_eq!(e.code(), Some("AuthorizationPermissionMismatch"));
    let msg = e.to_string();
    assert!(msg.contains("Storage Blob Data Contributor"), "{msg}");
    assert!(msg.contains("managed identity"), "{msg}");
    assert_eq!(
        ts.state.denied.load(Ordering::SeqCst),
        1,
        "a 403 is not retried"
    );
}

#[test]
fn plain_http_is_refused_for_a_real_account_unless_allowed() {
    let opts = |allow_http| AccountOptions {
        account: Some("http://myacct.blob.core.windows.net".into()),
        allow_http,
        ..Default::default()
    };
    let vars = || lookup(vec![("AZURE_STORAGE_KEY", "a2V5LWZvci10ZXN0cw==".into())]);
    let acct = Account::from_lookup_with(None, &opts(false), vars()).unwrap();
    let e = BlobClient::new(acct).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Config);
    assert!(e.to_string().contains("--allow-http"), "{e}");
    let acct = Account::from_lookup_with(None, &opts(true), vars()).unwrap();
    BlobClient::new(acct).unwrap();
    // Development storage on loopback needs no flag.
    BlobClient::new(Account::development()).unwrap();
}

#[tokio::test]
async fn no_secret_in_logs_errors_or_help() {
    logs();
    let az = HttpsAzurite::start();
    let ts = TokenServer::start(3600);
    // Work with a secret, a certificate-less SP refusal and an identity header.
    let client = BlobClient::new(account(
        &az,
        AuthMode::Sp,
        sp_vars(&ts, CLIENT_SECRET),
        true,
    ))
    .unwrap();
    exercise_every_operation(&client).await;
    let dbg = format!("{client:?}");
    let vars = vec![
        ("IDENTITY_ENDPOINT", ts.identity_endpoint()),
        ("IDENTITY_HEADER", IDENTITY_HEADER.to_string()),
    ];
    let msi = BlobClient::new(account(&az, AuthMode::Msi, vars, true)).unwrap();
    msi.list_containers().await.unwrap();
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    let federated = federated_token();
    std::fs::write(&token_file, &federated).unwrap();
    let wi = BlobClient::new(account(
        &az,
        AuthMode::Workload,
        workload_vars(&ts, &token_file),
        true,
    ))
    .unwrap();
    wi.list_containers().await.unwrap();
    let dbg = format!("{dbg}{wi:?}");

    // The command line at the highest verbosity, with every secret in its environment.
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_blobdrive"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(sp_vars(&ts, CLIENT_SECRET))
            .env("IDENTITY_HEADER", IDENTITY_HEADER)
            .env("AZURE_FEDERATED_TOKEN_FILE", &token_file)
            .env("AZURE_STORAGE_KEY", "c2VjcmV0LWtleS1ieXRlcw==")
            .env("RUST_LOG", "trace")
            .args(args)
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let ca = az.pki.ca_path.display().to_string();
    let endpoint = az.endpoint();
    let mut outputs = vec![
        run(&["--help"]),
        run(&["list", "--help"]),
        run(&["mount", "--help"]),
        run(&[
            "-vvv",
            "--auth",
            "sp",
            "--account",
            &endpoint,
            "--ca-file",
            &ca,
            "list",
        ]),
        run(&[
            "-vvv",
            "--auth",
            "workload",
            "--account",
            &endpoint,
            "--ca-file",
            &ca,
            "list",
        ]),
    ];
    ts.state.refuse.store(true, Ordering::SeqCst);
    // The authority quotes the federated token back when it refuses it.
    let refused = BlobClient::new(account(
        &az,
        AuthMode::Workload,
        workload_vars(&ts, &token_file),
        true,
    ))
    .unwrap()
    .list_containers()
    .await
    .unwrap_err();
    let refused = format!("{refused} {refused:?}");
    assert!(refused.contains("AADSTS700211"), "{refused}");
    outputs.push(refused);
    outputs.push(run(&[
        "-vvv",
        "--auth",
        "workload",
        "--account",
        &endpoint,
        "--ca-file",
        &ca,
        "list",
    ]));
    outputs.push(run(&[
        "-vvv",
        "--auth",
        "sp",
        "--account",
        &endpoint,
        "--ca-file",
        &ca,
        "list",
    ]));
    assert!(
        outputs[3].contains("signed") || outputs[3].contains("token"),
        "trace output expected: {}",
        outputs[3]
    );

    let mut secrets: Vec<String> = ts.tokens();
    assert!(secrets.len() >= 3, "tokens were issued");
    secrets.extend(
        [CLIENT_SECRET, IDENTITY_HEADER, "c2VjcmV0LWtleS1ieXRlcw=="]
            .iter()
            .map(|s| s.to_string()),
    );
    assert!(
        outputs
            .iter()
            .any(|o| o.contains("AADSTS700211") && o.contains("blobdrive: ")),
        "the refusal reached the command line"
    );
    assert_eq!(ts.state.count("federated"), 4, "workload identity was used");
    secrets.push(federated);
    let logs = log_text();
    assert!(
        logs.contains("TRACE") || logs.contains("DEBUG"),
        "logs captured"
    );
    assert_no_secret("the logs", &logs, &secrets);
    for secret in &secrets {
        assert!(
            find_secret(&dbg, secret).is_none(),
            "a secret in Debug output"
        );
        for out in &outputs {
            assert_no_secret("CLI output", out, std::slice::from_ref(secret));
        }
    }
}
