//! `cargo xtask python`: sets up the Python package `leap` from scratch: a
//! venv under `target/python/venv` (Debian's `python3-venv` installed where
//! the system Python lacks it), maturin, numpy and pytest from PyPI, the
//! abi3 wheel built by maturin in release mode and installed into the venv.
//! `--test` then runs its pytest suite.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

use crate::tools::{self, Tool};
use crate::util::{self, is_root, run};

/// Arguments of `cargo xtask python`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Then run the tests: the loopback ones, or those of `--markers`.
    #[arg(long)]
    test: bool,
    /// pytest marker expression (`netns` and `xdp` need root; `xdp` also
    /// `LEAP_XDP_OBJECT`).
    #[arg(long, requires = "test")]
    markers: Option<String>,
}

/// What PyPI gives the venv (mypy checks the type stubs against the module).
const PIP_PACKAGES: &[&str] = &["maturin>=1.9.4,<2", "numpy", "pytest", "mypy"];

/// pytest markers of the tests that need root (see `tests/conftest.py`).
pub const LOOPBACK: &str = "not netns and not xdp";

/// The venv with the wheel installed.
#[derive(Debug)]
pub struct Venv {
    dir: PathBuf,
}

impl Venv {
    /// The venv's interpreter.
    pub fn python(&self) -> PathBuf {
        self.dir.join("bin/python")
    }

    /// A command of the venv's interpreter, run from the repository root.
    pub fn command(&self) -> Command {
        // The venv's interpreter: the project made it.
        let mut c = tools::built(&self.python());
        c.current_dir(util::root()).env("VIRTUAL_ENV", &self.dir).env_remove("PYTHONPATH");
        c
    }

    /// Checks the type stubs (`leap/*.pyi`) against the installed module
    /// (mypy's stubtest: every name, signature and class as at run time).
    ///
    /// # Errors
    ///
    /// A stub that does not match.
    pub fn stubtest(&self) -> Result<()> {
        run(self.command().args(["-m", "mypy.stubtest", "leap"]).current_dir(std::env::temp_dir()))
    }

    /// Runs the tests `markers` selects (`-x`: stop at the first failure).
    ///
    /// # Errors
    ///
    /// A failing test, or none selected (pytest's exit code 5).
    pub fn pytest(&self, markers: &str, envs: &[(&str, &Path)]) -> Result<()> {
        let tests = util::root().join("leap-user/python/tests");
        let mut c = self.command();
        c.args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "-x", "-m", markers]).arg(&tests);
        for (k, v) in envs {
            c.env(k, v);
        }
        run(&mut c)
    }
}

/// `cargo xtask python`.
///
/// # Errors
///
/// A step that failed.
pub fn run_python(args: Args) -> Result<()> {
    let venv = setup()?;
    if args.test {
        if args.markers.is_none() {
            venv.stubtest()?;
        }
        venv.pytest(args.markers.as_deref().unwrap_or(LOOPBACK), &[])?;
    }
    Ok(())
}

/// Creates the venv if needed, installs what is missing from PyPI, builds
/// the wheel (release, `--locked`) and installs it: once per xtask run.
///
/// # Errors
///
/// A step that failed, naming it.
pub fn setup() -> Result<&'static Venv> {
    static VENV: OnceLock<Venv> = OnceLock::new();
    if let Some(v) = VENV.get() {
        return Ok(v);
    }
    let root = util::root();
    let dir = root.join("target/python/venv");
    if !dir.join("bin/python").is_file() {
        create_venv(&dir)?;
    }
    let venv = Venv { dir };
    let have_deps =
        venv.command().args(["-c", "import numpy, pytest, mypy"]).output().is_ok_and(|o| o.status.success());
    if !have_deps || !venv.dir.join("bin/maturin").is_file() {
        run(venv.command().args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]).args(PIP_PACKAGES))?;
    }
    let wheels = root.join("target/python/wheels");
    if wheels.is_dir() {
        std::fs::remove_dir_all(&wheels).with_context(|| format!("removing {}", wheels.display()))?;
    }
    // maturin from PyPI, in the venv the project made.
    let mut build = tools::built(&venv.dir.join("bin/maturin"));
    build
        .current_dir(&root)
        .args(["build", "--release", "--locked", "--manifest-path", "leap-user/python/Cargo.toml", "--interpreter"])
        .arg(venv.python())
        .arg("--out")
        .arg(&wheels);
    run(&mut build)?;
    let wheel = std::fs::read_dir(&wheels)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("maturin left no wheel in {}", wheels.display()))?;
    let name = wheel.file_name().unwrap_or_default().to_string_lossy().into_owned();
    if !name.contains("-abi3-") {
        bail!("{name} is not an abi3 wheel");
    }
    run(venv
        .command()
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "--force-reinstall", "--no-deps"])
        .arg(&wheel))?;
    run(venv.command().args(["-c", "import leap; print('leap', leap.__file__, 'over', ', '.join(leap.TRANSPORTS))"]))?;
    Ok(VENV.get_or_init(|| venv))
}

/// `python3 -m venv DIR` with the Python on PATH (or `$LEAP_PYTHON`); when
/// the system Python lacks its venv module (Debian's `python3-venv`), that
/// package is installed first (root).
fn create_venv(dir: &Path) -> Result<()> {
    let chosen = std::env::var_os("LEAP_PYTHON").map(PathBuf::from);
    let python = chosen.as_ref().map_or_else(|| Tool::Python3.program().to_string(), |p| p.display().to_string());
    let venv = || -> Result<Command> {
        let mut c = match &chosen {
            Some(p) => tools::command_at(Tool::Python3, p),
            None => tools::command(Tool::Python3)?,
        };
        c.args(["-m", "venv", "--clear"]).arg(dir);
        Ok(c)
    };
    let first = venv()?.output().with_context(|| format!("cannot run {python}: install python3 (>= 3.11)"))?;
    if first.status.success() {
        return Ok(());
    }
    // Debian's python says what is missing on stdout.
    let why = format!("{}{}", String::from_utf8_lossy(&first.stdout), String::from_utf8_lossy(&first.stderr));
    if why.contains("ensurepip") || why.contains("python3-venv") || why.contains("No module named venv") {
        if !is_root() {
            bail!("{python} -m venv failed: install python3-venv (`sudo apt-get install python3-venv`)\n{why}");
        }
        tools::apt_install(&["python3-venv"])?;
        return run(&mut venv()?);
    }
    bail!("{python} -m venv {} failed:\n{why}", dir.display())
}
