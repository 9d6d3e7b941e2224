//! A task's folder: `wasq init` creates one, `wasq build` builds it, `wasq wit` prints the
//! contract it is written against.
//!
//! The SDKs, templates and WIT are compiled into the binary (`build.rs` makes cargo rebuild
//! when they change) because they are not published to a registry: a new folder must build
//! on a machine that has only this binary and the language's own toolchain.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, ValueEnum};
use include_dir::{Dir, include_dir};

use crate::manifest::Manifest;
use crate::out::{errln, outln};
use crate::units;

static WIT: Dir = include_dir!("$CARGO_MANIFEST_DIR/../wit");
static RUST_TEMPLATE: Dir = include_dir!("$CARGO_MANIFEST_DIR/../sdk/rust/template");
static RUST_SDK: Dir = include_dir!("$CARGO_MANIFEST_DIR/../sdk/rust/src");
static RUST_SDK_MANIFEST: &str = include_str!("../../sdk/rust/Cargo.toml");
static JS_TEMPLATE: Dir = include_dir!("$CARGO_MANIFEST_DIR/../sdk/js/template");
static JS_SDK: Dir = include_dir!("$CARGO_MANIFEST_DIR/../sdk/js/src");
static PYTHON_TEMPLATE: Dir = include_dir!("$CARGO_MANIFEST_DIR/../sdk/python/template");
static PYTHON_SDK: Dir = include_dir!("$CARGO_MANIFEST_DIR/../sdk/python/src");
static C_TEMPLATE: Dir = include_dir!("$CARGO_MANIFEST_DIR/../sdk/c/template");
static C_SDK: Dir = include_dir!("$CARGO_MANIFEST_DIR/../sdk/c/src");

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Lang {
    Rust,
    #[value(alias = "javascript")]
    Js,
    #[value(alias = "py")]
    Python,
    C,
}

impl Lang {
    /// The template, the SDK and the folder the SDK goes to inside the task.
    fn parts(self) -> (&'static Dir<'static>, &'static Dir<'static>, &'static str) {
        match self {
            // The Rust SDK finds the WIT at `../../wit`, as it does in this repository.
            Lang::Rust => (&RUST_TEMPLATE, &RUST_SDK, "sdk/rust/src"),
            Lang::Js => (&JS_TEMPLATE, &JS_SDK, ""),
            Lang::Python => (&PYTHON_TEMPLATE, &PYTHON_SDK, ""),
            Lang::C => (&C_TEMPLATE, &C_SDK, ""),
        }
    }

    /// What a fresh machine needs before `wasq build` works.
    fn needs(self) -> &'static str {
        match self {
            Lang::Rust => "rustup target add wasm32-wasip2",
            Lang::Js => "Node.js 20+ and npm (the build installs componentize-js from npm)",
            Lang::Python => "pip install componentize-py==0.25.1",
            Lang::C => "apt-get install clang lld wasi-libc libclang-rt-dev-wasm32",
        }
    }
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The task's language.
    #[arg(long, value_enum)]
    lang: Lang,
    /// The task's name: its folder and its function name (lowercase letters, digits and
    /// '-', starting with a letter).
    name: String,
}

/// Init names become folder, crate, npm package and function names: only what all accept.
fn check_task_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!(
            "invalid task name {}: use 1-64 lowercase letters, digits and '-', starting with a letter",
            wasq_core::names::quoted(name)
        );
    }
    Ok(())
}

