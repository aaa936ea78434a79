//! The gRPC services of CSI this plugin serves, as `build.rs` generates them
//! with tonic-build's manual builder over the messages in
//! [`super::messages`]: for each of Identity, Controller and Node a server
//! trait and a client (the tests play kubelet and the sidecars with it).
//! Only the calls this plugin implements are listed; tonic answers any other
//! call with `UNIMPLEMENTED`.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// `csi.v1.Identity`.
pub mod identity {
    include!(concat!(env!("OUT_DIR"), "/csi.v1.Identity.rs"));
}

/// `csi.v1.Controller`.
pub mod controller {
    include!(concat!(env!("OUT_DIR"), "/csi.v1.Controller.rs"));
}

/// `csi.v1.Node`.
pub mod node {
    include!(concat!(env!("OUT_DIR"), "/csi.v1.Node.rs"));
}
