//! The blob layer's error: which operation failed on which target, the HTTP
//! status and the service's `x-ms-error-code`. It never holds a key, a SAS
//! signature or an `Authorization` header, so it is safe to print and log.

use std::fmt;

/// What went wrong, coarsely, so callers can decide without string matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The service answered with a non-success status (see `status` and `code`).
    Service,
    /// The request never got an answer: connection refused or reset, timeout,
    /// after the retry budget was spent.
    Transport,
    /// The caller asked for something the client refuses before sending it
    /// (unaligned range, Put Page body over 4 MiB, bad name).
    InvalidInput,
    /// The service answered, but the answer could not be understood
    /// (malformed XML, missing header, short body).
    Protocol,
    /// The account configuration is unusable (malformed connection string,
    /// key that is not base64, plain HTTP refused).
    Config,
    /// No access token could be had (no identity available, or the identity
    /// service refused): the message names the source and the service's reason.
    Credential,
    /// The server's TLS certificate is not trusted (not retried).
    Tls,
}

/// An error from the Azure Blob REST client.
#[derive(Debug, Clone)]
pub struct Error {
    /// Coarse classification.
    pub kind: ErrorKind,
    /// The operation that failed, e.g. `"put page"`.
    pub operation: &'static str,
    /// What it was aimed at: `account`, `container` or `container/blob`.
    pub target: String,
    /// HTTP status, when the service answered.
    pub status: Option<u16>,
    /// The service's error code (`x-ms-error-code`), when it sent one.
    pub code: Option<String>,
    /// A human explanation (never containing secrets).
    pub message: String,
    /// The service's `AuthenticationErrorDetail`, when it sent one.
    pub detail: Option<String>,
}

impl Error {
    /// An error answered by the service.
    pub fn service(
        operation: &'static str,
        target: impl Into<String>,
        status: u16,
        code: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        Error {
            kind: ErrorKind::Service,
            operation,
            target: target.into(),
            status: Some(status),
            code,
            message: message.into(),
            detail: None,
        }
    }

    /// An error of the given kind with no HTTP status.
    pub fn other(
        kind: ErrorKind,
        operation: &'static str,
        target: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error {
            kind,
            operation,
            target: target.into(),
            status: None,
            code: None,
            message: message.into(),
            detail: None,
        }
    }

    /// The service's error code, if any.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// True when the service said the target does not exist (404).
    pub fn is_not_found(&self) -> bool {
        self.status == Some(404)
    }

    /// True when a create failed because the target already exists
    /// (`BlobAlreadyExists`, `ContainerAlreadyExists`, or 409/412 on a conditional create).
    pub fn is_already_exists(&self) -> bool {
        matches!(
            self.code(),
            Some("BlobAlreadyExists") | Some("ContainerAlreadyExists")
        ) || (self.code().is_none() && matches!(self.status, Some(409) | Some(412)))
    }

    /// True when another holder has the lease (`LeaseAlreadyPresent`, or a
    /// lease id that does not match the one held).
    pub fn is_lease_conflict(&self) -> bool {
        matches!(
            self.code(),
            Some("LeaseAlreadyPresent") | Some("LeaseIdMismatchWithLeaseOperation")
        )
    }

    /// True when a write was refused because our lease is gone or was never
    /// there: the mount lock is lost.
    pub fn is_lease_lost(&self) -> bool {
        matches!(
            self.code(),
            Some("LeaseIdMissing")
                | Some("LeaseIdMismatchWithBlobOperation")
                | Some("LeaseNotPresentWithBlobOperation")
                | Some("LeaseLost")
                | Some("LeaseNotPresentWithLeaseOperation")
                | Some("LeaseIsBrokenAndCannotBeRenewed")
        )
    }

    /// True when the credentials were refused (401/403).
    pub fn is_auth_failure(&self) -> bool {
        matches!(self.status, Some(401) | Some(403))
    }

    /// True when a bearer token was refused in a way a fresh token may cure:
    /// 401 (`InvalidAuthenticationInfo`: expired or malformed token), or 403
    /// `AuthenticationFailed` whose detail says the token's lifetime is over.
    pub fn is_stale_token(&self) -> bool {
        match self.status {
            Some(401) => true,
            Some(403) => {
                matches!(
                    self.code(),
                    Some("AuthenticationFailed") | Some("InvalidAuthenticationInfo")
                ) && self
                    .detail
                    .as_deref()
                    .is_some_and(|d| d.contains("expired") || d.contains("Lifetime"))
            }
            _ => false,
        }
    }

    /// True when the service says it is over its targets: 503
    /// (`ServerBusy`), 500 `OperationTimedOut`, or 429. Its guidance is to
    /// send less (`limiter.rs`), not only to retry.
    pub fn is_overload(&self) -> bool {
        self.kind == ErrorKind::Service
            && match self.status {
                Some(503) | Some(429) => true,
                Some(500) => self.code.as_deref() == Some("OperationTimedOut"),
                _ => false,
            }
    }

    /// True for failures worth retrying: 5xx, 408, 429 and transport faults.
    pub fn is_transient(&self) -> bool {
        match self.kind {
            ErrorKind::Transport => true,
            ErrorKind::Service => {
                matches!(self.status, Some(s) if s >= 500 || s == 408 || s == 429)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} failed", self.operation, self.target)?;
        match (self.status, &self.code) {
            (Some(s), Some(c)) => write!(f, " (HTTP {s} {c})")?,
            (Some(s), None) => write!(f, " (HTTP {s})")?,
            _ => {}
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// Result with the blob layer's error.
pub type Result<T> = std::result::Result<T, Error>;

/// Does a transport error's text (with its causes) say the server's TLS
/// certificate was refused? Such a failure is not transient: retrying
/// cannot make the certificate trusted.
pub(crate) fn is_certificate_problem(msg: &str) -> bool {
    [
        "invalid peer certificate",
        "UnknownIssuer",
        "certificate verify failed",
        "NotValidForName",
        "CertExpired",
        "BadSignature",
    ]
    .iter()
    .any(|needle| msg.contains(needle))
}
