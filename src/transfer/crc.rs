//! CRC32C (Castagnoli), the checksum an upload records for each chunk. A thin
//! running wrapper over the `crc32c` crate (hardware-accelerated, as the disk
//! tier uses), so a chunk can be fed in pieces as it is scanned.

/// A running CRC32C.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Crc32c {
    value: u32,
}

impl Crc32c {
    /// A CRC of nothing yet.
    pub fn new() -> Self {
        Crc32c { value: 0 }
    }

    /// Feed more bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.value = crc32c::crc32c_append(self.value, data);
    }

    /// The CRC of everything fed so far.
    pub fn value(&self) -> u32 {
        self.value
    }
}

/// The CRC32C of `data` in one call.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn feeding_in_pieces_equals_one_call() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for split in [0, 1, 3, 512, 4095, 9999] {
            let mut c = Crc32c::new();
            c.update(&data[..split]);
            c.update(&data[split..]);
            assert_eq!(c.value(), crc32c(&data), "split at {split}");
        }
    }
}
