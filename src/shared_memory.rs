//! A memory file (`memfd`) mapped shared: memory that outlives the process
//! that writes it, as long as another process (the holder of an attach)
//! keeps the file open. Pages written here are in the kernel's shared
//! memory the moment the store instruction retires; a process's death
//! cannot lose them, and no `fsync` applies (nor is needed).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// One shared mapping of a whole memory file.
pub struct SharedMemory {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; every user synchronises its own
// accesses (atomics for shared fields, ownership rules for byte ranges).
unsafe impl Send for SharedMemory {}
// SAFETY: as above.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// A new zeroed memory file of `len` bytes named `name` (shown in
    /// `/proc/PID/fd`), mapped. The descriptor is inherited across `fork`
    /// and closed at `exec`.
    pub fn create(name: &str, len: usize) -> io::Result<Self> {
        let cname = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `cname` is a valid NUL-terminated string for the call.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is open; ftruncate only sizes the file.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd, len)
    }

    /// Maps the memory file `fd` (made by [`SharedMemory::create`], maybe in
    /// another process), whole.
    pub fn open(fd: OwnedFd) -> io::Result<Self> {
        let len = std::fs::File::from(fd.try_clone()?).metadata()?.len() as usize;
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "empty memory file",
            ));
        }
        // SAFETY: a new shared mapping of an open file at an address the
        // kernel chooses touches no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Drive data and state: never in a core dump (best effort).
        // SAFETY: the range is the mapping just made.
        unsafe { libc::madvise(ptr, len, libc::MADV_DONTDUMP) };
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap returned null");
        let mem = SharedMemory { fd, ptr, len };
        mem.populate();
        Ok(mem)
    }

    /// Maps every page of the file in this process now, writable. The
    /// kernel copies FUSE requests straight into this memory; a page it has
    /// to fault in while the process is being killed (kill -9, the exit of
    /// an upgrade) makes the copy fail, and the kernel then ends that
    /// request with EIO instead of resending it. Mapped pages are pinned
    /// without a fault. A child made by `fork` inherits the mapping but not
    /// its page table entries (the kernel leaves shared file mappings to be
    /// faulted in again), so a forked process that reads requests into the
    /// memory calls this itself. Best effort: older kernels refuse
    /// (MADV_POPULATE_WRITE is Linux 5.14), and pages then come in at first
    /// use.
    pub fn populate(&self) {
        // SAFETY: the range is this mapping, alive as long as `self`.
        unsafe {
            libc::madvise(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::MADV_POPULATE_WRITE,
            )
        };
    }

    /// Start of the mapping (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (an empty memory file is refused); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory file.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The atomic `u64` at byte `offset` (8-aligned, inside the mapping).
    pub fn u64_at(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(
            offset % 8 == 0 && offset + 8 <= self.len,
            "bad u64 offset {offset}"
        );
        // SAFETY: in bounds and aligned (checked); the mapping lives as long
        // as `self`, and atomics are how every process touches shared fields.
        unsafe {
            &*self
                .ptr
                .as_ptr()
                .add(offset)
                .cast::<std::sync::atomic::AtomicU64>()
        }
    }

    /// The atomic `u32` at byte `offset` (4-aligned, inside the mapping).
    pub fn u32_at(&self, offset: usize) -> &std::sync::atomic::AtomicU32 {
        assert!(
            offset % 4 == 0 && offset + 4 <= self.len,
            "bad u32 offset {offset}"
        );
        // SAFETY: as in `u64_at`.
        unsafe {
            &*self
                .ptr
                .as_ptr()
                .add(offset)
                .cast::<std::sync::atomic::AtomicU32>()
        }
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map`; users hold borrows of
        // `self`, so none is left.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_second_mapping_of_the_file_sees_what_the_first_wrote() {
        let a = SharedMemory::create("test", 8192).unwrap();
        a.u64_at(4096).store(0xfeed, Ordering::Release);
        let b = SharedMemory::open(a.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(b.u64_at(4096).load(Ordering::Acquire), 0xfeed);
        drop(a);
        assert_eq!(b.u64_at(4096).load(Ordering::Acquire), 0xfeed);
    }
}
