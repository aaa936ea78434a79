//! The CSI (Container Storage Interface, spec v1.13.0, package `csi.v1`)
//! messages this plugin sends and receives, written by hand as prost types.
//!
//! Why by hand: no maintained crate carries the 1.13 messages (`k8s-csi` is
//! CSI 1.3 from 2021), and generating them needs `protoc`. Field numbers,
//! types and enum values are facts of the protocol and follow the spec's
//! `csi.proto` exactly; a message here may leave out fields this plugin
//! neither reads nor sets (protobuf skips unknown fields on decode), but never
//! renumbers one. A later slice adds the messages of the calls it serves.
//!
//! Crates: prost 0.14 (messages), tonic 0.14 with tonic-prost (the gRPC
//! server and the client the tests use; hyper 1, which reqwest already
//! brings) and tonic-build 0.14's manual builder in `build.rs` for the
//! service traits. All three are the current, maintained releases of the
//! hyperium and tokio-rs projects.
//!
//! Invariant: the `secrets` maps never reach a log or an error. The requests
//! that carry them print only their names and ids in `Debug`.

use std::collections::HashMap;
use std::fmt;

/// `google.protobuf.BoolValue`, wire-compatible (one bool, field 1).
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct BoolValue {
    /// The value.
    #[prost(bool, tag = "1")]
    pub value: bool,
}

// ---- Identity ----

/// `GetPluginInfoRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoRequest {}

/// `GetPluginInfoResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoResponse {
    /// The driver's name, as StorageClasses name it.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The plugin's version.
    #[prost(string, tag = "2")]
    pub vendor_version: String,
    /// Free-form facts about the plugin.
    #[prost(map = "string, string", tag = "3")]
    pub manifest: HashMap<String, String>,
}

/// `GetPluginCapabilitiesRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesRequest {}

/// `GetPluginCapabilitiesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesResponse {
    /// What the plugin offers.
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<PluginCapability>,
}

/// `PluginCapability`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginCapability {
    /// Which capability.
    #[prost(oneof = "plugin_capability::Type", tags = "1, 2")]
    pub r#type: Option<plugin_capability::Type>,
}

/// The nested types of [`PluginCapability`].
pub mod plugin_capability {
    /// `PluginCapability.Service`.
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Service {
        /// A [`service::Type`].
        #[prost(enumeration = "service::Type", tag = "1")]
        pub r#type: i32,
    }

    /// The nested types of [`Service`].
    pub mod service {
        /// `PluginCapability.Service.Type`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Type {
            /// Not set.
            Unknown = 0,
            /// The plugin serves the Controller service.
            ControllerService = 1,
            /// Volumes are not equally reachable from every node.
            VolumeAccessibilityConstraints = 2,
            /// The plugin serves the GroupController service.
            GroupControllerService = 3,
            /// The plugin serves the SnapshotMetadata service.
            SnapshotMetadataService = 4,
        }
    }

    /// `PluginCapability.VolumeExpansion`.
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct VolumeExpansion {
        /// A [`volume_expansion::Type`].
        #[prost(enumeration = "volume_expansion::Type", tag = "1")]
        pub r#type: i32,
    }

    /// The nested types of [`VolumeExpansion`].
    pub mod volume_expansion {
        /// `PluginCapability.VolumeExpansion.Type`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Type {
            /// Not set.
            Unknown = 0,
            /// Grows while in use.
            Online = 1,
            /// Grows only while not in use.
            Offline = 2,
        }
    }

    /// The `type` oneof.
    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum Type {
        /// A service the plugin serves.
        #[prost(message, tag = "1")]
        Service(Service),
        /// How volumes grow.
        #[prost(message, tag = "2")]
        VolumeExpansion(VolumeExpansion),
    }
}

/// `ProbeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeRequest {}

/// `ProbeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeResponse {
    /// Whether the plugin is ready to serve.
    #[prost(message, optional, tag = "1")]
    pub ready: Option<BoolValue>,
}

// ---- Volumes ----

/// `CapacityRange`: 0 in either field means unset.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct CapacityRange {
    /// The volume must be at least this large.
    #[prost(int64, tag = "1")]
    pub required_bytes: i64,
    /// The volume must be at most this large.
    #[prost(int64, tag = "2")]
    pub limit_bytes: i64,
}

