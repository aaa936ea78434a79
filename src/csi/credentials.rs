//! Which account a CSI call works in, and with what credential.
//!
//! A call's secrets win, under blob-csi-driver's key names:
//! `azurestorageaccountname` with `azurestorageaccountkey` (Shared Key) or
//! `azurestorageaccountsastoken` (a SAS). The endpoint is that of the
//! plugin's own account (below) when it has the same name (so a private
//! endpoint, a sovereign cloud or Azurite keep working), else the public
//! cloud's `https://NAME.blob.core.windows.net`. Without secrets, the
//! plugin's own account is used: the one every command picks, from its
//! flags and environment (`blob::Account::from_env_with`), workload
//! identity included.
//!
//! Invariant: no secret value reaches an error or a log; errors name the
//! secret's key only.

use std::collections::HashMap;

use tonic::Status;

use crate::blob::{Account, AccountOptions, AuthMode, BlobClient};

/// The secret key naming the storage account.
pub const ACCOUNT_NAME: &str = "azurestorageaccountname";
/// The secret key holding the account key (base64).
pub const ACCOUNT_KEY: &str = "azurestorageaccountkey";
/// The secret key holding a SAS token.
pub const SAS_TOKEN: &str = "azurestorageaccountsastoken";

/// The plugin's own account, as its flags and environment select it.
#[derive(Debug, Clone, Default)]
pub struct AccountSource {
    /// `--connection-string`, when given.
    pub connection_string: Option<String>,
    /// `--auth`, `--account`, `--ca-file`, `--allow-http`.
    pub options: AccountOptions,
}

impl AccountSource {
    /// The plugin's own account.
    fn own(&self) -> Result<Account, Status> {
        Account::from_env_with(self.connection_string.as_deref(), &self.options).map_err(|e| {
            Status::failed_precondition(format!(
                "the plugin's storage account is not usable: {}",
                crate::provision::checks::explain(&e)
            ))
        })
    }

    /// The account a call with `secrets` works in (see the module comment).
    pub fn account(&self, secrets: &HashMap<String, String>) -> Result<Account, Status> {
        let get = |k: &str| secrets.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let Some(name) = get(ACCOUNT_NAME) else {
            if get(ACCOUNT_KEY).is_some() || get(SAS_TOKEN).is_some() {
                return Err(Status::invalid_argument(format!(
                    "the secrets give a credential but no {ACCOUNT_NAME}"
                )));
            }
            return self.own();
        };
        let named = match (get(ACCOUNT_KEY), get(SAS_TOKEN)) {
            (Some(key), _) => Account::with_shared_key(name, key).map_err(|_| {
                Status::invalid_argument(format!(
                    "the secret {ACCOUNT_KEY} of account {name} is not a valid account key (base64)"
                ))
            })?,
            (None, Some(sas)) => Account::with_sas(name, sas).map_err(|_| {
                Status::invalid_argument(format!(
                    "the secret {SAS_TOKEN} of account {name} is not usable"
                ))
            })?,
            (None, None) => {
                return Err(Status::invalid_argument(format!(
                    "the secrets name account {name} but hold neither {ACCOUNT_KEY} nor {SAS_TOKEN}"
                )))
            }
        };
        match self.own() {
            Ok(mut own) if own.name == named.name => {
                own.credential = named.credential;
                Ok(own)
            }
            _ => Ok(named),
        }
    }

    /// A client of the account a call with `secrets` works in.
    pub fn client(&self, secrets: &HashMap<String, String>) -> Result<BlobClient, Status> {
        let account = self.account(secrets)?;
        BlobClient::new(account).map_err(|e| {
            Status::failed_precondition(format!(
                "cannot connect to the storage account: {}",
                crate::provision::checks::explain(&e)
            ))
        })
    }
}

/// `--auth`'s name for `mode`.
fn auth_name(mode: AuthMode) -> &'static str {
    match mode {
        AuthMode::Key => "key",
        AuthMode::Sas => "sas",
        AuthMode::Login => "login",
        AuthMode::Msi => "msi",
        AuthMode::Sp => "sp",
        AuthMode::Workload => "workload",
        AuthMode::Cli => "cli",
        AuthMode::Azd => "azd",
    }
}

/// The variables that pick an account; a command given the secrets'
/// account runs without them, so they cannot override it.
const ACCOUNT_VARIABLES: [&str; 5] = [
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_AUTH_MODE",
];

impl AccountSource {
    /// A `blobdrive` command (this binary) that works in the account a call
    /// with `secrets` works in. Credentials go in its environment, never on
    /// its command line: the secrets' account as a connection string, else
    /// the plugin's own flags and environment.
    pub fn command(
        &self,
        secrets: &HashMap<String, String>,
    ) -> Result<std::process::Command, Status> {
        let exe = std::env::current_exe()
            .map_err(|e| Status::internal(format!("cannot find the blobdrive binary: {e}")))?;
        let mut cmd = std::process::Command::new(exe);
        if let Some(ca) = &self.options.ca_file {
            cmd.arg("--ca-file").arg(ca);
        }
        if self.options.allow_http {
            cmd.arg("--allow-http");
        }
        if secrets.contains_key(ACCOUNT_NAME) {
            let account = self.account(secrets)?;
            for v in ACCOUNT_VARIABLES {
                cmd.env_remove(v);
            }
            cmd.env(
                "AZURE_STORAGE_CONNECTION_STRING",
                account.connection_string(),
            );
        } else {
            if let Some(cs) = &self.connection_string {
                cmd.env("AZURE_STORAGE_CONNECTION_STRING", cs);
            }
            if let Some(a) = &self.options.account {
                cmd.arg("--account").arg(a);
            }
            if let Some(mode) = self.options.auth {
                cmd.arg("--auth").arg(auth_name(mode));
            }
        }
        Ok(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::Credential;

    fn secrets(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn secrets_naming_the_own_account_keep_its_endpoint() {
        let source = AccountSource {
            connection_string: Some("UseDevelopmentStorage=true".into()),
            options: AccountOptions::default(),
        };
        let key = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b"k");
        let acct = source
            .account(&secrets(&[
                (ACCOUNT_NAME, "devstoreaccount1"),
                (ACCOUNT_KEY, &key),
            ]))
            .expect("account");
        assert!(acct
            .endpoint
            .as_str()
            .starts_with("http://127.0.0.1:10000/"));
        assert!(matches!(acct.credential, Credential::SharedKey { ref key } if key == b"k"));
        let other = source
            .account(&secrets(&[
                (ACCOUNT_NAME, "other"),
                (SAS_TOKEN, "?sv=1&sig=x"),
            ]))
            .expect("account");
        assert_eq!(
            other.endpoint.as_str(),
            "https://other.blob.core.windows.net/"
        );
    }

    #[test]
    fn bad_secrets_name_the_key_and_never_the_value() {
        let source = AccountSource::default();
        let err = source
            .account(&secrets(&[
                (ACCOUNT_NAME, "a"),
                (ACCOUNT_KEY, "not base64 SECRETVALUE"),
            ]))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(ACCOUNT_KEY), "{}", err.message());
        assert!(!err.message().contains("SECRETVALUE"), "{}", err.message());
        let err = source
            .account(&secrets(&[(ACCOUNT_KEY, "a2V5")]))
            .unwrap_err();
        assert!(err.message().contains(ACCOUNT_NAME), "{}", err.message());
    }
}
