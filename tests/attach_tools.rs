//! The attach layer's kernel tools on a plain file: loop device with direct
//! I/O, mkfs, detect, mount, freeze, read-only mount without journal replay.
//! No FUSE here; the FUSE file path is covered by the attach end-to-end tests.

use std::path::{Path, PathBuf};

use blobdrive::attach::{filesystem, FsType, LoopDevice, MountedFs, ReadQueue};

/// Skip (or fail, under BLOBDRIVE_REQUIRE_FUSE=1) when loop devices are unusable.
fn loop_devices_usable() -> bool {
    let ok = Path::new("/dev/loop-control").exists() && unsafe { libc::geteuid() } == 0;
    if !ok {
        assert!(
            std::env::var("BLOBDRIVE_REQUIRE_FUSE").as_deref() != Ok("1"),
            "loop devices are required (BLOBDRIVE_REQUIRE_FUSE=1) but unusable"
        );
        println!("SKIPPED: loop devices need root and /dev/loop-control");
    }
    ok
}

/// Undoes whatever the test set up, in reverse order, even when it panics.
#[derive(Default)]
struct Cleanup {
    mounts: Vec<PathBuf>,
    loops: Vec<LoopDevice>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for dir in self.mounts.drain(..).rev() {
            let _ = std::process::Command::new("umount").arg(&dir).status();
        }
        for dev in self.loops.drain(..).rev() {
            let _ = dev.detach();
        }
    }
}

/// A sparse file of `mib` MiB named `name` in `dir`, for a loop device.
fn sparse_image(dir: &Path, name: &str, mib: u64) -> PathBuf {
    let image = dir.join(name);
    std::fs::File::create(&image)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    image
}

#[test]
fn ext4_on_a_direct_io_loop_device_round_trips_and_mounts_read_only_without_replay() {
    if !loop_devices_usable() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let image = sparse_image(tmp.path(), "disk.img", 64);
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mut cleanup = Cleanup::default();

    let dev = LoopDevice::attach(&image, false).unwrap();
    cleanup.loops.push(dev.clone());
    assert!(LoopDevice::find_by_file(&image).unwrap().contains(&dev));
    assert_eq!(filesystem::detect(&dev.device).unwrap(), None);

    filesystem::make(&dev.device, &FsType::Ext4).unwrap();
    assert_eq!(filesystem::detect(&dev.device).unwrap(), Some(FsType::Ext4));

    let fs = MountedFs::mount(&dev.device, &dir, FsType::Ext4, false, &[]).unwrap();
    cleanup.mounts.push(dir.clone());
    std::fs::write(dir.join("hello.txt"), b"hello from a loop device").unwrap();
    filesystem::freeze(&dir).unwrap();
    filesystem::thaw(&dir).unwrap();
    fs.unmount().unwrap();
    cleanup.mounts.clear();
    dev.detach().unwrap();
    cleanup.loops.clear();

    let ro = LoopDevice::attach(&image, true).unwrap();
    cleanup.loops.push(ro.clone());
    let fs = MountedFs::mount(&ro.device, &dir, FsType::Ext4, true, &[]).unwrap();
    cleanup.mounts.push(dir.clone());
    assert_eq!(
        std::fs::read(dir.join("hello.txt")).unwrap(),
        b"hello from a loop device"
    );
    let err = std::fs::write(dir.join("new.txt"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    fs.unmount().unwrap();
    cleanup.mounts.clear();
}

/// The queue settings an attach gives its loop device (1 MiB requests,
/// 512 KiB read-ahead) are the kernel's until the device is detached, and
/// the ones they replaced come back before the detach: the kernel would
/// keep them for the device's next user.
#[test]
fn a_loop_device_takes_a_read_queue_and_gives_the_old_one_back() {
    if !loop_devices_usable() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let image = sparse_image(tmp.path(), "disk.img", 16);
    let mut cleanup = Cleanup::default();
    let dev = LoopDevice::attach(&image, true).unwrap();
    cleanup.loops.push(dev.clone());

    let queue = |name: &str| -> u32 {
        let node = dev
            .device
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        std::fs::read_to_string(format!("/sys/block/{node}/queue/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let kernels = dev.read_queue().unwrap();
    let wanted = ReadQueue {
        max_request_kib: 1024,
        read_ahead_kib: 512,
    };
    assert_ne!(kernels, wanted, "the kernel's own settings differ");
    let before = dev.set_read_queue(wanted).unwrap();
    assert_eq!(before, kernels);
    assert_eq!(
        queue("max_sectors_kb"),
        1024.min(queue("max_hw_sectors_kb"))
    );
    assert_eq!(queue("read_ahead_kb"), 512);

    dev.restore_read_queue(before);
    assert_eq!(dev.read_queue().unwrap(), kernels);
    dev.detach().unwrap();
    cleanup.loops.clear();
}

#[test]
fn mounting_a_device_without_a_filesystem_fails_with_the_tools_reason() {
    if !loop_devices_usable() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let image = sparse_image(tmp.path(), "blank.img", 16);
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mut cleanup = Cleanup::default();
    let dev = LoopDevice::attach(&image, true).unwrap();
    cleanup.loops.push(dev.clone());
    let err = MountedFs::mount(&dev.device, &dir, FsType::Ext4, true, &[]).unwrap_err();
    assert_eq!(err.tool, "mount");
    assert!(!err.detail.is_empty());
}