/// `VolumeCapability`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCapability {
    /// Block or mount.
    #[prost(oneof = "volume_capability::AccessType", tags = "1, 2")]
    pub access_type: Option<volume_capability::AccessType>,
    /// Who may use the volume how.
    #[prost(message, optional, tag = "3")]
    pub access_mode: Option<volume_capability::AccessMode>,
}

/// The nested types of [`VolumeCapability`].
pub mod volume_capability {
    /// `VolumeCapability.BlockVolume`.
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct BlockVolume {}

    /// `VolumeCapability.MountVolume`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MountVolume {
        /// The filesystem type; empty lets the plugin choose.
        #[prost(string, tag = "1")]
        pub fs_type: String,
        /// Mount options.
        #[prost(string, repeated, tag = "2")]
        pub mount_flags: Vec<String>,
        /// The group that should own the volume's root.
        #[prost(string, tag = "3")]
        pub volume_mount_group: String,
    }

    /// `VolumeCapability.AccessMode`.
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct AccessMode {
        /// An [`access_mode::Mode`].
        #[prost(enumeration = "access_mode::Mode", tag = "1")]
        pub mode: i32,
    }

    /// The nested types of [`AccessMode`].
    pub mod access_mode {
        /// `VolumeCapability.AccessMode.Mode`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Mode {
            /// Not set.
            Unknown = 0,
            /// Read-write on one node.
            SingleNodeWriter = 1,
            /// Read-only on one node.
            SingleNodeReaderOnly = 2,
            /// Read-only on many nodes.
            MultiNodeReaderOnly = 3,
            /// Read-only on many nodes, read-write on one.
            MultiNodeSingleWriter = 4,
            /// Read-write on many nodes.
            MultiNodeMultiWriter = 5,
            /// Read-write by one workload on one node.
            SingleNodeSingleWriter = 6,
            /// Read-write by many workloads on one node.
            SingleNodeMultiWriter = 7,
        }
    }

    /// The `access_type` oneof.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum AccessType {
        /// A raw block device.
        #[prost(message, tag = "1")]
        Block(BlockVolume),
        /// A mounted filesystem.
        #[prost(message, tag = "2")]
        Mount(MountVolume),
    }
}

/// `Volume`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Volume {
    /// The volume's size; 0 means unknown.
    #[prost(int64, tag = "1")]
    pub capacity_bytes: i64,
    /// The id every later call names the volume by.
    #[prost(string, tag = "2")]
    pub volume_id: String,
    /// Facts the node calls get back.
    #[prost(map = "string, string", tag = "3")]
    pub volume_context: HashMap<String, String>,
}

/// `CreateVolumeRequest` (without `volume_content_source`,
/// `accessibility_requirements` and `mutable_parameters`, which this slice
/// does not read).
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct CreateVolumeRequest {
    /// The name that makes the call idempotent.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The size wanted.
    #[prost(message, optional, tag = "2")]
    pub capacity_range: Option<CapacityRange>,
    /// How the volume will be used.
    #[prost(message, repeated, tag = "3")]
    pub volume_capabilities: Vec<VolumeCapability>,
    /// The StorageClass's parameters.
    #[prost(map = "string, string", tag = "4")]
    pub parameters: HashMap<String, String>,
    /// The provisioner's secrets (never logged).
    #[prost(map = "string, string", tag = "5")]
    pub secrets: HashMap<String, String>,
}

impl fmt::Debug for CreateVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateVolumeRequest")
            .field("name", &self.name)
            .field("capacity_range", &self.capacity_range)
            .field("parameters", &self.parameters)
            .finish_non_exhaustive()
    }
}

/// `CreateVolumeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateVolumeResponse {
    /// The volume made (or found).
    #[prost(message, optional, tag = "1")]
    pub volume: Option<Volume>,
}

/// `DeleteVolumeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct DeleteVolumeRequest {
    /// The volume.
    #[prost(string, tag = "1")]
    pub volume_id: String,
    /// The provisioner's secrets (never logged).
    #[prost(map = "string, string", tag = "2")]
    pub secrets: HashMap<String, String>,
}

impl fmt::Debug for DeleteVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeleteVolumeRequest")
            .field("volume_id", &self.volume_id)
            .finish_non_exhaustive()
    }
}

/// `DeleteVolumeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteVolumeResponse {}

