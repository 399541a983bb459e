//! What the two benches (`lockbench` and `instr`) share besides their
//! servers: their command line, and C shims preloaded into a process
//! (`LD_PRELOAD`) to pin what it would otherwise draw at random.

use std::fmt::Display;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// A bench's command line: `cargo bench --bench <name> [-- --quick] [--
/// --only a,b]`.
pub struct BenchArgs {
    /// `--quick`: fewer and shorter runs.
    pub quick: bool,
    /// `--only a,b`: the words after it, if given.
    pub only: Option<Vec<String>>,
}

impl BenchArgs {
    /// This process's arguments, or `None` without `--bench`: `cargo test
    /// --all-targets` runs a bench binary that way, and it should then do
    /// nothing but say how to run bench `name` (`make <target>`).
    pub fn parse(name: &str, target: &str) -> Option<BenchArgs> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if !args.iter().any(|a| a == "--bench") {
            eprintln!(
                "{name}: run it with `cargo bench --bench {name} [-- --quick]` or `make {target}`"
            );
            return None;
        }
        let only = args
            .iter()
            .position(|a| a == "--only")
            .and_then(|i| args.get(i + 1))
            .map(|list| list.split(',').map(str::to_string).collect());
        Some(BenchArgs {
            quick: args.iter().any(|a| a == "--quick"),
            only,
        })
    }
}

/// The exit status of bench `name` from its run: failure if a measurement
/// failed (`Ok(false)`) or the run could not go on (`Err`, printed).
pub fn exit_code<E: Display>(name: &str, run: Result<bool, E>) -> ExitCode {
    match run {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Compiles `source` (C) into `dir/<stem>.so` with the C compiler (`CC`,
/// default `cc`), for `LD_PRELOAD`; `what` names it in errors.
pub fn compile_preload(
    dir: &Path,
    stem: &str,
    source: &str,
    what: &str,
) -> Result<PathBuf, String> {
    let c_file = dir.join(format!("{stem}.c"));
    let shim = dir.join(format!("{stem}.so"));
    fs::write(&c_file, source).map_err(|e| format!("write {}: {e}", c_file.display()))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&shim)
        .arg(&c_file)
        .arg("-ldl")
        .output()
        .map_err(|e| format!("cannot run the C compiler {cc}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building {what} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(shim)
}