pub fn init(args: InitArgs) -> Result<ExitCode> {
    let written = init_in(Path::new("."), args.lang, &args.name)?;
    outln!(
        "created {}/ ({} files): a {:?} task with one step, its SDK, the WIT and wasq.toml",
        args.name,
        written,
        args.lang
    );
    outln!("needs: {}", args.lang.needs());
    outln!(
        "next:  cd {} && wasq build && wasq deploy && wasq run {} --input '{{\"name\":\"Ada\"}}' --wait",
        args.name,
        args.name
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes the task folder `parent/name`; the number of files written.
pub fn init_in(parent: &Path, lang: Lang, name: &str) -> Result<usize> {
    check_task_name(name)?;
    let root = parent.join(name);
    if root.exists() {
        bail!(
            "{} already exists: pick another name, or remove it first",
            root.display()
        );
    }
    let (template, sdk, sdk_dest) = lang.parts();
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
    };
    let mut written = 0;
    for file in files(template) {
        let text = std::str::from_utf8(file.contents())
            .with_context(|| format!("template {} is not text", file.path().display()))?;
        let path = fill(&file.path().to_string_lossy());
        write(&root.join(path), fill(text).as_bytes())?;
        written += 1;
    }
    for file in files(sdk) {
        write(&root.join(sdk_dest).join(file.path()), file.contents())?;
        written += 1;
    }
    if matches!(lang, Lang::Rust) {
        write(
            &root.join("sdk/rust/Cargo.toml"),
            RUST_SDK_MANIFEST.as_bytes(),
        )?;
        written += 1;
    }
    written += write_wit(&root.join("wit"))?;
    Ok(written)
}

/// Every file under `dir`, recursively, but Python's bytecode caches (importing the SDK
/// while working on it leaves them in its source folder).
fn files(dir: &'static Dir<'static>) -> Vec<&'static include_dir::File<'static>> {
    let mut out: Vec<_> = dir
        .files()
        .filter(|f| f.path().extension().is_none_or(|e| e != "pyc"))
        .collect();
    for d in dir.dirs().filter(|d| !d.path().ends_with("__pycache__")) {
        out.extend(files(d));
    }
    out
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// The WIT tree (task.wit and its WASI deps) under `to`; the number of files written.
fn write_wit(to: &Path) -> Result<usize> {
    let mut n = 0;
    // vendor.sh is how this repository refreshes deps/, not part of the contract.
    for file in files(&WIT)
        .into_iter()
        .filter(|f| !f.path().ends_with("vendor.sh"))
    {
        write(&to.join(file.path()), file.contents())?;
        n += 1;
    }
    Ok(n)
}

#[derive(Debug, Args)]
pub struct WitArgs {
    /// Write the whole contract (task.wit and the WASI packages it uses) into this folder
    /// instead of printing task.wit.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

pub fn wit(args: WitArgs) -> Result<ExitCode> {
    match args.out {
        Some(dir) => {
            let n = write_wit(&dir)?;
            outln!("wrote {n} files to {}", dir.display());
        }
        None => {
            let task = WIT
                .get_file("task.wit")
                .ok_or_else(|| anyhow!("task.wit is missing from this build"))?;
            outln!("{}", String::from_utf8_lossy(task.contents()).trim_end());
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The task manifest (default: ./wasq.toml).
    #[arg(long, value_name = "PATH")]
    manifest: Option<PathBuf>,
}

pub fn build(args: BuildArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let path = args.manifest.unwrap_or_else(|| PathBuf::from("."));
    let built = build_at(&path)?;
    outln!(
        "built {} ({}) in {:.1}s{}",
        built.path.display(),
        units::format_size(built.component.len() as u64),
        started.elapsed().as_secs_f64(),
        if built.componentized {
            ", componentized with the WASI preview1 reactor adapter"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// What `wasq build` made.
pub struct Built {
    /// Where the component is, as the manifest names it.
    pub path: PathBuf,
    /// Its bytes.
    pub component: Vec<u8>,
    /// The build produced a core module, which wasq made a component.
    pub componentized: bool,
}

/// Builds the task of the manifest at `path` (a file or its folder).
pub fn build_at(path: &Path) -> Result<Built> {
    let m = Manifest::load(path).map_err(|e| anyhow!(e))?;
    if let Some(command) = &m.build {
        errln!("wasq build: {command}");
        let status = Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(&m.dir)
            .stdin(Stdio::null())
            // Our stdout carries the result line; the tool's chatter goes to stderr.
            .stdout(std::io::stderr())
            .env(
                "WASQ",
                std::env::current_exe().unwrap_or_else(|_| "wasq".into()),
            )
            .status()
            .context("cannot run the build command with sh")?;
        if !status.success() {
            bail!(
                "the build command failed ({status}): {command}",
                status = status
                    .code()
                    .map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}"))
            );
        }
    }
    let file = m.component_path();
    let bytes = std::fs::read(&file).with_context(|| {
        format!(
            "the build did not produce {} (wasq.toml `component`)",
            file.display()
        )
    })?;
    match kind(&bytes) {
        Kind::Component => Ok(Built {
            path: file,
            component: bytes,
            componentized: false,
        }),
        Kind::Module => {
            let component = componentize(&bytes)
                .with_context(|| format!("cannot make {} a component", file.display()))?;
            std::fs::write(&file, &component)
                .with_context(|| format!("cannot write {}", file.display()))?;
            Ok(Built {
                path: file,
                component,
                componentized: true,
            })
        }
        Kind::Other => bail!(
            "{} is not a WebAssembly component or module",
            file.display()
        ),
    }
}

enum Kind {
    Component,
    Module,
    Other,
}

/// The binary format's header: magic, then the version/layer word.
fn kind(bytes: &[u8]) -> Kind {
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => Kind::Module,
        Some([0, b'a', b's', b'm', _, _, 1, 0]) => Kind::Component,
        _ => Kind::Other,
    }
}

/// Wraps a core module built against WASI preview 1 (C with wasi-libc, Zig, TinyGo...) into
/// a component. The world comes from the module's `component-type` custom section, which
/// `wit-bindgen c` output carries.
fn componentize(module: &[u8]) -> Result<Vec<u8>> {
    use wasi_preview1_component_adapter_provider as adapter;
    let mut encoder = wit_component::ComponentEncoder::default()
        .validate(true)
        .module(module)?
        .adapter(
            adapter::WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
            adapter::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )?;
    encoder.encode()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_names_fit_every_toolchain() {
        for ok in ["t", "hello", "send-email-2"] {
            check_task_name(ok).unwrap();
        }
        for bad in ["", "Hello", "2fa", "a.b", "a_b", "-x", &"x".repeat(65)] {
            assert!(check_task_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_language_has_a_manifest_that_parses() {
        for lang in [Lang::Rust, Lang::Js, Lang::Python, Lang::C] {
            let (template, _, _) = lang.parts();
            let text = template
                .get_file("wasq.toml")
                .map(|f| std::str::from_utf8(f.contents()).unwrap())
                .unwrap_or_else(|| panic!("{lang:?} template has no wasq.toml"));
            let m = crate::manifest::parse(&text.replace("{{name}}", "t")).unwrap();
            assert_eq!(m.name, "t");
            assert!(m.build.is_some(), "{lang:?}");
        }
    }

    #[test]
    fn the_wit_is_embedded_without_the_vendoring_script() {
        let dir = std::env::temp_dir().join(format!("wasq-wit-{}", std::process::id()));
        let n = write_wit(&dir).unwrap();
        assert!(n > 5 && dir.join("task.wit").exists() && !dir.join("vendor.sh").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
