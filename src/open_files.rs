//! The open-file limit (`RLIMIT_NOFILE`) of a daemon and of the tools it
//! runs.
//!
//! A daemon holds a descriptor for every client connection (NBD, metrics
//! scrapes, the control socket), slab file and blob connection, so it
//! raises its soft limit to the hard limit as it starts, as servers do: a
//! soft limit of 1024 is a default for programs that use select(2), not a
//! budget. The tools it runs (mkfs, losetup, e2fsck, fsfreeze, `az`, ...)
//! are such programs, or may be, so they get the original soft limit
//! back in the child, between the fork and the exec.
//!
//! The limit is the process's, so the raise belongs where a daemon starts
//! serving (once, before its runtime's threads); everything that spawns a
//! tool passes its command through [`give_tools_the_original`] (or
//! [`give_tool_the_original`] for tokio's).

use std::sync::OnceLock;

/// The limits found before the raise, when it changed them: (soft, hard).
static ORIGINAL: OnceLock<(libc::rlim_t, libc::rlim_t)> = OnceLock::new();

fn get() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

fn set(limit: &libc::rlimit) -> std::io::Result<()> {
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Raises this process's soft open-file limit to its hard limit, and
/// remembers the original for the tools it will run. Returns the soft
/// limit now. A second call keeps the first original.
pub fn raise_soft_limit() -> std::io::Result<u64> {
    let mut limit = get()?;
    if limit.rlim_cur < limit.rlim_max {
        let original = (limit.rlim_cur, limit.rlim_max);
        limit.rlim_cur = limit.rlim_max;
        set(&limit)?;
        let _ = ORIGINAL.set(original);
    }
    Ok(limit.rlim_cur as u64)
}

/// The limits a child gets back, when this process raised its own.
fn original() -> Option<libc::rlimit> {
    ORIGINAL.get().map(|&(soft, hard)| libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    })
}

/// Makes `cmd`'s child start with the soft open-file limit this process
/// had before [`raise_soft_limit`] (nothing to do when it never raised).
pub fn give_tools_the_original(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt as _;
    if let Some(limit) = original() {
        // SAFETY: the hook runs in the child between fork and exec and
        // calls only setrlimit, which is async-signal-safe; it allocates
        // nothing.
        unsafe { cmd.pre_exec(move || set(&limit)) };
    }
    cmd
}

/// [`give_tools_the_original`] for a tokio command.
pub fn give_tool_the_original(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    if let Some(limit) = original() {
        // SAFETY: as in `give_tools_the_original`.
        unsafe { cmd.pre_exec(move || set(&limit)) };
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The soft limit `ulimit -Sn` reports in a child of `cmd`'s making.
    fn childs_soft_limit(cmd: &mut std::process::Command) -> String {
        let out = cmd.args(["-c", "ulimit -Sn"]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    #[test]
    fn the_daemon_raises_its_limit_and_its_tools_get_the_original() {
        // The soft limit a login shell gives, below the hard one.
        let hard = get().unwrap().rlim_max;
        let soft: libc::rlim_t = 256;
        if hard <= soft {
            eprintln!("SKIPPED: the hard open-file limit is {hard}");
            return;
        }
        set(&libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        })
        .unwrap();
        assert_eq!(raise_soft_limit().unwrap(), hard as u64);
        assert_eq!(get().unwrap().rlim_cur, hard, "raised to the hard limit");
        let mut tool = std::process::Command::new("sh");
        assert_eq!(
            childs_soft_limit(give_tools_the_original(&mut tool)),
            soft.to_string()
        );
        // Without the hook a child inherits the raised limit.
        assert_eq!(
            childs_soft_limit(&mut std::process::Command::new("sh")),
            hard.to_string()
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = runtime.block_on(async {
            let mut tool = tokio::process::Command::new("sh");
            give_tool_the_original(&mut tool)
                .args(["-c", "ulimit -Sn"])
                .output()
                .await
                .unwrap()
        });
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            soft.to_string()
        );
    }
}
