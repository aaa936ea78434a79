//! Parsers for argument values shared by several commands (sizes), so that a
//! bad value is refused while parsing, before anything touches the network.

use crate::units::{check_drive_size, parse_size};

/// `--size` of `create`: a human size that is a valid drive size.
pub fn drive_size(s: &str) -> Result<u64, String> {
    let bytes = parse_size(s).map_err(|e| e.to_string())?;
    check_drive_size(bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// A human size (`512M`, `1G`) in bytes, such as `--cache-size`.
pub fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drive_size_applies_the_drive_rules() {
        assert_eq!(drive_size("10G"), Ok(10 << 30));
        assert!(drive_size("1M")
            .unwrap_err()
            .contains("smallest drive is 16M"));
        assert!(drive_size("10X")
            .unwrap_err()
            .contains("invalid size '10X'"));
    }
}
