//! Fixed VHD footer: build, parse and validate (see REFERENCE.md).
