//! The CSI plugin as Kubernetes meets it: the real `blobdrive csi` serving
//! on a Unix socket, and this test playing kubelet and the CSI sidecars
//! (external-provisioner) over gRPC with the plugin's own message types,
//! against Azurite. The calls come in Kubernetes' order, twice where the
//! spec wants idempotence, and each refusal is checked for its gRPC code.
//!
//! The tests that attach (stage and publish) need root, /dev/fuse and loop
//! devices; elsewhere they print `SKIPPED: <why>` (or fail under
//! `BLOBDRIVE_REQUIRE_FUSE=1`). Whatever they attached is undone when they
//! end, also when they fail: [`Cleanup`] unmounts the targets, then the
//! staging attach, then stops the plugin.

mod common;
mod system;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blobdrive::csi::messages::{
    volume_capability, CapacityRange, ControllerGetCapabilitiesRequest, CreateVolumeRequest,
    CreateVolumeResponse, DeleteVolumeRequest, GetPluginCapabilitiesRequest, GetPluginInfoRequest,
    NodeGetCapabilitiesRequest, NodeGetInfoRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, ProbeRequest,
    ValidateVolumeCapabilitiesRequest, VolumeCapability,
};
use blobdrive::csi::services::{
    controller::controller_client::ControllerClient, identity::identity_client::IdentityClient,
    node::node_client::NodeClient,
};
use common::ContainerGuard;
use tonic::transport::Channel;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_blobdrive");
const MIB: i64 = 1024 * 1024;

/// A running `blobdrive csi`, stopped (SIGTERM, then SIGKILL) on drop.
struct Plugin {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Plugin {
    /// Starts the plugin with `extra` arguments and waits for its socket.
    fn start(extra: &[&str]) -> Plugin {
        Plugin::start_in(None, extra)
    }

    /// Starts the plugin with the run directory `run_dir` (the attach
    /// registry; a fresh one when `None`).
    fn start_in(run_dir: Option<&Path>, extra: &[&str]) -> Plugin {
        let dir = tempfile::Builder::new()
            .prefix("blobdrive-csi-")
            .tempdir()
            .expect("temp dir");
        let socket = dir.path().join("csi.sock");
        let run_dir = match run_dir {
            Some(r) => r.to_path_buf(),
            None => {
                let r = dir.path().join("run");
                std::fs::create_dir(&r).expect("run dir");
                r
            }
        };
        let child = command(&run_dir)
            .args(["csi", "--endpoint"])
            .arg(format!("unix://{}", socket.display()))
            .args(["--node-id", "node-1"])
            .args(extra)
            .stdin(Stdio::null())
            .spawn()
            .expect("blobdrive csi starts");
        let plugin = Plugin {
            child,
            socket,
            _dir: dir,
        };
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&plugin.socket).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the plugin did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        plugin
    }

    async fn channel(&self) -> Channel {
        let socket = self.socket.clone();
        tonic::transport::Endpoint::try_from("http://plugin.invalid")
            .expect("endpoint")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .expect("connects to the plugin")
    }
}

impl Plugin {
    /// Stops the plugin as Kubernetes does (SIGTERM); true when it exited
    /// cleanly and removed its socket.
    fn stop(mut self) -> bool {
        self.terminate();
        let clean = matches!(self.child.try_wait(), Ok(Some(status)) if status.success());
        clean && !self.socket.exists()
    }