/// `ValidateVolumeCapabilitiesRequest` (without `mutable_parameters`).
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct ValidateVolumeCapabilitiesRequest {
    /// The volume.
    #[prost(string, tag = "1")]
    pub volume_id: String,
    /// The context CreateVolume returned.
    #[prost(map = "string, string", tag = "2")]
    pub volume_context: HashMap<String, String>,
    /// The capabilities to check.
    #[prost(message, repeated, tag = "3")]
    pub volume_capabilities: Vec<VolumeCapability>,
    /// The StorageClass's parameters.
    #[prost(map = "string, string", tag = "4")]
    pub parameters: HashMap<String, String>,
    /// Secrets (never logged).
    #[prost(map = "string, string", tag = "5")]
    pub secrets: HashMap<String, String>,
}

impl fmt::Debug for ValidateVolumeCapabilitiesRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValidateVolumeCapabilitiesRequest")
            .field("volume_id", &self.volume_id)
            .finish_non_exhaustive()
    }
}

/// `ValidateVolumeCapabilitiesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValidateVolumeCapabilitiesResponse {
    /// Set when every capability asked for is supported.
    #[prost(message, optional, tag = "1")]
    pub confirmed: Option<validate_volume_capabilities_response::Confirmed>,
    /// Why not, when not confirmed.
    #[prost(string, tag = "2")]
    pub message: String,
}

/// The nested types of [`ValidateVolumeCapabilitiesResponse`].
pub mod validate_volume_capabilities_response {
    use std::collections::HashMap;

    /// `ValidateVolumeCapabilitiesResponse.Confirmed`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Confirmed {
        /// The context confirmed.
        #[prost(map = "string, string", tag = "1")]
        pub volume_context: HashMap<String, String>,
        /// The capabilities confirmed.
        #[prost(message, repeated, tag = "2")]
        pub volume_capabilities: Vec<super::VolumeCapability>,
        /// The parameters confirmed.
        #[prost(map = "string, string", tag = "3")]
        pub parameters: HashMap<String, String>,
    }
}

/// `ControllerGetCapabilitiesRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ControllerGetCapabilitiesRequest {}

/// `ControllerGetCapabilitiesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ControllerGetCapabilitiesResponse {
    /// What the controller offers.
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<ControllerServiceCapability>,
}

/// `ControllerServiceCapability`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ControllerServiceCapability {
    /// Which capability.
    #[prost(oneof = "controller_service_capability::Type", tags = "1")]
    pub r#type: Option<controller_service_capability::Type>,
}

/// The nested types of [`ControllerServiceCapability`].
pub mod controller_service_capability {
    /// `ControllerServiceCapability.RPC`.
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Rpc {
        /// An [`rpc::Type`].
        #[prost(enumeration = "rpc::Type", tag = "1")]
        pub r#type: i32,
    }

    /// The nested types of [`Rpc`].
    pub mod rpc {
        /// `ControllerServiceCapability.RPC.Type`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Type {
            /// Not set.
            Unknown = 0,
            /// CreateVolume and DeleteVolume.
            CreateDeleteVolume = 1,
            /// ControllerPublishVolume and ControllerUnpublishVolume.
            PublishUnpublishVolume = 2,
            /// ListVolumes.
            ListVolumes = 3,
            /// GetCapacity.
            GetCapacity = 4,
            /// CreateSnapshot and DeleteSnapshot.
            CreateDeleteSnapshot = 5,
            /// ListSnapshots.
            ListSnapshots = 6,
            /// A volume as CreateVolume's content source.
            CloneVolume = 7,
            /// Read-only ControllerPublishVolume.
            PublishReadonly = 8,
            /// ControllerExpandVolume.
            ExpandVolume = 9,
            /// ListVolumes with the nodes each volume is published to.
            ListVolumesPublishedNodes = 10,
            /// Volume conditions.
            VolumeCondition = 11,
            /// ControllerGetVolume.
            GetVolume = 12,
            /// SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER.
            SingleNodeMultiWriter = 13,
            /// ControllerModifyVolume.
            ModifyVolume = 14,
            /// GetSnapshot.
            GetSnapshot = 15,
        }
    }

    /// The `type` oneof.
    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum Type {
        /// A call the controller serves.
        #[prost(message, tag = "1")]
        Rpc(Rpc),
    }
}

// ---- Node ----

