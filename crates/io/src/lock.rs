//! One natrix per interface. A second natrix on the same link would forward
//! with state of its own: two NATs answering for one pool. Each live natrix
//! holds an exclusive lock per interface, a file named by the interface and
//! the network namespace; the kernel drops the lock when the process ends,
//! however it ends, so a crash never leaves a stale lock behind.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where live natrix processes keep their interface locks.
pub const LOCK_DIR: &str = "/run/natrix";

#[derive(Debug)]
pub enum LockError {
    /// Another process holds the interface.
    Held { interface: String, pid: Option<u32>, path: PathBuf },
    /// The lock file could not be made or taken.
    Io { path: PathBuf, source: std::io::Error },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held { interface, pid: Some(pid), path } => {
                write!(f, "interface {interface} is already in use by natrix pid {pid} (lock {}); stop that one first", path.display())
            }
            LockError::Held { interface, pid: None, path } => write!(f, "interface {interface} is already in use by another natrix (lock {})", path.display()),
            LockError::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for LockError {}

/// Held for as long as natrix uses the interface.
#[derive(Debug)]
pub struct InterfaceLock {
    _file: File,
}

impl InterfaceLock {
    /// Takes the lock for `interface` in this process's network namespace,
    /// under `dir`, and records this process's PID in it.
    pub fn acquire(dir: &Path, interface: &str) -> Result<InterfaceLock, LockError> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LockError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let path = dir.join(format!("{}.{interface}.lock", namespace_id().map_err(io_err(Path::new("/proc/self/ns/net")))?));
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io_err(&path))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(LockError::Held { interface: interface.to_owned(), pid: holder(&mut file), path });
            }
            return Err(LockError::Io { path, source: e });
        }
        file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{}", std::process::id())).map_err(io_err(&path))?;
        Ok(InterfaceLock { _file: file })
    }
}

/// The network namespace, as `netns-INODE`: interface names repeat across
/// namespaces, the namespace's inode does not.
fn namespace_id() -> std::io::Result<String> {
    Ok(format!("netns-{}", std::fs::metadata("/proc/self/ns/net")?.ino()))
}

fn holder(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_until_it_lets_go() {
        let dir = std::env::temp_dir().join(format!("natrix-lock-{}", std::process::id()));
        let first = InterfaceLock::acquire(&dir, "eth1").unwrap();
        // flock locks belong to the open file, so a second open in this
        // process contends like another process would.
        match InterfaceLock::acquire(&dir, "eth1") {
            Err(e @ LockError::Held { pid: Some(pid), .. }) => {
                assert_eq!(pid, std::process::id());
                assert!(e.to_string().contains("eth1") && e.to_string().contains(&pid.to_string()), "{e}");
            }
            other => panic!("{other:?}"),
        }
        let other_interface = InterfaceLock::acquire(&dir, "eth2").unwrap();
        drop(first);
        let again = InterfaceLock::acquire(&dir, "eth1").unwrap();
        drop((again, other_interface));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
