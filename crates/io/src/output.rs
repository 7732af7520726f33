//! Output files that never destroy what they replace: each is written under a
//! temporary name beside its final one and renamed into place only when the
//! whole of it is written, so a failed run leaves the old file (or none)
//! under the requested name, never half of a new one.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A file being written under a temporary name; `commit` renames it to its
/// final name, dropping it uncommitted removes it.
#[derive(Debug)]
pub struct PendingFile {
    temp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl PendingFile {
    /// Creates the temporary file beside `dest` (same folder, so the rename
    /// is atomic) and hands it over for writing.
    pub fn create(dest: &Path) -> io::Result<(PendingFile, File)> {
        let name = dest.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
        if dest.is_dir() {
            return Err(io::Error::new(io::ErrorKind::IsADirectory, "is a folder, not a file"));
        }
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".natrix-{}.tmp", std::process::id()));
        let temp = dest.with_file_name(temp_name);
        let file = OpenOptions::new().write(true).create(true).truncate(true).open(&temp)?;
        Ok((PendingFile { temp, dest: dest.to_path_buf(), committed: false }, file))
    }

    /// The name the file will have once committed.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Moves the finished file to its final name. The caller has flushed it.
    pub fn commit(mut self) -> io::Result<()> {
        std::fs::rename(&self.temp, &self.dest)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Whether two paths name the same file: by device and inode when both
/// exist (so hard and symbolic links are seen through), else by their
/// absolute, resolved names.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => resolved(a).is_some_and(|x| resolved(b).as_ref() == Some(&x)),
    }
}

/// The path with its folder resolved (the file itself may not exist yet).
fn resolved(p: &Path) -> Option<PathBuf> {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(dir.canonicalize().ok()?.join(p.file_name()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("natrix-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_committed_file_replaces_the_old_one_and_an_abandoned_one_leaves_it() {
        let dir = scratch("commit");
        let dest = dir.join("out.bin");
        std::fs::write(&dest, b"old").unwrap();
        let (pending, mut f) = PendingFile::create(&dest).unwrap();
        f.write_all(b"half").unwrap();
        drop((pending, f));
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "the temporary file is removed");
        let (pending, mut f) = PendingFile::create(&dest).unwrap();
        f.write_all(b"new").unwrap();
        pending.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn same_file_sees_through_links_and_spellings() {
        let dir = scratch("same");
        let a = dir.join("a.pcap");
        std::fs::write(&a, b"x").unwrap();
        let hard = dir.join("hard.pcap");
        std::fs::hard_link(&a, &hard).unwrap();
        let soft = dir.join("soft.pcap");
        std::os::unix::fs::symlink(&a, &soft).unwrap();
        let other = dir.join("b.pcap");
        std::fs::write(&other, b"x").unwrap();
        assert!(same_file(&a, &hard));
        assert!(same_file(&a, &soft));
        assert!(same_file(&a, &dir.join(".").join("a.pcap")));
        assert!(!same_file(&a, &other));
        assert_eq!(PendingFile::create(&dir).unwrap_err().kind(), io::ErrorKind::IsADirectory);
        let fresh = dir.join("new.pcapng");
        assert!(same_file(&fresh, &dir.join("./new.pcapng")), "two spellings of a file still to be written");
        assert!(!same_file(&fresh, &a));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