/// `NodeStageVolumeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct NodeStageVolumeRequest {
    /// The volume.
    #[prost(string, tag = "1")]
    pub volume_id: String,
    /// What ControllerPublishVolume returned.
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: HashMap<String, String>,
    /// Where to attach the volume on this node.
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    /// How the volume will be used.
    #[prost(message, optional, tag = "4")]
    pub volume_capability: Option<VolumeCapability>,
    /// The node-stage secrets (never logged).
    #[prost(map = "string, string", tag = "5")]
    pub secrets: HashMap<String, String>,
    /// What CreateVolume returned.
    #[prost(map = "string, string", tag = "6")]
    pub volume_context: HashMap<String, String>,
}

impl fmt::Debug for NodeStageVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeStageVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("staging_target_path", &self.staging_target_path)
            .finish_non_exhaustive()
    }
}

/// `NodeStageVolumeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeStageVolumeResponse {}

/// `NodeUnstageVolumeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnstageVolumeRequest {
    /// The volume.
    #[prost(string, tag = "1")]
    pub volume_id: String,
    /// Where it was staged.
    #[prost(string, tag = "2")]
    pub staging_target_path: String,
}

/// `NodeUnstageVolumeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnstageVolumeResponse {}

/// `NodePublishVolumeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct NodePublishVolumeRequest {
    /// The volume.
    #[prost(string, tag = "1")]
    pub volume_id: String,
    /// What ControllerPublishVolume returned.
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: HashMap<String, String>,
    /// Where NodeStageVolume attached it.
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    /// Where the workload wants it.
    #[prost(string, tag = "4")]
    pub target_path: String,
    /// How the volume will be used.
    #[prost(message, optional, tag = "5")]
    pub volume_capability: Option<VolumeCapability>,
    /// Publish read-only.
    #[prost(bool, tag = "6")]
    pub readonly: bool,
    /// The node-publish secrets (never logged).
    #[prost(map = "string, string", tag = "7")]
    pub secrets: HashMap<String, String>,
    /// What CreateVolume returned.
    #[prost(map = "string, string", tag = "8")]
    pub volume_context: HashMap<String, String>,
}

impl fmt::Debug for NodePublishVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodePublishVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("target_path", &self.target_path)
            .field("readonly", &self.readonly)
            .finish_non_exhaustive()
    }
}

/// `NodePublishVolumeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeResponse {}

/// `NodeUnpublishVolumeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeRequest {
    /// The volume.
    #[prost(string, tag = "1")]
    pub volume_id: String,
    /// Where it was published.
    #[prost(string, tag = "2")]
    pub target_path: String,
}

/// `NodeUnpublishVolumeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeResponse {}

/// `NodeGetCapabilitiesRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesRequest {}

/// `NodeGetCapabilitiesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesResponse {
    /// What the node offers.
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<NodeServiceCapability>,
}

/// `NodeServiceCapability`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NodeServiceCapability {
    /// Which capability.
    #[prost(oneof = "node_service_capability::Type", tags = "1")]
    pub r#type: Option<node_service_capability::Type>,
}

/// The nested types of [`NodeServiceCapability`].
pub mod node_service_capability {
    /// `NodeServiceCapability.RPC`.
    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Rpc {
        /// An [`rpc::Type`].
        #[prost(enumeration = "rpc::Type", tag = "1")]
        pub r#type: i32,
    }

    /// The nested types of [`Rpc`].
    pub mod rpc {
        /// `NodeServiceCapability.RPC.Type`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum Type {
            /// Not set.
            Unknown = 0,
            /// NodeStageVolume and NodeUnstageVolume.
            StageUnstageVolume = 1,
            /// NodeGetVolumeStats.
            GetVolumeStats = 2,
            /// NodeExpandVolume.
            ExpandVolume = 3,
            /// Volume conditions in NodeGetVolumeStats.
            VolumeCondition = 4,
            /// SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER.
            SingleNodeMultiWriter = 5,
            /// `volume_mount_group` in stage and publish.
            VolumeMountGroup = 6,
        }
    }

    /// The `type` oneof.
    #[derive(Clone, Copy, PartialEq, prost::Oneof)]
    pub enum Type {
        /// A call the node serves.
        #[prost(message, tag = "1")]
        Rpc(Rpc),
    }
}

/// `NodeGetInfoRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoRequest {}

/// `NodeGetInfoResponse` (without `accessible_topology`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoResponse {
    /// This node's id, as ControllerPublishVolume will name it.
    #[prost(string, tag = "1")]
    pub node_id: String,
    /// How many volumes this node can hold; 0 means no limit.
    #[prost(int64, tag = "2")]
    pub max_volumes_per_node: i64,
}
