//! Generates the CSI gRPC services (Identity, Controller, Node) with
//! tonic-build's manual builder: the messages are hand-written prost types
//! in `src/csi/messages.rs`, so no `.proto` file and no `protoc` are needed.
//! Only the methods this plugin serves are listed; tonic answers every other
//! method of a service with `UNIMPLEMENTED`, as the CSI spec asks of an
//! optional call a plugin does not offer.

use tonic_build::manual::{Builder, Method, Service};

/// One unary method `name` of package `csi.v1`, with request and response
/// types `{name}Request` and `{name}Response` in `crate::csi::messages`.
fn method(rust_name: &str, name: &str) -> Method {
    Method::builder()
        .name(rust_name)
        .route_name(name)
        .input_type(format!("crate::csi::messages::{name}Request"))
        .output_type(format!("crate::csi::messages::{name}Response"))
        .codec_path("tonic_prost::ProstCodec")
        .build()
}

fn service(name: &str, methods: &[(&str, &str)]) -> Service {
    let mut builder = Service::builder().name(name).package("csi.v1");
    for (rust_name, route) in methods {
        builder = builder.method(method(rust_name, route));
    }
    builder.build()
}

fn main() {
    let identity = service(
        "Identity",
        &[
            ("get_plugin_info", "GetPluginInfo"),
            ("get_plugin_capabilities", "GetPluginCapabilities"),
            ("probe", "Probe"),
        ],
    );
    let controller = service(
        "Controller",
        &[
            ("create_volume", "CreateVolume"),
            ("delete_volume", "DeleteVolume"),
            ("validate_volume_capabilities", "ValidateVolumeCapabilities"),
            ("controller_get_capabilities", "ControllerGetCapabilities"),
        ],
    );
    let node = service(
        "Node",
        &[
            ("node_stage_volume", "NodeStageVolume"),
            ("node_unstage_volume", "NodeUnstageVolume"),
            ("node_publish_volume", "NodePublishVolume"),
            ("node_unpublish_volume", "NodeUnpublishVolume"),
            ("node_get_capabilities", "NodeGetCapabilities"),
            ("node_get_info", "NodeGetInfo"),
        ],
    );
    Builder::new().compile(&[identity, controller, node]);
    println!("cargo:rerun-if-changed=build.rs");
}
