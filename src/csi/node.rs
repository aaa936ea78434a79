//! The CSI Node service: volumes attached on this host.
//!
//! NodeStageVolume attaches the drive at the staging path by running
//! `blobdrive mount C/B STAGING` (this binary, the credentials in its
//! environment): the attach is exactly the command's, with its holder
//! process, so it outlives this plugin and survives a restart of it. A blank
//! drive (nothing stored but its footer) is first formatted with the
//! capability's filesystem (`ext4` when unset), as `create --mkfs` does
//! (`daemon::format`); a reader-only access mode attaches read-only (no
//! lease, no formatting). NodePublishVolume bind-mounts the staging path onto
//! the target (made if missing), read-only when asked (`readonly`, or a
//! reader-only access mode).
//! NodeUnpublishVolume and NodeUnstageVolume undo them (`blobdrive unmount`
//! for the attach) and succeed when there is nothing to undo, also after a
//! plugin restart: what is attached is read from the kernel's mount table
//! and the attach registry, never from this process's memory.
//!
//! Stage and unstage of one staging path are not run at once with each
//! other: a lock per path serialises them (the CO may retry a slow call).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use super::controller::blob_status;
use super::credentials::AccountSource;
use super::messages::{
    node_service_capability as nsc, volume_capability, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, VolumeCapability,
};
use super::services::node::node_server::Node;
use super::volume::{check_capabilities, VolumeId, DEFAULT_FS_TYPE};
use crate::daemon::mountpoint::is_mount_point;
use crate::daemon::registry;
use crate::provision::checks::{check_disk, stored_bytes};
use crate::units::VHD_FOOTER_BYTES;

/// The Node service.
#[derive(Debug, Clone)]
pub struct NodeService {
    node_id: String,
    accounts: AccountSource,
    /// One lock per staging path.
    staging: Arc<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>>,
}

impl NodeService {
    /// The node `node_id`, working in the accounts `accounts` selects.
    pub fn new(node_id: String, accounts: AccountSource) -> Self {
        NodeService {
            node_id,
            accounts,
            staging: Arc::default(),
        }
    }

    async fn lock(&self, path: &Path) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .staging
            .lock()
            .await
            .entry(path.to_path_buf())
            .or_default()
            .clone();
        lock.lock_owned().await
    }
}

/// `path` resolved when it can be (the mount table holds canonical paths).
fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// Whether something is mounted at `path`.
fn mounted(path: &Path) -> Result<bool, Status> {
    is_mount_point(&canonical(path))
        .map_err(|e| Status::internal(format!("cannot read the mount table: {e}")))
}

/// A required path field, as a path.
fn required_path(value: &str, field: &str) -> Result<PathBuf, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is missing")));
    }
    let path = PathBuf::from(value);
    if !path.is_absolute() {
        return Err(Status::invalid_argument(format!(
            "{field} {value} is not an absolute path"
        )));
    }
    Ok(path)
}

/// The volume an id names; `NOT_FOUND` when none could have it.
fn volume(id: &str) -> Result<VolumeId, Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("the volume id is missing"));
    }
    VolumeId::parse(id).ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))
}

/// The one capability of a stage or publish, checked.
fn capability(cap: Option<&VolumeCapability>) -> Result<&VolumeCapability, Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument("the volume capability is missing"))?;
    check_capabilities(std::slice::from_ref(cap))?;
    Ok(cap)
}

