//! The signed client assertion of a certificate service principal: a JWT
//! (RS256) whose header names the certificate by its SHA-1 thumbprint
//! (`x5t`), as Microsoft Entra ID requires.
//!
//! Owns loading the PEM (certificate and RSA private key in one file, as
//! `AZURE_CLIENT_CERTIFICATE_PATH` holds) and signing. Invariant: the key
//! never leaves this module and no `Debug` shows it.

use std::fmt;
use std::sync::Arc;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate and its RSA key, ready to sign assertions.
#[derive(Clone)]
pub(crate) struct SigningCert {
    key: Arc<RsaKeyPair>,
    /// base64url(SHA-1(certificate DER)).
    x5t: String,
}

impl fmt::Debug for SigningCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningCert")
            .field("x5t", &self.x5t)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl SigningCert {
    /// Parse a PEM holding the certificate (first one is used) and its
    /// unencrypted RSA private key (PKCS#8 or PKCS#1).
    pub(crate) fn from_pem(pem: &[u8]) -> Result<Self, String> {
        let cert = CertificateDer::pem_slice_iter(pem)
            .next()
            .ok_or("it holds no CERTIFICATE block")?
            .map_err(|_| "its CERTIFICATE block is malformed")?;
        let key = PrivateKeyDer::from_pem_slice(pem).map_err(|_| {
            "it holds no unencrypted private key (PRIVATE KEY or RSA PRIVATE KEY block); password-protected keys are not supported"
        })?;
        let key = match &key {
            PrivateKeyDer::Pkcs8(k) => RsaKeyPair::from_pkcs8(k.secret_pkcs8_der()),
            PrivateKeyDer::Pkcs1(k) => RsaKeyPair::from_der(k.secret_pkcs1_der()),
            _ => return Err("its private key is not an RSA key".into()),
        }
        .map_err(|_| "its private key is not a usable RSA key".to_string())?;
        let digest =
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, cert.as_ref());
        Ok(SigningCert {
            key: Arc::new(key),
            x5t: URL_SAFE_NO_PAD.encode(digest.as_ref()),
        })
    }

    /// A client assertion for `client_id` at `audience` (the token endpoint),
    /// valid for ten minutes.
    pub(crate) fn assertion(&self, client_id: &str, audience: &str) -> Result<String, String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| "the clock is before 1970")?
            .as_secs();
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "x5t": self.x5t});
        let claims = serde_json::json!({
            "aud": audience,
            "iss": client_id,
            "sub": client_id,
            "jti": uuid::Uuid::new_v4().to_string(),
            "nbf": now,
            "iat": now,
            "exp": now + 600,
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut sig = vec![0u8; self.key.public_modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signing_input.as_bytes(),
                &mut sig,
            )
            .map_err(|_| "signing the client assertion failed")?;
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }
}