    fn terminate(&mut self) {
        // Reaped already: its pid may be another process's by now.
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = self.child.id() as i32;
        // SAFETY: plain syscall on our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// `blobdrive` with the test account and a run directory of its own.
fn command(run_dir: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env(
        "AZURE_STORAGE_CONNECTION_STRING",
        common::connection_string(),
    )
    .env("BLOBDRIVE_RUN_DIR", run_dir)
    .env("BLOBDRIVE_RECOVERY_DIR", common::recovery_dir())
    .env_remove("NOTIFY_SOCKET");
    cmd
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A filesystem volume's capability, `mode` as the spec numbers it.
fn mount_capability(fs_type: &str, mode: volume_capability::access_mode::Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: fs_type.into(),
                ..Default::default()
            },
        )),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn writer() -> VolumeCapability {
    mount_capability(
        "ext4",
        volume_capability::access_mode::Mode::SingleNodeWriter,
    )
}

fn create_request(name: &str, container: &str, required: i64, limit: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        volume_capabilities: vec![writer()],
        parameters: HashMap::from([("container".to_string(), container.to_string())]),
        secrets: HashMap::new(),
    }
}

fn volume_of(response: tonic::Response<CreateVolumeResponse>) -> (String, i64) {
    let v = response.into_inner().volume.expect("a volume");
    (v.volume_id, v.capacity_bytes)
}

#[test]
fn identity_and_capabilities_answer_by_role() {
    let plugin = Plugin::start(&[]);
    runtime().block_on(async {
        let channel = plugin.channel().await;
        let mut identity = IdentityClient::new(channel.clone());
        let info = identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .expect("GetPluginInfo")
            .into_inner();
        assert_eq!(info.name, blobdrive::csi::DRIVER_NAME);
        assert!(!info.vendor_version.is_empty());
        let caps = identity
            .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
            .await
            .expect("GetPluginCapabilities")
            .into_inner();
        assert_eq!(caps.capabilities.len(), 1, "{caps:?}");
        let probe = identity.probe(ProbeRequest {}).await.expect("Probe");
        assert_eq!(probe.into_inner().ready.map(|r| r.value), Some(true));

        let mut node = NodeClient::new(channel.clone());
        let info = node
            .node_get_info(NodeGetInfoRequest {})
            .await
            .expect("NodeGetInfo")
            .into_inner();
        assert_eq!(info.node_id, "node-1");
        let caps = node
            .node_get_capabilities(NodeGetCapabilitiesRequest {})
            .await
            .expect("NodeGetCapabilities")
            .into_inner();
        assert_eq!(caps.capabilities.len(), 1, "STAGE_UNSTAGE_VOLUME: {caps:?}");
        let mut controller = ControllerClient::new(channel);
        let caps = controller
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await
            .expect("ControllerGetCapabilities")
            .into_inner();
        assert_eq!(caps.capabilities.len(), 1, "CREATE_DELETE_VOLUME: {caps:?}");
    });
    // kubelet keeps its connection open: the plugin stops on SIGTERM anyway
    // (after the grace its calls get), and removes its socket.
    let held = runtime();
    let _open = held.block_on(plugin.channel());
    assert!(plugin.stop(), "the plugin stops with a connection open");

    // The node DaemonSet's plugin serves no Controller, and says so.
    let plugin = Plugin::start(&["--node-only"]);
    runtime().block_on(async {
        let channel = plugin.channel().await;
        let caps = IdentityClient::new(channel.clone())
            .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
            .await
            .expect("GetPluginCapabilities")
            .into_inner();
        assert!(caps.capabilities.is_empty(), "{caps:?}");
        let err = ControllerClient::new(channel)
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented, "{err}");
    });
}

