//! Which token source a sign-in mode means, from the environment.

use std::sync::Arc;

use super::{AzureCli, Chain, ManagedIdentity, ServicePrincipal, TokenProvider};

/// The token-based sign-in modes of `--auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenMode {
    /// Service principal, then managed identity, then Azure CLI.
    Login,
    /// Managed identity only.
    ManagedIdentity,
    /// Service principal only.
    ServicePrincipal,
    /// Azure CLI only.
    AzureCli,
}

/// The provider for `mode`, configured from `lookup` (environment
/// variables). An error says what is missing, never a value.
pub fn provider_from_lookup(
    mode: TokenMode,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn TokenProvider>, String> {
    match mode {
        TokenMode::ManagedIdentity => Ok(Arc::new(ManagedIdentity::from_lookup(lookup)?)),
        TokenMode::ServicePrincipal => match ServicePrincipal::from_lookup(lookup)? {
            Some(sp) => Ok(Arc::new(sp)),
            None => Err("--auth sp needs AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET (or AZURE_CLIENT_CERTIFICATE_PATH)".into()),
        },
        TokenMode::AzureCli => Ok(Arc::new(AzureCli::default())),
        TokenMode::Login => {
            let mut sources: Vec<Arc<dyn TokenProvider>> = Vec::new();
            let mut skipped = Vec::new();
            match ServicePrincipal::from_lookup(lookup) {
                Ok(Some(sp)) => sources.push(Arc::new(sp)),
                Ok(None) => skipped.push(
                    "environment service principal: AZURE_TENANT_ID/AZURE_CLIENT_ID/AZURE_CLIENT_SECRET not set".to_string(),
                ),
                // Set but broken: say so now rather than sign in as someone else.
                Err(e) => return Err(e),
            }
            let mut msi = ManagedIdentity::from_lookup(lookup)?;
            msi.probe = true;
            sources.push(Arc::new(msi));
            sources.push(Arc::new(AzureCli::default()));
            Ok(Arc::new(Chain::new(sources, skipped)))
        }
    }
}
