//! Puts the git commit natrix is built from into `natrix --version`
//! (`NATRIX_COMMIT`): the short hash of HEAD, or "unknown" outside a git
//! checkout (a source tarball). Setting `NATRIX_COMMIT` in the environment
//! overrides both, for packagers who build from an exported tree.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=NATRIX_COMMIT");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let commit = match std::env::var("NATRIX_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => git_commit(&manifest_dir).unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=NATRIX_COMMIT={commit}");
}

/// The short hash of HEAD, when this crate is part of the checkout it sits in
/// (a tarball unpacked inside some other repository is not). Registers the
/// files that move when HEAD does, so a new commit rebuilds the version
/// string and nothing else makes the build dirty.
fn git_commit(dir: &Path) -> Option<String> {
    // This crate's own manifest must be tracked by the repository around it.
    git(dir, &["ls-files", "--error-unmatch", "Cargo.toml"])?;
    let git_dir = PathBuf::from(git(dir, &["rev-parse", "--path-format=absolute", "--git-dir"])?);
    let common_dir = PathBuf::from(git(dir, &["rev-parse", "--path-format=absolute", "--git-common-dir"])?);
    watch(&git_dir.join("HEAD"));
    // HEAD names a branch (absent when detached); its ref is a loose file or
    // a line of packed-refs. Only files that exist are registered: cargo
    // reruns a build script on every build while a registered path is
    // missing.
    if let Some(reference) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch(&common_dir.join(reference));
    }
    watch(&common_dir.join("packed-refs"));
    git(dir, &["rev-parse", "--short=7", "HEAD"])
}

fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}
