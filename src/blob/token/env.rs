//! Which token source a sign-in mode means, from the environment.

use std::sync::Arc;

use super::{AzureCli, AzureDeveloperCli, Chain, ManagedIdentity, ServicePrincipal, TokenProvider};

/// The token-based sign-in modes of `--auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenMode {
    /// Service principal, then workload identity, then managed identity,
    /// then Azure CLI, then Azure Developer CLI.
    Login,
    /// Managed identity only.
    ManagedIdentity,
    /// Service principal only.
    ServicePrincipal,
    /// Workload identity (a federated token file) only.
    WorkloadIdentity,
    /// Azure CLI only.
    AzureCli,
    /// Azure Developer CLI only.
    AzureDeveloperCli,
}

/// The provider for `mode`, configured from `lookup` (environment
/// variables). An error says what is missing, never a value. `az` and
/// `azd` are found on `PATH` now, so a mount's daemon (built from this
/// before it starts) never searches `PATH` itself.
pub fn provider_from_lookup(
    mode: TokenMode,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn TokenProvider>, String> {
    let path = lookup("PATH");
    match mode {
        TokenMode::ManagedIdentity => Ok(Arc::new(ManagedIdentity::from_lookup(lookup)?)),
        TokenMode::ServicePrincipal => match ServicePrincipal::from_lookup(lookup)? {
            Some(sp) => Ok(Arc::new(sp)),
            None => Err("--auth sp needs AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET (or AZURE_CLIENT_CERTIFICATE_PATH; for AZURE_FEDERATED_TOKEN_FILE use --auth workload)".into()),
        },
        TokenMode::WorkloadIdentity => match ServicePrincipal::workload_identity_from_lookup(lookup)? {
            Some(wi) => Ok(Arc::new(wi)),
            None => Err("--auth workload needs AZURE_FEDERATED_TOKEN_FILE, AZURE_TENANT_ID and AZURE_CLIENT_ID (set in a pod that uses workload identity)".into()),
        },
        TokenMode::AzureCli => Ok(Arc::new(AzureCli::on_path(path.as_deref()))),
        TokenMode::AzureDeveloperCli => Ok(Arc::new(AzureDeveloperCli::on_path(path.as_deref()))),
        TokenMode::Login => {
            let mut sources: Vec<Arc<dyn TokenProvider>> = Vec::new();
            let mut skipped = Vec::new();
            // Set but broken variables are said now rather than signing in
            // as someone else.
            match ServicePrincipal::from_lookup(lookup)? {
                Some(sp) => sources.push(Arc::new(sp)),
                None => skipped.push(
                    "environment service principal: AZURE_TENANT_ID/AZURE_CLIENT_ID/AZURE_CLIENT_SECRET not set".to_string(),
                ),
            }
            match ServicePrincipal::workload_identity_from_lookup(lookup)? {
                Some(wi) => sources.push(Arc::new(wi)),
                None => skipped.push("workload identity: AZURE_FEDERATED_TOKEN_FILE not set".to_string()),
            }
            let mut msi = ManagedIdentity::from_lookup(lookup)?;
            msi.probe = true;
            sources.push(Arc::new(msi));
            sources.push(Arc::new(AzureCli::on_path(path.as_deref())));
            sources.push(Arc::new(AzureDeveloperCli::on_path(path.as_deref())));
            Ok(Arc::new(Chain::new(sources, skipped)))
        }
    }
}
