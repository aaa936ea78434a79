//! The CSI Controller service: volumes made and deleted in the account.
//!
//! CreateVolume makes the drive `CONTAINER/NAME` with `provision::create`
//! (the one way a drive is made: container created if missing, conditional
//! create, footer), sized as [`super::volume::capacity`] says. It is
//! idempotent by name: when the drive exists and its size meets the
//! request's capacity range, the call succeeds with it; a size outside the
//! range is `ALREADY_EXISTS`. DeleteVolume deletes with
//! `provision::delete` (the refusals every caller gets): a missing volume
//! is success (it is idempotent), a leased one (attached on some node) is
//! `FAILED_PRECONDITION`, and so is one with snapshots (this slice keeps
//! snapshots tied to their drive; see docs/guide/kubernetes.md).
//!
//! Errors carry the spec's gRPC codes and one line; a storage failure that
//! may pass is `UNAVAILABLE` (the sidecar retries), a refused credential
//! `PERMISSION_DENIED`, anything else `INTERNAL`.

use tonic::{Request, Response, Status};

use super::credentials::AccountSource;
use super::messages::{
    controller_service_capability as csc, validate_volume_capabilities_response::Confirmed,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerServiceCapability, CreateVolumeRequest, CreateVolumeResponse, DeleteVolumeRequest,
    DeleteVolumeResponse, ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse,
    Volume,
};
use super::services::controller::controller_server::Controller;
use super::volume::{
    capacity, check_capabilities, path_for, unsupported, VolumeId, CONTAINER_PARAMETER,
    DEFAULT_CONTAINER,
};
use crate::blob::{BlobClient, BlobPath, Error as BlobError};
use crate::provision::checks::{check_disk, explain};
use crate::provision::create::{create_drive, CreateError};
use crate::provision::delete::{delete_drive, DeleteError, DeleteOptions};

/// The Controller service.
#[derive(Debug, Clone)]
pub struct ControllerService {
    accounts: AccountSource,
}

impl ControllerService {
    /// A controller working in the accounts `accounts` selects.
    pub fn new(accounts: AccountSource) -> Self {
        ControllerService { accounts }
    }
}

/// A storage error as a gRPC status (see the module comment).
pub fn blob_status(e: &BlobError) -> Status {
    let line = explain(e);
    if e.is_not_found() {
        Status::not_found(line)
    } else if e.is_auth_failure() {
        Status::permission_denied(line)
    } else if e.is_transient() || e.is_overload() {
        Status::unavailable(line)
    } else {
        Status::internal(line)
    }
}

/// The size of drive `path`, or `None` when it does not exist; a blob there
/// that is not a drive is `ALREADY_EXISTS` (the name is taken).
async fn existing_size(client: &BlobClient, path: &BlobPath) -> Result<Option<u64>, Status> {
    let props = match client.get_properties(path).await {
        Ok(p) => p,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(blob_status(&e)),
    };
    let check = check_disk(client, path, props.blob_type, props.content_length)
        .await
        .map_err(|e| blob_status(&e))?;
    match check.footer() {
        Some(f) => Ok(Some(f.current_size_bytes)),
        None => Err(Status::already_exists(format!(
            "{path} exists and is not a drive ({})",
            check.problem(path).unwrap_or_default()
        ))),
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        let container = req
            .parameters
            .get(CONTAINER_PARAMETER)
            .map(String::as_str)
            .unwrap_or(DEFAULT_CONTAINER);
        let path = path_for(container, &req.name)?;
        check_capabilities(&req.volume_capabilities)?;
        let wanted = capacity(req.capacity_range.as_ref())?;
        let client = self.accounts.client(&req.secrets)?;
        let found = match existing_size(&client, &path).await? {
            Some(size) => Some(size),
            None => match create_drive(&client, &path, wanted.size_bytes, None).await {
                Ok(created) => {
                    tracing::info!(volume = %path, size_bytes = wanted.size_bytes,
                        container_created = created.container_created, "created volume");
                    None
                }
                // Made meanwhile by another call of the same name.
                Err(CreateError::Blob(e)) if e.is_already_exists() => {
                    existing_size(&client, &path).await?
                }
                Err(CreateError::Size(e)) => return Err(Status::out_of_range(e.to_string())),
                Err(CreateError::Blob(e)) => return Err(blob_status(&e)),
                Err(e @ CreateError::Footer { .. }) => {
                    return Err(Status::internal(format!("creating {path}: {e}")))
                }
            },
        };
        let size_bytes = match found {
            Some(size) if !wanted.accepts(size) => {
                return Err(Status::already_exists(format!(
                    "volume {} exists with {size} bytes, outside the capacity range asked for",
                    VolumeId::of(&path)
                )))
            }
            Some(size) => size,
            None => wanted.size_bytes,
        };
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(Volume {
                capacity_bytes: size_bytes as i64,
                volume_id: VolumeId::of(&path),
                volume_context: Default::default(),
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        // An id this plugin never made names no volume: deleting it is done.
        let Some(VolumeId(path)) = VolumeId::parse(&req.volume_id) else {
            return Ok(Response::new(DeleteVolumeResponse {}));
        };
        let client = self.accounts.client(&req.secrets)?;
        match delete_drive(&client, &path, DeleteOptions::default()).await {
            Ok(_) => tracing::info!(volume = %path, "deleted volume"),
            Err(DeleteError::Blob(e)) if e.is_not_found() => {}
            Err(DeleteError::Leased) => {
                return Err(Status::failed_precondition(format!(
                "volume {} is in use: its drive is leased (attached on a node); unstage it first",
                req.volume_id
            )))
            }
            Err(DeleteError::HasSnapshots(n)) => {
                return Err(Status::failed_precondition(format!(
                    "volume {} has {n} snapshot{}; delete them first",
                    req.volume_id,
                    if n == 1 { "" } else { "s" }
                )))
            }
            Err(DeleteError::NotADrive(why)) => {
                return Err(Status::failed_precondition(format!(
                    "volume {} is not a drive, so it was kept ({why})",
                    req.volume_id
                )))
            }
            Err(DeleteError::Blob(e)) => return Err(blob_status(&e)),
        }
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("no volume capabilities given"));
        }
        let Some(VolumeId(path)) = VolumeId::parse(&req.volume_id) else {
            return Err(Status::not_found(format!(
                "volume {} does not exist",
                req.volume_id
            )));
        };
        let client = self.accounts.client(&req.secrets)?;
        if existing_size(&client, &path).await?.is_none() {
            return Err(Status::not_found(format!(
                "volume {} does not exist",
                req.volume_id
            )));
        }
        let response = match req.volume_capabilities.iter().find_map(unsupported) {
            Some(why) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why,
            },
            None => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                }),
                message: String::new(),
            },
        };
        Ok(Response::new(response))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let rpc = |t: csc::rpc::Type| ControllerServiceCapability {
            r#type: Some(csc::Type::Rpc(csc::Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![rpc(csc::rpc::Type::CreateDeleteVolume)],
        }))
    }
}
