//! The manual pages: clap's generated sections (name, synopsis, options,
//! commands) for `blobdrive` and each command, the hand-written sections a
//! manual needs and clap cannot know (FILES, ENVIRONMENT, EXIT STATUS,
//! EXAMPLES, SEE ALSO), and the whole `mount.blobdrive(8)` page with the
//! fstab options. Text goes through the `roff` crate, which escapes it, so a
//! `-` or a leading `.` in it never turns into a roff request.

use clap::CommandFactory;
use roff::{bold, italic, roman, Roff};

/// One hand-written section.
struct Section {
    title: &'static str,
    items: Vec<Item>,
}

/// A piece of a hand-written section.
enum Item {
    /// A paragraph.
    Para(&'static str),
    /// A term (set in bold) and its explanation.
    Term(&'static str, &'static str),
    /// An example: what it does, then the command lines, set verbatim.
    Example(&'static str, &'static [&'static str]),
}

fn render_sections(roff: &mut Roff, sections: &[Section]) {
    for s in sections {
        roff.control("SH", [s.title]);
        for item in &s.items {
            match item {
                Item::Para(text) => {
                    roff.control("PP", []).text([roman(*text)]);
                }
                Item::Term(term, text) => {
                    roff.control("TP", [])
                        .text([bold(*term)])
                        .text([roman(*text)]);
                }
                Item::Example(what, lines) => {
                    roff.control("PP", []).text([roman(*what)]);
                    roff.control("RS", ["4"]).control("nf", []);
                    for line in *lines {
                        roff.text([roman(*line)]);
                    }
                    roff.control("fi", []).control("RE", []);
                }
            }
        }
    }
}

fn exit_status() -> Section {
    Section {
        title: "EXIT STATUS",
        items: vec![
            Item::Term("0", "Success."),
            Item::Term(
                "1",
                "The operation failed (storage refused it, the lease is held elsewhere, \
                 data could not be flushed, a check of doctor failed ...). One line \
                 \"blobdrive: ...\" on standard error says what failed and what to do.",
            ),
            Item::Term(
                "2",
                "Usage error: an unknown command or option, or a bad value.",
            ),
        ],
    }
}

fn environment() -> Section {
    Section {
        title: "ENVIRONMENT",
        items: vec![
            Item::Para(
                "The storage account is chosen in this order: --connection-string, \
                 AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY \
                 or AZURE_STORAGE_SAS_TOKEN, and with nothing set the local Azurite \
                 development storage (http://127.0.0.1:10000/devstoreaccount1).",
            ),
            Item::Term("AZURE_STORAGE_CONNECTION_STRING", "A storage connection string."),
            Item::Term("AZURE_STORAGE_ACCOUNT", "The account name (or blob endpoint URL)."),
            Item::Term("AZURE_STORAGE_KEY", "The account's shared key."),
            Item::Term("AZURE_STORAGE_SAS_TOKEN", "A shared access signature."),
            Item::Term(
                "AZURE_STORAGE_AUTH_MODE",
                "login signs in with Microsoft Entra ID (as --auth login).",
            ),
            Item::Term(
                "AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_CLIENT_CERTIFICATE_PATH, AZURE_AUTHORITY_HOST",
                "A service principal for --auth sp or login; AZURE_CLIENT_ID alone picks a \
                 user-assigned managed identity.",
            ),
            Item::Term(
                "AZURE_FEDERATED_TOKEN_FILE",
                "Workload identity (--auth workload, or login): a file holding a federated \
                 token, such as the one AKS mounts into a pod, exchanged with AZURE_TENANT_ID \
                 and AZURE_CLIENT_ID for an access token. It is read again for every token.",
            ),
            Item::Term(
                "IDENTITY_ENDPOINT, IDENTITY_HEADER",
                "The managed identity endpoint on App Service and Arc.",
            ),
            Item::Term(
                "BLOBDRIVE_RUN_DIR",
                "Where control sockets, the registry of attached drives and private FUSE \
                 mounts live (default /run/blobdrive); when others may write to it (/tmp) or \
                 it is not the user's, in blobdrive-UID inside it (0700). It is never \
                 changed itself.",
            ),
            Item::Term(
                "BLOBDRIVE_RECOVERY_DIR",
                "Where recovery files go (default /var/lib/blobdrive/recovery).",
            ),
            Item::Term(
                "BLOBDRIVE_RETRY_TOTAL_SECS",
                "How long a request is retried in all (default 120).",
            ),
            Item::Term("RUST_LOG", "Log filter; overrides -v."),
            Item::Term(
                "JOURNAL_STREAM, INVOCATION_ID",
                "Set by systemd: the daemon then logs to the journal with the fields DRIVE, \
                 OPERATION and REQUEST_ID.",
            ),
            Item::Term(
                "NOTIFY_SOCKET",
                "Set by systemd for Type=notify units: the daemon sends READY=1 once the \
                 filesystem is mounted.",
            ),
        ],
    }
}

fn files() -> Section {
    Section {
        title: "FILES",
        items: vec![
            Item::Term(
                "/run/blobdrive/",
                "Control sockets of mounts (only root and the user who mounted may use \
                 them), and attach/ with one registry entry (*.json) and one private FUSE \
                 mount per attached drive; 0700.",
            ),
            Item::Term(
                "/var/lib/blobdrive/recovery/",
                "Recovery files (*.bdrec) of data an unmount could not flush; apply them with \
                 blobdrive recover.",
            ),
            Item::Term(
                "/var/cache/blobdrive/",
                "The local disk tier (--cache-dir): v2/ with a directory per drive, its \
                 chunks in slab files of 256 chunks (64 MiB of the drive) each; directories \
                 0700, files 0600. A v1/ left by an older blobdrive is removed at mount.",
            ),
            Item::Term(
                "/etc/blobdrive/NAME.conf, /etc/blobdrive/NAME.env",
                "Drive, mount point and options, and credentials (mode 0600), of the systemd \
                 unit blobdrive@NAME.",
            ),
            Item::Term(
                "/etc/fstab",
                "Drives mounted at boot through mount.blobdrive(8).",
            ),
        ],
    }
}

fn see_also(extra: &'static str) -> Section {
    let text: &'static str = if extra.is_empty() {
        "blobdrive(1), mount.blobdrive(8), fstab(5), losetup(8), systemd.mount(5)"
    } else {
        extra
    };
    Section {
        title: "SEE ALSO",
        items: vec![Item::Para(text)],
    }
}

fn main_examples() -> Section {
    Section {
        title: "EXAMPLES",
        items: vec![
            Item::Example(
                "Create a 10 GiB drive with ext4, attach it, use it, detach it:",
                &[
                    "blobdrive create disks/data.vhd --size 10G --mkfs ext4",
                    "sudo blobdrive mount disks/data.vhd /mnt/data",
                    "sudo blobdrive stats /mnt/data",
                    "sudo blobdrive unmount /mnt/data",
                ],
            ),
            Item::Example(
                "A consistent snapshot of a mounted drive, attached read-only:",
                &[
                    "T=$(sudo blobdrive snapshot disks/data.vhd)",
                    "sudo blobdrive mount disks/data.vhd /mnt/then --snapshot \"$T\"",
                ],
            ),
            Item::Example(
                "Check that a mount can work on this host:",
                &["sudo blobdrive doctor disks/data.vhd"],
            ),
        ],
    }
}

/// What each file operation means in a namespace mount (`blobdrive mount
/// [C] DIR`); the README's namespace section says the same.
fn namespace_mounts() -> Section {
    Section {
        title: "NAMESPACE MOUNTS",
        items: vec![
            Item::Para(
                "blobdrive mount [C] DIR shows the account (or one container) as directories, \
                 drives as fixed-size files and snapshots as read-only files named \
                 NAME@TIME. Every change is given a meaning or refused with an errno and \
                 one line in the daemon's log; a read-only mount answers EROFS to all of them.",
            ),
            Item::Term(
                "mkdir NAME, rmdir NAME",
                "At the top of an account mount: create a container (EINVAL for a name the \
                 service refuses), remove an empty one (ENOTEMPTY while it holds a blob). \
                 Inside a container mkdir makes a directory of this mount only (storage \
                 has no empty directories), kept until a drive is made in it; rmdir removes \
                 it while empty.",
            ),
            Item::Term(
                "truncate -s SIZE NAME.vhd, fallocate -l SIZE NAME.vhd, qemu-img create -f raw NAME.vhd SIZE",
                "Create a drive of SIZE exactly as blobdrive create does (a whole number of \
                 MiB from 16M to 8 TiB - 1 MiB, else EINVAL; never over an existing blob: \
                 EEXIST). A created NAME.vhd is size 0 and exists only in this mount until \
                 it gets a size; one closed without a size is gone (touch alone leaves \
                 nothing). Other names cannot be created (EPERM): block blobs are read-only here.",
            ),
            Item::Term(
                "rm NAME",
                "Delete a drive, with blobdrive delete's refusals: EBUSY while it is leased \
                 (mounted here or elsewhere), ENOTEMPTY while it has snapshots (blobdrive \
                 delete C/B --include-snapshots, or rm each NAME@TIME first), EPERM for a \
                 blob that is not a drive. rm NAME@TIME deletes that snapshot.",
            ),
            Item::Term(
                "mv, ln, ln -s, mknod",
                "EPERM: a blob's name is fixed and storage has no links (blobdrive copy \
                 then blobdrive delete renames a drive).",
            ),
            Item::Term(
                "chmod, chown, touch (times)",
                "Accepted and ignored: the blob has nowhere to keep them. A size other than \
                 a drive's own (truncate, or fallocate past its end) is EPERM (blobdrive \
                 resize changes it).",
            ),
            Item::Term(
                "getfattr -d NAME.vhd",
                "Read-only attributes of a drive: user.blobdrive.lease, \
                 user.blobdrive.snapshots (a count) and user.blobdrive.stored_bytes (what \
                 blobdrive info shows; a snapshot has only the last). setfattr on them is \
                 EPERM, on any other name EOPNOTSUPP.",
            ),
            Item::Term(
                "ENOSYS",
                "Left only where the kernel then does the right thing itself: lseek with \
                 SEEK_DATA or SEEK_HOLE (the whole file counts as data) and copy_file_range \
                 (the caller copies with reads and writes). File locks are the kernel's \
                 own, local to the host.",
            ),
        ],
    }
}

/// Extra sections of one command's page, by command name.
fn command_sections(name: &str) -> Vec<Section> {
    let example = |what, lines| Section {
        title: "EXAMPLES",
        items: vec![Item::Example(what, lines)],
    };
    let mut out = Vec::new();
    match name {
        "blobdrive-mount" => {
            out.push(example(
                "Attach a drive, serve its metrics on 127.0.0.1:9101:",
                &["sudo blobdrive mount disks/data.vhd /mnt/data --metrics-listen 9101"],
            ));
            out.push(namespace_mounts());
            out.push(files());
        }
        "blobdrive-create" => out.push(example(
            "A 10 GiB drive formatted with xfs:",
            &["blobdrive create disks/data.vhd --size 10G --mkfs xfs"],
        )),
        "blobdrive-stats" => out.push(example(
            "Counters for Prometheus, checked by promtool:",
            &["blobdrive stats /mnt/data --prometheus | promtool check metrics"],
        )),
        "blobdrive-doctor" => out.push(example(
            "Every check, as JSON:",
            &["sudo blobdrive doctor disks/data.vhd --json"],
        )),
        "blobdrive-completions" => out.push(example(
            "Completions for the running bash, and for zsh:",
            &[
                "source <(blobdrive completions bash)",
                "blobdrive completions zsh > ~/.zfunc/_blobdrive",
            ],
        )),
        "blobdrive-recover" => out.push(files()),
        "blobdrive-serve" => out.push(Section {
            title: "EXAMPLES",
            items: vec![
                Item::Example(
                    "Export a drive on a Unix socket, then boot a VM from it, map its holes and copy it:",
                    &[
                        "blobdrive serve disks/vm.vhd --nbd unix:/run/vm.nbd",
                        "qemu-system-x86_64 -m 2G -drive file=nbd+unix:///disks/vm.vhd?socket=/run/vm.nbd,format=raw",
                        "nbdinfo --map 'nbd+unix:///disks/vm.vhd?socket=/run/vm.nbd'",
                        "nbdcopy 'nbd+unix:///disks/vm.vhd?socket=/run/vm.nbd' vm.raw",
                    ],
                ),
                Item::Example(
                    "On a host with the nbd kernel module, a block device with its partitions:",
                    &[
                        "sudo nbd-client -unix /run/vm.nbd -N disks/vm.vhd /dev/nbd0",
                        "sudo nbd-client -d /dev/nbd0",
                    ],
                ),
                Item::Example(
                    "See it, count it, stop it (after its final flush; non-zero, naming the \
                     recovery file, when that flush fails):",
                    &[
                        "blobdrive list --mounted",
                        "blobdrive stats /run/vm.nbd --prometheus",
                        "blobdrive unmount /run/vm.nbd",
                    ],
                ),
                Item::Para(
                    "A Unix socket is mode 0600 and only root and the user who started the \
                     server may connect. NBD has no authentication: a tcp: endpoint on \
                     loopback is open to every local user, and --allow-remote to anyone who \
                     reaches the port.",
                ),
                Item::Para(
                    "unmount and stats name a server by its socket path, its tcp:IP:PORT \
                     endpoint or an export's name. unmount stops the server under its \
                     clients (active connections are disconnected, unlike a busy mount, \
                     which unmount refuses) and returns after the final flush; a second \
                     unmount meanwhile waits for the same answer. Without --log-file a \
                     background server logs to a file in the run directory, which \
                     'blobdrive list --mounted --json' names (its rows have kind \"nbd\").",
                ),
            ],
        }),
        _ => {}
    }
    out.push(exit_status());
    out.push(environment());
    out.push(see_also(""));
    out
}

/// Render one clap command's page with `extra` before its VERSION section.
fn clap_page(cmd: clap::Command, extra: &[Section]) -> String {
    let man = clap_mangen::Man::new(cmd.clone())
        .date(env!("CARGO_PKG_VERSION"))
        .manual("blobdrive manual");
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = man.render_title(&mut out);
    let _ = man.render_name_section(&mut out);
    let _ = man.render_synopsis_section(&mut out);
    let _ = man.render_description_section(&mut out);
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        let _ = man.render_options_section(&mut out);
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        let _ = man.render_subcommands_section(&mut out);
    }
    let mut roff = Roff::new();
    render_sections(&mut roff, extra);
    out.extend_from_slice(roff.render().as_bytes());
    if cmd.get_version().is_some() {
        let _ = man.render_version_section(&mut out);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `mount.blobdrive(8)`: the helper mount(8) calls, and the fstab options.
fn mount_helper_page() -> String {
    let mut roff = Roff::new();
    roff.control(
        "TH",
        [
            "MOUNT.BLOBDRIVE",
            "8",
            env!("CARGO_PKG_VERSION"),
            "blobdrive",
            "blobdrive manual",
        ],
    );
    roff.control("SH", ["NAME"]).text([roman(
        "mount.blobdrive - attach an Azure page-blob drive for mount(8) and /etc/fstab",
    )]);
    roff.control("SH", ["SYNOPSIS"]).text([
        bold("mount.blobdrive"),
        roman(" "),
        italic("CONTAINER/BLOB"),
        roman(" "),
        italic("DIR"),
        roman(" [-sfnv] [-o "),
        italic("OPTIONS"),
        roman("]"),
    ]);
    roff.control("br", []).text([
        bold("mount -t blobdrive"),
        roman(" "),
        italic("CONTAINER/BLOB DIR"),
        roman(" [-o "),
        italic("OPTIONS"),
        roman("]"),
    ]);
    let sections = vec![
        Section {
            title: "DESCRIPTION",
            items: vec![
                Item::Para(
                    "mount(8) runs this helper for filesystems of type blobdrive, from the \
                     command line or from /etc/fstab. It does what 'blobdrive mount \
                     CONTAINER/BLOB DIR' does: take the blob's lease (read-write), serve the \
                     drive from a private FUSE mount, attach it to a loop device and mount the \
                     filesystem inside it at DIR. It returns once DIR is mounted; the daemon \
                     stays in the background. A plain umount DIR detaches the drive: the daemon \
                     notices, flushes every dirty page and releases the lease.",
                ),
                Item::Para(
                    "It is the blobdrive binary itself, called under this name through a \
                     link in /sbin that the Debian package and scripts/install.sh install.",
                ),
            ],
        },
        Section {
            title: "OPTIONS",
            items: vec![
                Item::Term("ro, rw", "Attach read-only (no lease) or read-write (the default)."),
                Item::Term("snapshot=TIME", "Attach a snapshot (always read-only)."),
                Item::Term("cache-size=SIZE", "Memory for the drive's page cache (default 512M)."),
                Item::Term(
                    "key-file=FILE, passphrase-file=FILE",
                    "The key of an encrypted drive, from a file (a mount at boot has no \
                     terminal to ask on).",
                ),
                Item::Term(
                    "max-dirty=SIZE",
                    "Memory written data may hold before writers wait for room \
                     (default a quarter of cache-size).",
                ),
                Item::Term("cache-dir=DIR, disk-cache-size=SIZE", "Turn the local disk tier on."),
                Item::Term(
                    "flush-delay=DURATION",
                    "How long written data may stay only in memory before the background \
                     flush sends it (default 1s; fsync always sends it at once, and a \
                     sequential write each whole 4 MiB it has written).",
                ),
                Item::Term(
                    "partition=N|auto",
                    "Attach partition N of an MBR or GPT drive, or the one auto chooses.",
                ),
                Item::Term("break-lease", "Take the drive over from a host that holds its lease."),
                Item::Term("log-file=PATH", "Where the background daemon writes its log."),
                Item::Term(
                    "metrics-listen=[ADDR:]PORT, metrics-textfile=DIR, metrics-allow-remote",
                    "Prometheus metrics, as the mount options of blobdrive-mount(1).",
                ),
                Item::Term(
                    "credentials=PATH",
                    "A file (mode 0600) of AZURE_STORAGE_CONNECTION_STRING=... lines (or \
                     AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN), \
                     so no secret sits in /etc/fstab; for workload identity, \
                     AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_AUTH_MODE=workload, \
                     AZURE_FEDERATED_TOKEN_FILE, AZURE_TENANT_ID and AZURE_CLIENT_ID (and \
                     AZURE_AUTHORITY_HOST). It sets no other variable.",
                ),
                Item::Term(
                    "defaults, auto, noauto, user, users, nouser, owner, group, _netdev, nofail, comment=..., x-*",
                    "For mount(8) and systemd; ignored by the helper. _netdev matters: it \
                     orders the mount after the network.",
                ),
                Item::Para("Every other option goes to the drive's filesystem (noatime, discard, ...)."),
            ],
        },
        Section {
            title: "EXAMPLES",
            items: vec![
                Item::Example(
                    "From the command line:",
                    &[
                        "mount -t blobdrive disks/data.vhd /mnt/data -o noatime",
                        "mount -t blobdrive disks/data.vhd /mnt/ro -o ro",
                        "umount /mnt/data",
                    ],
                ),
                Item::Example(
                    "An /etc/fstab line (one line):",
                    &[
                        "disks/data.vhd /mnt/data blobdrive",
                        "  _netdev,nofail,noatime,credentials=/etc/blobdrive/a.env 0 0",
                    ],
                ),
            ],
        },
        exit_status(),
        files(),
        see_also("blobdrive(1), blobdrive-mount(1), mount(8), fstab(5), systemd.mount(5)"),
    ];
    render_sections(&mut roff, &sections);
    roff.render()
}

/// Every page, as (file name, roff text): `blobdrive.1`, one page per
/// command and sub-command (`blobdrive-cache-clear.1`), `mount.blobdrive.8`.
pub fn all_pages() -> Vec<(String, String)> {
    let mut root = super::Cli::command().disable_help_subcommand(true);
    root.build();
    let mut pages = Vec::new();
    let mut main_extra = vec![files(), environment(), exit_status(), main_examples()];
    main_extra.push(see_also(
        "mount.blobdrive(8), blobdrive-COMMAND(1) for each command, losetup(8), fstab(5)",
    ));
    pages.push((
        "blobdrive.1".to_string(),
        clap_page(root.clone(), &main_extra),
    ));
    fn walk(cmd: &clap::Command, pages: &mut Vec<(String, String)>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let name = sub.get_display_name().unwrap_or(sub.get_name()).to_string();
            let extra = command_sections(&name);
            pages.push((format!("{name}.1"), clap_page(sub.clone(), &extra)));
            walk(sub, pages);
        }
    }
    walk(&root, &mut pages);
    pages.push(("mount.blobdrive.8".to_string(), mount_helper_page()));
    pages
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_command_has_a_page_with_the_hand_written_sections() {
        let pages = super::all_pages();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        for want in [
            "blobdrive.1",
            "blobdrive-mount.1",
            "blobdrive-cache-clear.1",
            "mount.blobdrive.8",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        let (_, main) = &pages[0];
        for section in ["FILES", "ENVIRONMENT", "EXIT STATUS", "EXAMPLES"] {
            assert!(
                main.contains(&format!(".SH \"{section}\""))
                    || main.contains(&format!(".SH {section}")),
                "{section}"
            );
        }
    }
}