/// Whether `cap` asks for read-only use.
fn reader_only(cap: &VolumeCapability) -> bool {
    use volume_capability::access_mode::Mode;
    cap.access_mode.is_some_and(|m| {
        matches!(
            Mode::try_from(m.mode),
            Ok(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
        )
    })
}

/// Runs a `blobdrive` command to its end; its one error line on failure.
async fn run(mut cmd: std::process::Command) -> Result<(), String> {
    cmd.stdin(std::process::Stdio::null());
    let out = tokio::process::Command::from(cmd)
        .output()
        .await
        .map_err(|e| format!("cannot run blobdrive: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .rev()
        .find(|l| l.starts_with("blobdrive: "))
        .or_else(|| err.lines().last())
        .unwrap_or("failed with no message");
    Err(line.trim_start_matches("blobdrive: ").to_string())
}

/// `mount(2)`.
fn sys_mount(source: &Path, target: &Path, flags: libc::c_ulong) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c =
        |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (source, target) = (c(source)?, c(target)?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call;
    // a bind mount takes no type or data.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `umount(2)`.
fn sys_umount(target: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target =
        std::ffi::CString::new(target.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(target.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl NodeService {
    /// Formats drive `id` with `fs_type` when it is blank: nothing stored
    /// but its footer. `NOT_FOUND` when the drive does not exist.
    async fn format_if_blank(
        &self,
        id: &VolumeId,
        fs_type: &str,
        secrets: &HashMap<String, String>,
    ) -> Result<(), Status> {
        let path = &id.0;
        let client = self.accounts.client(secrets)?;
        let props = client.get_properties(path).await.map_err(|e| {
            if e.is_not_found() {
                Status::not_found(format!("volume {} does not exist", VolumeId::of(path)))
            } else {
                blob_status(&e)
            }
        })?;
        let check = check_disk(&client, path, props.blob_type, props.content_length)
            .await
            .map_err(|e| blob_status(&e))?;
        let Some(footer) = check.footer() else {
            return Err(Status::failed_precondition(format!(
                "volume {} is not a drive ({})",
                VolumeId::of(path),
                check.problem(path).unwrap_or_default()
            )));
        };
        let size_bytes = footer.current_size_bytes;
        let stored = stored_bytes(&client, path, props.content_length)
            .await
            .map_err(|e| blob_status(&e))?;
        if stored > VHD_FOOTER_BYTES {
            return Ok(());
        }
        let account = self.accounts.account(secrets)?;
        let format = crate::daemon::format::Format {
            gpt: false,
            fs: Some(crate::attach::FsType::from_name(fs_type)),
        };
        let drive = path.clone();
        tracing::info!(volume = %drive, fs_type, "formatting a blank volume");
        tokio::task::spawn_blocking(move || {
            crate::daemon::format::format_drive(account, &drive, size_bytes, &format, None)
        })
        .await
        .map_err(|e| Status::internal(format!("formatting stopped: {e}")))?
        .map_err(|e| Status::internal(format!("{e:#}")))
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = volume(&req.volume_id)?;
        let staging = required_path(&req.staging_target_path, "the staging target path")?;
        let cap = capability(req.volume_capability.as_ref())?;
        let Some(volume_capability::AccessType::Mount(mount)) = &cap.access_type else {
            return Err(Status::invalid_argument(
                "only filesystem volumes are supported",
            ));
        };
        let _guard = self.lock(&staging).await;
        let want = VolumeId::of(&id.0);
        if let Some(entry) = registry::find_by_dir(&staging).filter(|e| e.alive) {
            if entry.drive == want {
                return Ok(Response::new(NodeStageVolumeResponse {}));
            }
            return Err(Status::already_exists(format!(
                "{} already holds volume {}, not {want}",
                staging.display(),
                entry.drive
            )));
        }
        if mounted(&staging)? {
            return Err(Status::already_exists(format!(
                "something else is mounted at {}",
                staging.display()
            )));
        }
        std::fs::create_dir_all(&staging)
            .map_err(|e| Status::internal(format!("cannot create {}: {e}", staging.display())))?;
        let fs_type = if mount.fs_type.is_empty() {
            DEFAULT_FS_TYPE
        } else {
            mount.fs_type.as_str()
        };
        let read_only = reader_only(cap);
        if !read_only {
            self.format_if_blank(&id, fs_type, &req.secrets).await?;
        }
        let mut cmd = self.accounts.command(&req.secrets)?;
        cmd.arg("mount").arg(&want).arg(&staging);
        if read_only {
            cmd.arg("--read-only");
        }
        for flag in &mount.mount_flags {
            cmd.arg("-o").arg(flag);
        }
        run(cmd).await.map_err(|line| {
            Status::failed_precondition(format!("attaching volume {want}: {line}"))
        })?;
        tracing::info!(volume = %want, staging = %staging.display(), "staged");
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        let staging = required_path(&req.staging_target_path, "the staging target path")?;
        let _guard = self.lock(&staging).await;
        let attached = registry::find_by_dir(&staging).is_some_and(|e| e.alive);
        if attached || mounted(&staging)? {
            let mut cmd = self.accounts.command(&HashMap::new())?;
            cmd.arg("unmount").arg(&staging);
            run(cmd).await.map_err(|line| {
                Status::internal(format!("detaching volume {}: {line}", req.volume_id))
            })?;
            tracing::info!(volume = %req.volume_id, staging = %staging.display(), "unstaged");
        }
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        volume(&req.volume_id)?;
        let staging = required_path(&req.staging_target_path, "the staging target path")?;
        let target = required_path(&req.target_path, "the target path")?;
        let cap = capability(req.volume_capability.as_ref())?;
        if !matches!(
            cap.access_type,
            Some(volume_capability::AccessType::Mount(_))
        ) {
            return Err(Status::invalid_argument(
                "only filesystem volumes are supported",
            ));
        }
        if !mounted(&staging)? {
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged at {}",
                req.volume_id,
                staging.display()
            )));
        }
        std::fs::create_dir_all(&target)
            .map_err(|e| Status::internal(format!("cannot create {}: {e}", target.display())))?;
        if mounted(&target)? {
            return Ok(Response::new(NodePublishVolumeResponse {}));
        }
        sys_mount(&canonical(&staging), &target, libc::MS_BIND).map_err(|e| {
            Status::internal(format!(
                "cannot bind {} to {}: {e}",
                staging.display(),
                target.display()
            ))
        })?;
        if req.readonly || reader_only(cap) {
            let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
            if let Err(e) = sys_mount(Path::new("none"), &target, flags) {
                let _ = sys_umount(&target);
                return Err(Status::internal(format!(
                    "cannot make {} read-only: {e}",
                    target.display()
                )));
            }
        }
        tracing::info!(volume = %req.volume_id, target = %target.display(), readonly = req.readonly, "published");
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        let target = required_path(&req.target_path, "the target path")?;
        if mounted(&target)? {
            sys_umount(&target).map_err(|e| {
                Status::internal(format!("cannot unmount {}: {e}", target.display()))
            })?;
            tracing::info!(volume = %req.volume_id, target = %target.display(), "unpublished");
        }
        match std::fs::remove_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Status::internal(format!(
                    "cannot remove {}: {e}",
                    target.display()
                )))
            }
        }
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![NodeServiceCapability {
                r#type: Some(nsc::Type::Rpc(nsc::Rpc {
                    r#type: nsc::rpc::Type::StageUnstageVolume as i32,
                })),
            }],
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
        }))
    }
}
