//! Running one system tool and turning its failure into one readable line.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

/// A system tool that failed or could not be started.
#[derive(Debug, thiserror::Error)]
#[error("{tool} failed: {detail}")]
pub struct ToolError {
    /// The program, e.g. `losetup`.
    pub tool: String,
    /// Its first line of stderr, or why it could not run.
    pub detail: String,
    /// Its exit code, when it ran and exited.
    pub code: Option<i32>,
}

/// Directories searched after `$PATH`: mount(8) runs its helpers with a
/// minimal environment whose `PATH` may lack the sbin directories.
const SYSTEM_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// The program's path: the first match in `$PATH`, then in [`SYSTEM_DIRS`];
/// the bare name when none matches (the spawn then reports it missing).
fn resolve(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from(program))
}

/// Run `program args...`, returning its trimmed stdout on success.
pub(crate) fn run<I, S>(program: &str, args: I) -> Result<String, ToolError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    tracing::debug!(program, ?args, "running");
    let out = crate::open_files::give_tools_the_original(&mut Command::new(resolve(program)))
        .args(&args)
        .output()
        .map_err(|e| ToolError {
            tool: program.to_string(),
            detail: if e.kind() == std::io::ErrorKind::NotFound {
                format!("{program} is not installed")
            } else {
                e.to_string()
            },
            code: None,
        })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The first line holds the reason (mount, mkfs.xfs); later ones are hints
    // ("dmesg(1) may have more information") or a usage text.
    let detail = stderr
        .lines()
        // Skip a version banner such as "resize2fs 1.47.0 (5-Feb-2023)".
        .filter(|l| !(l.starts_with(&format!("{program} ")) && l.trim_end().ends_with(')')))
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .unwrap_or_else(|| format!("exited with {}", out.status));
    Err(ToolError {
        tool: program.to_string(),
        detail,
        code: out.status.code(),
    })
}

/// Run `program args...` with `input` on its stdin; its trimmed stdout on
/// success. Used for the tools that write partition tables, so the child
/// runs in a process group of its own: a Ctrl-C at the terminal reaches
/// blobdrive, not a table write half done. A child that exits before
/// reading all its input is still waited for, and judged by its exit.
pub(crate) fn run_with_input<I, S>(program: &str, args: I, input: &str) -> Result<String, ToolError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    use std::io::Write as _;
    use std::process::Stdio;
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    tracing::debug!(program, ?args, "running with input");
    let failed = |detail: String| ToolError {
        tool: program.to_string(),
        detail,
        code: None,
    };
    use std::os::unix::process::CommandExt as _;
    let mut child = crate::open_files::give_tools_the_original(&mut Command::new(resolve(program)))
        .args(&args)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A broken pipe means the child stopped reading (it failed, or
        // needed less): its exit status below says which.
        if let Err(e) = stdin.write_all(input.as_bytes()) {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(e.to_string()));
            }
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(ToolError {
        tool: program.to_string(),
        detail: stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_string())
            .unwrap_or_else(|| format!("exited with {}", out.status)),
        code: out.status.code(),
    })
}

/// True when `program` is installed (in `$PATH` or a system directory).
pub fn tool_exists(program: &str) -> bool {
    resolve(program).is_absolute()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_gets_the_open_file_limit_the_daemon_started_with() {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit read and write the struct given.
        unsafe { assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0) };
        // The soft limit of `open_files`' own test, so either may run first
        // in one process.
        let soft: libc::rlim_t = 256;
        if limit.rlim_max <= soft {
            eprintln!("SKIPPED: the hard open-file limit is {}", limit.rlim_max);
            return;
        }
        limit.rlim_cur = soft;
        // SAFETY: as above.
        unsafe { assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0) };
        crate::open_files::raise_soft_limit().unwrap();
        assert_eq!(run("sh", ["-c", "ulimit -Sn"]).unwrap(), soft.to_string());
        assert_eq!(
            run_with_input("sh", ["-c", "ulimit -Sn"], "").unwrap(),
            soft.to_string()
        );
    }
}