#[test]
fn a_stale_socket_is_replaced_and_anything_else_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run_dir = dir.path().join("run");
    std::fs::create_dir(&run_dir).expect("run dir");
    let serve = |path: &Path| {
        command(&run_dir)
            .args(["csi", "--node-id", "n", "--endpoint"])
            .arg(format!("unix://{}", path.display()))
            .output()
            .expect("blobdrive csi runs")
    };
    // A regular file where the socket should go is left alone.
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"keep me").expect("write");
    let out = serve(&file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("blobdrive: ") && err.contains("not a socket"),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).expect("still there"), b"keep me");
    // So is an endpoint that is not a Unix socket.
    let out = command(&run_dir)
        .args(["csi", "--node-id", "n", "--endpoint", "tcp://127.0.0.1:1"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    // A socket nobody answers on is a leftover: the plugin takes its place.
    let stale = dir.path().join("csi.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("a stale socket"));
    assert!(stale.exists());
    let mut child = command(&run_dir)
        .args(["csi", "--node-id", "n", "--endpoint"])
        .arg(format!("unix://{}", stale.display()))
        .spawn()
        .expect("starts");
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(&stale).is_err() {
        assert!(start.elapsed() < Duration::from_secs(20), "not serving");
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the plugin exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // And one that answers is another plugin's: refused.
    let out = serve(&stale);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("another process already serves on"), "{err}");
    // SAFETY: plain syscall on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().expect("exits").success());
    assert!(!stale.exists(), "the socket is removed at exit");
}

#[test]
fn volumes_are_created_and_deleted_idempotently_with_the_specs_codes() {
    let plugin = Plugin::start(&["--controller-only"]);
    runtime().block_on(async {
        let guard = ContainerGuard::new("csi-ctl").await;
        let mut ctl = ControllerClient::new(plugin.channel().await);

        // Rounded up to the drive's alignment (whole MiB, at least 16 MiB).
        let (id, capacity) = volume_of(
            ctl.create_volume(create_request("pvc-a", &guard.name, 100 * MIB + 1, 0))
                .await
                .expect("CreateVolume"),
        );
        assert_eq!(id, format!("{}/pvc-a", guard.name));
        assert_eq!(capacity, 101 * MIB);
        let props = guard
            .client
            .get_properties(&guard.path("pvc-a"))
            .await
            .expect("the drive exists");
        assert_eq!(props.content_length as i64, 101 * MIB + 512);
        // The same name again: the same volume.
        let again = volume_of(
            ctl.create_volume(create_request("pvc-a", &guard.name, 100 * MIB + 1, 0))
                .await
                .expect("CreateVolume again"),
        );
        assert_eq!(again, (id.clone(), capacity));
        // A range the existing volume meets is the same volume too.
        let again = volume_of(
            ctl.create_volume(create_request("pvc-a", &guard.name, 50 * MIB, 200 * MIB))
                .await
                .expect("CreateVolume with a wider range"),
        );
        assert_eq!(again.0, id);
        // One it does not meet: ALREADY_EXISTS.
        let err = ctl
            .create_volume(create_request("pvc-a", &guard.name, 200 * MIB, 0))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{err}");
        // A limit below the smallest drive: OUT_OF_RANGE.
        let err = ctl
            .create_volume(create_request("pvc-tiny", &guard.name, 1, MIB))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange, "{err}");
        // Block volumes are not served yet: INVALID_ARGUMENT.
        let mut block = create_request("pvc-block", &guard.name, 16 * MIB, 0);
        block.volume_capabilities[0].access_type = Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {},
        ));
        let err = ctl.create_volume(block).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        let mut unnamed = create_request("", &guard.name, 16 * MIB, 0);
        unnamed.name.clear();
        let err = ctl.create_volume(unnamed).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");

        // The StorageClass's container is created when missing; the
        // credentials may come from the call's secrets.
        let container = common::unique_name("csi-new");
        let mut with_secrets = create_request("pvc-b", &container, 0, 0);
        let account = common::account();
        let key = match &account.credential {
            blobdrive::blob::Credential::SharedKey { key } => {
                base64::Engine::encode(&base64::engine::general_purpose::STANDARD, key)
            }
            _ => String::new(),
        };
        if !key.is_empty() {
            with_secrets.secrets = HashMap::from([
                ("azurestorageaccountname".to_string(), account.name.clone()),
                ("azurestorageaccountkey".to_string(), key),
            ]);
        }
        let (id_b, capacity_b) = volume_of(
            ctl.create_volume(with_secrets.clone())
                .await
                .expect("CreateVolume in a new container"),
        );
        assert_eq!(id_b, format!("{container}/pvc-b"));
        assert_eq!(capacity_b, 1024 * MIB, "the default size");
        // Wrong secrets: refused, and the key never in the message.
        let mut bad = with_secrets.clone();
        bad.secrets = HashMap::from([
            ("azurestorageaccountname".to_string(), account.name.clone()),
            ("azurestorageaccountkey".to_string(), "SECRET!!".to_string()),
        ]);
        let err = ctl.create_volume(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(!err.message().contains("SECRET"), "{err}");

        // ValidateVolumeCapabilities confirms what is served.
        let validate = |id: &str, cap: VolumeCapability| ValidateVolumeCapabilitiesRequest {
            volume_id: id.into(),
            volume_capabilities: vec![cap],
            ..Default::default()
        };
        let ok = ctl
            .validate_volume_capabilities(validate(&id, writer()))
            .await
            .expect("ValidateVolumeCapabilities")
            .into_inner();
        assert!(ok.confirmed.is_some(), "{ok:?}");
        let many = mount_capability(
            "ext4",
            volume_capability::access_mode::Mode::MultiNodeMultiWriter,
        );
        let no = ctl
            .validate_volume_capabilities(validate(&id, many))
            .await
            .expect("ValidateVolumeCapabilities")
            .into_inner();
        assert!(no.confirmed.is_none() && !no.message.is_empty(), "{no:?}");
        let err = ctl
            .validate_volume_capabilities(validate(&format!("{}/nothing", guard.name), writer()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{err}");

        // A leased volume (attached on some node) is not deleted.
        let path = guard.path("pvc-a");
        let lease = guard
            .client
            .acquire_lease(&path, &uuid::Uuid::new_v4().to_string(), None)
            .await
            .expect("lease");
        let delete = |id: &str| DeleteVolumeRequest {
            volume_id: id.into(),
            secrets: HashMap::new(),
        };
        let err = ctl.delete_volume(delete(&id)).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
        guard
            .client
            .release_lease(&path, &lease)
            .await
            .expect("release");
        // Deleted, then deleted again: both succeed, as does an id this
        // plugin could never have made.
        ctl.delete_volume(delete(&id)).await.expect("DeleteVolume");
        ctl.delete_volume(delete(&id))
            .await
            .expect("DeleteVolume again");
        ctl.delete_volume(delete("no-such-volume"))
            .await
            .expect("DeleteVolume of an unknown id");
        let err = ctl.delete_volume(delete("")).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(guard.client.get_properties(&path).await.is_err());
        ctl.delete_volume(delete(&id_b))
            .await
            .expect("DeleteVolume b");
        let _ = guard.client.delete_container(&container).await;
    });
}

/// Undoes what the node test attached, whatever happened: publish targets
/// (lazily if need be), then the staging attach, then the plugin.
struct Cleanup {
    targets: Vec<PathBuf>,
    staging: PathBuf,
    run_dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for target in &self.targets {
            if system::is_mounted(target) {
                let _ = system::run_quietly("umount", &["-l", &target.to_string_lossy()]);
            }
        }
        if system::is_mounted(&self.staging) {
            let _ = command(&self.run_dir)
                .args(["unmount", &self.staging.to_string_lossy()])
                .output();
        }
    }
}

#[test]
fn a_volume_lives_through_stage_publish_unpublish_unstage_and_delete() {
    let test = "a_volume_lives_through_stage_publish_unpublish_unstage_and_delete";
    if !system::can_run(test, true) {
        return;
    }
    // Declared first, dropped last: the container goes after the cleanup.
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("csi-node"));
    let work = tempfile::tempdir().expect("temp dir");
    let run_dir = work.path().join("run");
    std::fs::create_dir(&run_dir).expect("run dir");
    let plugin = Plugin::start_in(Some(&run_dir), &[]);
    let staging = work.path().join("globalmount");
    let target = work.path().join("pod-a/volume");
    let target_ro = work.path().join("pod-b/volume");
    let _cleanup = Cleanup {
        targets: vec![target.clone(), target_ro.clone()],
        staging: staging.clone(),
        run_dir: run_dir.clone(),
    };
    let id = runtime().block_on(async {
        let channel = plugin.channel().await;
        let mut ctl = ControllerClient::new(channel.clone());
        let mut node = NodeClient::new(channel);
        let (id, _) = volume_of(
            ctl.create_volume(create_request("pvc-life", &guard.name, 64 * MIB, 0))
                .await
                .expect("CreateVolume"),
        );
        volume_of(
            ctl.create_volume(create_request("pvc-life", &guard.name, 64 * MIB, 0))
                .await
                .expect("CreateVolume again"),
        );

        let stage = NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(writer()),
            ..Default::default()
        };
        // A volume that does not exist: NOT_FOUND, nothing attached.
        let mut missing = stage.clone();
        missing.volume_id = format!("{}/nothing", guard.name);
        let err = node.node_stage_volume(missing).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{err}");
        // Staged (a blank volume is formatted first), twice.
        node.node_stage_volume(stage.clone())
            .await
            .expect("NodeStageVolume");
        assert!(system::is_mounted(&staging));
        node.node_stage_volume(stage.clone())
            .await
            .expect("NodeStageVolume again");
        // Leased while staged: the controller will not delete it.
        let err = ctl
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                secrets: HashMap::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err}");

        let publish = |target: &Path, readonly: bool| NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(writer()),
            readonly,
            ..Default::default()
        };
        node.node_publish_volume(publish(&target, false))
            .await
            .expect("NodePublishVolume");
        node.node_publish_volume(publish(&target, false))
            .await
            .expect("NodePublishVolume again");
        node.node_publish_volume(publish(&target_ro, true))
            .await
            .expect("NodePublishVolume read-only");
        std::fs::write(target.join("hello.txt"), b"from pod a").expect("write in the volume");
        assert_eq!(
            std::fs::read(target_ro.join("hello.txt")).expect("seen read-only"),
            b"from pod a"
        );
        let refused = std::fs::write(target_ro.join("no.txt"), b"x").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
        id
    });

    // The plugin stops (an upgrade of the DaemonSet, a crash): the attach
    // lives on, and a new plugin, which remembers nothing, undoes it.
    assert!(plugin.stop(), "the plugin stops cleanly on SIGTERM");
    assert!(system::is_mounted(&staging) && system::is_mounted(&target));
    assert_eq!(
        std::fs::read(target.join("hello.txt")).expect("still served"),
        b"from pod a"
    );
    let plugin = Plugin::start_in(Some(&run_dir), &[]);
    runtime().block_on(async {
        let channel = plugin.channel().await;
        let mut ctl = ControllerClient::new(channel.clone());
        let mut node = NodeClient::new(channel);
        let stage = NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(writer()),
            ..Default::default()
        };
        node.node_stage_volume(stage.clone())
            .await
            .expect("NodeStageVolume after a restart");

        for t in [&target, &target_ro] {
            let unpublish = NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: t.to_string_lossy().into(),
            };
            node.node_unpublish_volume(unpublish.clone())
                .await
                .expect("NodeUnpublishVolume");
            assert!(!system::is_mounted(t) && !t.exists());
            node.node_unpublish_volume(unpublish)
                .await
                .expect("NodeUnpublishVolume again");
        }
        let unstage = NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
        };
        node.node_unstage_volume(unstage.clone())
            .await
            .expect("NodeUnstageVolume");
        assert!(!system::is_mounted(&staging));
        node.node_unstage_volume(unstage)
            .await
            .expect("NodeUnstageVolume again");

        // The file is in the drive: staged again (not formatted again), it is there.
        node.node_stage_volume(stage.clone())
            .await
            .expect("NodeStageVolume after unstage");
        assert_eq!(
            std::fs::read(staging.join("hello.txt")).expect("kept"),
            b"from pod a"
        );
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
        })
        .await
        .expect("NodeUnstageVolume");
        ctl.delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .expect("DeleteVolume");
    });
}
