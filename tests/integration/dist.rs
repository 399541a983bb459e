//! The release tarball (`make dist`): one folder holding the module, a
//! README, a `redis.conf` snippet, the licence and checksums that verify;
//! the same bytes from the same inputs; and its module loaded into the server
//! under test in each of the three ways the Install section of docs/operations.md gives (the tarball's README carries it).
//!
//! Each test packs the module under test (`LOCK_MODULE`) with
//! `make dist-pack`, the packing half of `make dist`, into a folder of its
//! own. It builds nothing: `cargo test` builds the library with its
//! dev-dependencies' features, so a `cargo build` from a test would relink
//! `target/release/libredislock.so` while other tests' servers load it. No
//! two tests or runs share an output, so nothing needs a lock, and a pack
//! takes a fraction of a second.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::UNIX_EPOCH;

use redis::Value;

use crate::harness::{module_path, text, Call, Server};

/// What each pack holds, in the order `tar` lists it (names sorted).
const FILES: &[&str] = &[
    "LICENSE",
    "README.md",
    "SHA256SUMS",
    "libredislock.so",
    "redis.conf",
];

/// Gives every scratch folder of this test process its own name.
static SCRATCHES: AtomicUsize = AtomicUsize::new(0);

/// A temp folder of one test: removed when the test passes, kept for a look
/// when it fails.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let n = SCRATCHES.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir()
            .join("redislock-tests")
            .join(format!("dist-{what}-{}-{n}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir).expect("remove a stale scratch folder");
        }
        fs::create_dir_all(&dir).expect("create the scratch folder");
        Scratch(dir)
    }

    /// A new, empty folder inside it.
    fn folder(&self, name: &str) -> PathBuf {
        let dir = self.0.join(name);
        fs::create_dir(&dir).expect("create an empty folder");
        dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("dist test files kept in {}", self.0.display());
        } else {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// The release's name, `redislock-<version>-<target>`, the target being the
/// platform of this build without a vendor (`x86_64-linux-gnu`).
fn release_name() -> String {
    let env = if cfg!(target_env = "musl") {
        "musl"
    } else {
        "gnu"
    };
    format!(
        "redislock-{}-{}-{}-{env}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}

/// Runs `command` (in `cwd`, if given) and returns what it printed; panics
/// with its output if it fails.
fn run(mut command: Command, cwd: Option<&Path>) -> String {
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let shown = format!("{command:?}");
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{shown}: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn command(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args);
    command
}

/// `make dist-pack` of the module under test into `out`, with `epoch` as
/// `SOURCE_DATE_EPOCH` (`None`: unset, so the last commit's time). Returns
/// the tarball's path, which make prints.
fn pack(out: &Path, epoch: Option<u64>) -> PathBuf {
    let mut make = Command::new("make");
    make.arg("--no-print-directory")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .arg("dist-pack")
        .arg(format!("DIST={}", out.display()))
        .arg(format!("MODULE={}", module_path().display()))
        // Under `make test` these describe the outer make (its jobserver),
        // not this one.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL");
    match epoch {
        Some(epoch) => make.env("SOURCE_DATE_EPOCH", epoch.to_string()),
        None => make.env_remove("SOURCE_DATE_EPOCH"),
    };
    let printed = run(make, None);
    let tarball = out.join(format!("{}.tar.gz", release_name()));
    assert_eq!(
        printed.trim(),
        tarball.display().to_string(),
        "make's output"
    );
    tarball
}

/// Unpacks `tarball` into the empty folder `into` with `tar`; returns the
/// one folder it holds, which must be named after the release.
fn unpack(tarball: &Path, into: &Path) -> PathBuf {
    let mut tar = Command::new("tar");
    tar.arg("-xzf").arg(tarball).arg("-C").arg(into);
    run(tar, None);
    let top: Vec<String> = fs::read_dir(into)
        .expect("read the unpacked folder")
        .map(|entry| {
            entry
                .expect("a folder entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(top, [release_name()], "one top folder");
    into.join(release_name())
}

/// A file's mtime in seconds since the epoch.
fn mtime(path: &Path) -> u64 {
    let modified = fs::metadata(path)
        .and_then(|meta| meta.modified())
        .unwrap_or_else(|e| panic!("mtime of {}: {e}", path.display()));
    modified
        .duration_since(UNIX_EPOCH)
        .expect("an mtime after 1970")
        .as_secs()
}

/// Every entry of the unpacked `folder`, itself included, has `epoch` as
/// its mtime.
fn assert_mtimes(folder: &Path, epoch: u64) {
    assert_eq!(mtime(folder), epoch, "{}", folder.display());
    for file in FILES {
        assert_eq!(mtime(&folder.join(file)), epoch, "{file}");
    }
}

/// The last commit's time, `make dist`'s default mtime.
fn last_commit_time() -> u64 {
    let mut git = Command::new("git");
    git.arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(["log", "-1", "--format=%ct"]);
    let printed = run(git, None);
    printed
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("git log -1 --format=%ct printed {printed:?}: {e}"))
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn read_text(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn the_tarball_holds_one_folder_whose_checksums_verify_and_packs_the_same_bytes_again() {
    let scratch = Scratch::new("layout");
    let name = release_name();
    let out = scratch.folder("out");
    let tarball = pack(&out, None);

    // The checksum beside the tarball verifies, from the folder both are in.
    let checked = run(
        command("sha256sum", &["-c", &format!("{name}.tar.gz.sha256")]),
        Some(&out),
    );
    assert_eq!(checked.trim(), format!("{name}.tar.gz: OK"));

    // One folder, the files in name order, all owned by 0:0.
    let mut list = Command::new("tar");
    list.arg("--numeric-owner").arg("-tvzf").arg(&tarball);
    let listing = run(list, None);
    let entries: Vec<(&str, &str)> = listing
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields[..] {
                [_, owner, .., path] => (owner, path),
                _ => panic!("tar -tv line {line:?}"),
            }
        })
        .collect();
    let expected: Vec<String> = std::iter::once(format!("{name}/"))
        .chain(FILES.iter().map(|file| format!("{name}/{file}")))
        .collect();
    let paths: Vec<&str> = entries.iter().map(|(_, path)| *path).collect();
    assert_eq!(paths, expected, "the tarball's entries, in order");
    for (owner, path) in &entries {
        assert_eq!(*owner, "0/0", "owner of {path}");
    }

    let folder = unpack(&tarball, &scratch.folder("unpacked"));
    // SHA256SUMS covers every other file, and each matches.
    let sums = read_text(&folder.join("SHA256SUMS"));
    let summed: BTreeSet<&str> = sums
        .lines()
        .filter_map(|line| line.split_once("  ").map(|(_, file)| file))
        .collect();
    let others: BTreeSet<&str> = FILES
        .iter()
        .copied()
        .filter(|f| *f != "SHA256SUMS")
        .collect();
    assert_eq!(summed, others, "the files SHA256SUMS names:\n{sums}");
    run(command("sha256sum", &["-c", "SHA256SUMS"]), Some(&folder));

    // The module is the one under test, executable; the rest is read-only
    // text. The licence is the repository's.
    assert!(
        read(&folder.join("libredislock.so")) == read(&module_path()),
        "the packed module differs from {}",
        module_path().display()
    );
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert_eq!(
        read(&folder.join("LICENSE")),
        read(&manifest.join("LICENSE"))
    );
    for file in FILES {
        let mode = fs::metadata(folder.join(file))
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777;
        let want = if *file == "libredislock.so" {
            0o755
        } else {
            0o644
        };
        assert_eq!(mode, want, "mode of {file}: {mode:o}");
    }

    // The templates are filled in; the README carries the Install section,
    // which names this very release; the snippet loads the module from
    // where that section unpacks it.
    let readme = read_text(&folder.join("README.md"));
    let conf = read_text(&folder.join("redis.conf"));
    for placeholder in ["@VERSION@", "@TARGET@", "@NAME@", "@INSTALL@"] {
        assert!(!readme.contains(placeholder), "README.md: {placeholder}");
        assert!(!conf.contains(placeholder), "redis.conf: {placeholder}");
    }
    assert!(readme.contains("\n## Install\n"), "{readme}");
    for step in [
        format!("sha256sum -c {name}.tar.gz.sha256"),
        format!("tar -xzf {name}.tar.gz -C /opt"),
        "enable-module-command".to_string(),
        "MODULE LIST".to_string(),
    ] {
        assert!(readme.contains(&step), "README.md lacks {step:?}");
    }
    let conf_lines: Vec<&str> = conf.lines().collect();
    for line in [
        format!("loadmodule /opt/{name}/libredislock.so").as_str(),
        "# lock.max-ttl 60000",
        "# lock.quarantine always",
    ] {
        assert!(
            conf_lines.contains(&line),
            "redis.conf lacks {line:?}:\n{conf}"
        );
    }

    // Every mtime is the last commit's time, and a second pack of the same
    // inputs is the same bytes.
    assert_mtimes(&folder, last_commit_time());
    let again = pack(&scratch.folder("again"), None);
    assert!(read(&again) == read(&tarball), "a second pack differs");

    // SOURCE_DATE_EPOCH, when set, is the time instead.
    let epoch = 1_700_000_000;
    let stamped = pack(&scratch.folder("stamped"), Some(epoch));
    assert_mtimes(
        &unpack(&stamped, &scratch.folder("stamped-unpacked")),
        epoch,
    );
}

/// The module's version as `MODULE LIST` shows it: major × 10000 + minor ×
/// 100 + patch of the crate version.
fn module_version() -> i64 {
    let version = env!("CARGO_PKG_VERSION");
    let core = version.split(['-', '+']).next().unwrap_or(version);
    core.split('.').fold(0, |total, part| {
        total * 100 + part.parse::<i64>().expect("a numeric version part")
    })
}

/// The `MODULE LIST` entry named `lock` as (field, value) pairs, if any.
/// Redis 8 and Valkey 9 list built-in modules too.
fn listed_lock(c: &mut redis::Connection) -> Option<Vec<(String, Value)>> {
    let modules: Vec<Vec<Value>> = c.value(&["MODULE", "LIST"]);
    modules
        .into_iter()
        .map(|module| {
            module
                .chunks(2)
                .map(|pair| (text(&pair[0]).unwrap_or_default(), pair[1].clone()))
                .collect::<Vec<_>>()
        })
        .find(|fields| {
            fields
                .iter()
                .any(|(k, v)| k == "name" && text(v).as_deref() == Some("lock"))
        })
}

/// `MODULE LIST` shows `lock`, at the crate's version, loaded from `module`.
fn assert_listed(server: &Server, module: &Path) {
    let mut c = server.conn();
    let fields = listed_lock(&mut c).expect("MODULE LIST shows no module lock");
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("MODULE LIST: no {name} in {fields:?}"))
    };
    assert_eq!(field("ver"), Value::Int(module_version()), "ver");
    assert_eq!(
        text(&field("path")),
        Some(module.display().to_string()),
        "loaded from the unpacked folder"
    );
}

/// Listed, described by `COMMAND INFO`, and working: a lock is taken.
fn assert_loaded(server: &Server, module: &Path) {
    assert_listed(server, module);
    let mut c = server.conn();
    let info: Vec<Value> = c.value(&["COMMAND", "INFO", "lock.acquire"]);
    let named = match info.as_slice() {
        [Value::Array(command)] => command.first().and_then(text),
        _ => None,
    };
    assert_eq!(
        named.as_deref(),
        Some("lock.acquire"),
        "COMMAND INFO: {info:?}"
    );
    let fence = c.acquire("dist:k", "owner-a", 10_000);
    assert!(fence.is_some_and(|f| f > 0), "LOCK.ACQUIRE: {fence:?}");
    assert_eq!(c.acquire("dist:k", "owner-b", 10_000), None, "held");
}

#[test]
fn the_packed_module_loads_from_redis_conf_the_command_line_and_module_load() {
    let scratch = Scratch::new("load");
    let name = release_name();
    let tarball = pack(&scratch.folder("out"), None);
    let folder = unpack(&tarball, &scratch.folder("unpacked"));
    let module = folder.join("libredislock.so");

    // 1. redis.conf: the tarball's snippet, its path pointed at the folder.
    let snippet = read_text(&folder.join("redis.conf"));
    let assumed = format!("/opt/{name}/libredislock.so");
    assert!(snippet.contains(&assumed), "{snippet}");
    let conf = snippet.replace(&assumed, &module.display().to_string());
    let from_conf = Server::builder()
        .label("redis-conf")
        .without_module()
        .config_file(&conf)
        .start();
    assert_loaded(&from_conf, &module);
    drop(from_conf);

    // The snippet's commented configs, uncommented, are read after the load.
    let mut configured = Vec::new();
    let conf_on: String = conf
        .lines()
        .map(|line| match line.strip_prefix("# lock.") {
            Some(config) => {
                let (name, value) = config.split_once(' ').expect("a config and its value");
                configured.push((format!("lock.{name}"), value.to_string()));
                format!("lock.{config}\n")
            }
            None => format!("{line}\n"),
        })
        .collect();
    assert_eq!(configured.len(), 2, "{snippet}");
    let with_configs = Server::builder()
        .label("redis-conf-configs")
        .without_module()
        .config_file(&conf_on)
        .start();
    assert_listed(&with_configs, &module);
    let mut c = with_configs.conn();
    for (name, value) in &configured {
        let got: Vec<String> = c.value(&["CONFIG", "GET", name]);
        assert_eq!(got, [name.clone(), value.clone()], "CONFIG GET {name}");
    }
    drop(with_configs);

    // 2. The command line: --loadmodule.
    let from_args = Server::builder()
        .label("command-line")
        .without_module()
        .config("loadmodule", module.display())
        .start();
    assert_loaded(&from_args, &module);
    drop(from_args);

    // 3. MODULE LOAD at run time: refused by default, as the README says...
    let path = module.display().to_string();
    let locked_down = Server::builder()
        .label("module-command-off")
        .without_module()
        .start();
    let mut c = locked_down.conn();
    let refused = c.err(&["MODULE", "LOAD", &path]);
    assert!(
        refused.starts_with("ERR MODULE command not allowed"),
        "MODULE LOAD without enable-module-command: {refused}"
    );
    assert!(listed_lock(&mut c).is_none(), "not loaded");
    let info: Vec<Value> = c.value(&["COMMAND", "INFO", "lock.acquire"]);
    assert_eq!(info, [Value::Nil], "COMMAND INFO of a command not loaded");
    drop(locked_down);

    // ...and loaded with enable-module-command yes.
    let at_run_time = Server::builder()
        .label("module-load")
        .without_module()
        .config("enable-module-command", "yes")
        .start();
    let mut c = at_run_time.conn();
    assert_eq!(c.call(&["MODULE", "LOAD", &path]), Ok(Value::Okay));
    assert_loaded(&at_run_time, &module);
}
