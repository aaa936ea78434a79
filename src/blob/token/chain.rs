//! The `login` chain (the Azure SDKs' default order): environment service
//! principal, workload identity, managed identity, Azure CLI, Azure
//! Developer CLI. The first source that gives a
//! token is kept for the life of the client; a source that is not set up
//! here is skipped; a source that is set up and refused stops the chain
//! (a wrong secret must not silently fall back to another identity).

use std::sync::{Arc, Mutex};

use super::{AccessToken, TokenError, TokenErrorKind, TokenProvider};

/// Sources tried in order.
#[derive(Debug)]
pub struct Chain {
    sources: Vec<Arc<dyn TokenProvider>>,
    /// Sources left out before any request, with why (e.g. variables unset).
    skipped: Vec<String>,
    chosen: Mutex<Option<usize>>,
}

impl Chain {
    /// A chain of `sources`; `skipped` lists sources not configured, for
    /// the "no identity" message.
    pub fn new(sources: Vec<Arc<dyn TokenProvider>>, skipped: Vec<String>) -> Chain {
        Chain {
            sources,
            skipped,
            chosen: Mutex::new(None),
        }
    }
}

#[async_trait::async_trait]
impl TokenProvider for Chain {
    fn name(&self) -> String {
        let chosen = *self.chosen.lock().expect("chain lock is never poisoned");
        match chosen {
            Some(i) => self.sources[i].name(),
            None => "sign-in (login)".to_string(),
        }
    }

    async fn fetch(&self, http: &reqwest::Client) -> Result<AccessToken, TokenError> {
        let chosen = *self.chosen.lock().expect("chain lock is never poisoned");
        if let Some(i) = chosen {
            return self.sources[i].fetch(http).await;
        }
        let mut tried = self.skipped.clone();
        for (i, source) in self.sources.iter().enumerate() {
            match source.fetch(http).await {
                Ok(token) => {
                    tracing::info!(source = %source.name(), "signed in");
                    *self.chosen.lock().expect("chain lock is never poisoned") = Some(i);
                    return Ok(token);
                }
                Err(e) if e.kind == TokenErrorKind::Unavailable => {
                    tracing::debug!(error = %e, "token source unavailable");
                    tried.push(e.to_string());
                }
                Err(e) => return Err(e),
            }
        }
        Err(TokenError::new(
            TokenErrorKind::Unavailable,
            "sign-in (login)",
            format!(
                "no Microsoft Entra identity is available; tried: {}. Set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET (or AZURE_CLIENT_CERTIFICATE_PATH), use workload identity (AZURE_FEDERATED_TOKEN_FILE), run on Azure with a managed identity, or run 'az login' or 'azd auth login'",
                tried.join("; ")
            ),
        ))
    }
}
