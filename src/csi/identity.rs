//! The CSI Identity service: the plugin's name and version, which services
//! it offers (Controller unless started `--node-only`), and whether it is
//! ready. It holds no state besides the roles it was started with.

use tonic::{Request, Response, Status};

use super::messages::{
    plugin_capability, BoolValue, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse,
    GetPluginInfoRequest, GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};
use super::services::identity::identity_server::Identity;
use super::DRIVER_NAME;

/// The Identity service.
#[derive(Debug, Clone)]
pub struct IdentityService {
    /// Whether this process serves the Controller service.
    pub controller: bool,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: crate::version::version(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = Vec::new();
        if self.controller {
            capabilities.push(PluginCapability {
                r#type: Some(plugin_capability::Type::Service(
                    plugin_capability::Service {
                        r#type: plugin_capability::service::Type::ControllerService as i32,
                    },
                )),
            });
        }
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(BoolValue { value: true }),
        }))
    }
}
