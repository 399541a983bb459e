//! Which module, server and cli every suite and bench uses, from the
//! environment, so that `make test` selects the four servers the same way
//! for all of them.

use std::path::{Path, PathBuf};

/// The module under test: `LOCK_MODULE`, else the workspace's release build
/// (`target/release/libredislock.so`); an error naming the path if it is not
/// there.
pub fn try_module_path() -> Result<PathBuf, String> {
    let path = match std::env::var_os("LOCK_MODULE") {
        Some(path) => PathBuf::from(path),
        // This crate lives one level below the workspace root.
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/libredislock.so"),
    };
    if !path.is_file() {
        return Err(format!(
            "module {} not found: build it first: cargo build --release at the \
             repository root (make test and make bench do it)",
            path.display()
        ));
    }
    Ok(path)
}

/// [`try_module_path`], panicking if the module is not there.
pub fn module_path() -> PathBuf {
    try_module_path().unwrap_or_else(|why| panic!("{why}"))
}

/// The server binary: `LOCK_SERVER`, else `REDIS_SERVER`, else `redis-server`.
pub fn server_bin() -> String {
    env_or(&["LOCK_SERVER", "REDIS_SERVER"], "redis-server")
}

/// The cli binary: `LOCK_CLI`, else `REDIS_CLI`, else `redis-cli`.
pub fn cli_bin() -> String {
    env_or(&["LOCK_CLI", "REDIS_CLI"], "redis-cli")
}

/// The first of `names` set to a non-empty value, else `default`.
fn env_or(names: &[&str], default: &str) -> String {
    names
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| default.into())
}
