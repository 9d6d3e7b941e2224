//! `wasq.toml`, the task manifest: what `wasq build` runs and what `wasq deploy` uploads
//! with which settings (Spin's `spin.toml` is the model).
//!
//! The `[deploy]` keys are the `wasq deploy` flags of the same name, parsed by the same
//! parsers, so the manifest and the command line cannot drift apart; flags given on the
//! command line win. A bad manifest is one error line naming the file, the line and the key.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use crate::units;

/// The manifest's file name, looked for in the current folder.
pub(crate) const FILE: &str = "wasq.toml";

/// Manifests are a screen of text; anything near this is not one.
const MAX_BYTES: u64 = 1 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    /// The function name the task deploys as.
    pub name: String,
    /// The component the build produces, relative to the manifest's folder.
    pub component: PathBuf,
    /// A shell command (`sh -c`) run in the manifest's folder by `wasq build`.
    pub build: Option<String>,
    #[serde(default)]
    pub deploy: DeploySettings,
    /// The folder the manifest was read from; relative paths resolve against it.
    #[serde(skip)]
    pub dir: PathBuf,
}

/// `[deploy]`: every key optional, each the `wasq deploy` flag of the same name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeploySettings {
    #[serde(default, deserialize_with = "duration")]
    pub timeout: Option<Duration>,
    #[serde(default, deserialize_with = "count")]
    pub fuel: Option<u64>,
    #[serde(default, deserialize_with = "size")]
    pub memory: Option<u64>,
    pub max_attempts: Option<u32>,
    #[serde(default, deserialize_with = "duration")]
    pub backoff: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub max_backoff: Option<Duration>,
    pub backoff_strategy: Option<Strategy>,
    pub jitter: Option<bool>,
    pub retry_traps: Option<bool>,
    pub allow_hosts: Option<Vec<String>>,
    pub events: Option<Vec<String>>,
    pub cron: Option<Vec<String>>,
    pub tz: Option<String>,
    pub missed: Option<Missed>,
    pub concurrency_limit: Option<u32>,
    pub concurrency_key: Option<String>,
    pub throttle: Option<String>,
    pub throttle_key: Option<String>,
    pub rate_limit: Option<String>,
    pub rate_limit_key: Option<String>,
    #[serde(default, deserialize_with = "text")]
    pub debounce: Option<String>,
    pub debounce_key: Option<String>,
    pub priority: Option<i32>,
    #[serde(default, deserialize_with = "text")]
    pub priority_aging: Option<String>,
    pub on_failure: Option<String>,
    pub queue: Option<String>,
    pub notify: Option<Vec<String>>,
    pub notify_attempts: Option<bool>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Strategy {
    Exponential,
    Fixed,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Missed {
    Skip,
    Latest,
}

impl Manifest {
    /// Reads the manifest at `path` (a file, or a folder holding `wasq.toml`).
    pub(crate) fn load(path: &Path) -> Result<Manifest, String> {
        let file = if path.is_dir() {
            path.join(FILE)
        } else {
            path.to_owned()
        };
        let shown = file.display().to_string();
        let meta = std::fs::metadata(&file).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "no {} in {}: create one with `wasq init`, or pass a component file",
                FILE,
                file.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .display()
            ),
            _ => format!("cannot read {shown}: {e}"),
        })?;
        if meta.len() > MAX_BYTES {
            return Err(format!("{shown}: over {MAX_BYTES} bytes; not a manifest"));
        }
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let mut manifest = parse(&text).map_err(|e| format!("{shown}{e}"))?;
        manifest.dir = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned();
        Ok(manifest)
    }

    /// The component's path, resolved against the manifest's folder.
    pub(crate) fn component_path(&self) -> PathBuf {
        if self.dir == Path::new(".") {
            return self.component.clone();
        }
        self.dir.join(&self.component)
    }
}

/// Parses manifest text. The error starts with the location (`:LINE: key: ...`), so the
/// caller prefixes the file name and gets one `file:line: key: message` line.
pub(crate) fn parse(text: &str) -> Result<Manifest, String> {
    let manifest: Manifest = toml::from_str(text).map_err(|e| locate(text, &e))?;
    wasq_core::names::check_function_name(&manifest.name).map_err(|e| {
        format!(
            ":{}: name: {e}",
            line_of(text, "name").map_or(1, |(n, _)| n)
        )
    })?;
    if manifest.component.as_os_str().is_empty() {
        return Err(format!(
            ":{}: component: must name the file the build produces",
            line_of(text, "component").map_or(1, |(n, _)| n)
        ));
    }
    Ok(manifest)
}

/// `:LINE: key: message` for a TOML or value error, on one line.
fn locate(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    let Some(span) = e.span() else {
        return format!(": {message}");
    };
    let start = span.start.min(text.len());
    let line = text[..start].matches('\n').count() + 1;
    // The key is what stands before `=` on the offending line (a value's error points at
    // the value, an unknown key's at the key); messages that name it already stay as they are.
    let line_text = text.lines().nth(line - 1).unwrap_or_default();
    match line_text.split_once('=') {
        Some((key, _)) if !message.contains('`') => {
            format!(":{line}: {}: {message}", key.trim())
        }
        _ => format!(":{line}: {message}"),
    }
}

/// The 1-based line on which a top-level `key =` appears.
fn line_of<'t>(text: &'t str, key: &str) -> Option<(usize, &'t str)> {
    text.lines().enumerate().find_map(|(i, l)| {
        let (k, _) = l.split_once('=')?;
        (k.trim() == key).then_some((i + 1, l))
    })
}

/// Accepts a string or a number as text, so `fuel = 1e10`, `fuel = "1e10"` and
/// `memory = 67108864` all read naturally.
struct Text;

impl Visitor<'_> for Text {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string or a number")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
}

fn parsed<'de, D, T>(d: D, parse: fn(&str) -> Result<T, String>) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
{
    let s = d.deserialize_any(Text)?;
    parse(&s).map(Some).map_err(de::Error::custom)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    parsed(d, units::parse_duration)
}

fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    parsed(d, units::parse_size)
}

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    parsed(d, units::parse_count)
}

/// Durations the server parses itself (debounce, priority aging): checked there, passed
/// through as text here.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    d.deserialize_any(Text).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = r#"
name = "hello"
component = "hello.wasm"
build = "npm run build"

[deploy]
timeout = "30s"
fuel = 1e10
memory = "256MiB"
max_attempts = 3
backoff = "10ms"
jitter = false
allow_hosts = ["api.example.com"]
events = ["user.signup"]
cron = ["0 9 * * *"]
missed = "latest"
concurrency_limit = 2
debounce = "1s"
"#;

    #[test]
    fn a_full_manifest_reads() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.name, "hello");
        assert_eq!(m.deploy.timeout, Some(Duration::from_secs(30)));
        assert_eq!(m.deploy.fuel, Some(10_000_000_000));
        assert_eq!(m.deploy.memory, Some(256 << 20));
        assert_eq!(m.deploy.backoff, Some(Duration::from_millis(10)));
        assert_eq!(m.deploy.jitter, Some(false));
        assert!(matches!(m.deploy.missed, Some(Missed::Latest)));
        assert_eq!(m.deploy.debounce.as_deref(), Some("1s"));
    }

    #[test]
    fn errors_name_the_line_and_the_key() {
        let bad_value = GOOD.replace("timeout = \"30s\"", "timeout = \"30 parsecs\"");
        let e = parse(&bad_value).unwrap_err();
        assert!(e.starts_with(":7: timeout: "), "{e}");

        let unknown = GOOD.replace("max_attempts", "max_attemps");
        let e = parse(&unknown).unwrap_err();
        assert!(e.starts_with(":10: ") && e.contains("max_attemps"), "{e}");

        let wrong_type = GOOD.replace("max_attempts = 3", "max_attempts = \"three\"");
        let e = parse(&wrong_type).unwrap_err();
        assert!(e.starts_with(":10: max_attempts: "), "{e}");

        let e = parse("component = \"x.wasm\"\n").unwrap_err();
        assert!(e.contains("missing field `name`"), "{e}");

        let e = parse("name = \"bad name\"\ncomponent = \"x.wasm\"\n").unwrap_err();
        assert!(e.starts_with(":1: name: "), "{e}");

        let e = parse("name = \"x\"\ncomponent = \"x.wasm\"\n[deploy\n").unwrap_err();
        assert!(e.starts_with(":3: "), "{e}");
    }

    #[test]
    fn a_file_over_the_size_bound_is_refused_unread() {
        let path = std::env::temp_dir().join(format!("wasq-big-{}.toml", std::process::id()));
        std::fs::write(&path, " ".repeat(MAX_BYTES as usize + 1)).unwrap();
        let e = Manifest::load(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(e.ends_with("over 1048576 bytes; not a manifest"), "{e}");
    }

    proptest! {
        #![proptest_config(crate::proptest_cases(2000))]
        /// Any text, and any mangling of a good manifest, is a manifest or one error line.
        #[test]
        fn the_parser_never_panics(text in ".{0,300}", cut in 0usize..400, junk in "[ -~\n]{0,20}") {
            for t in [text.clone(), {
                let mut s = GOOD.to_owned();
                let at = (0..=cut.min(s.len())).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
                s.insert_str(at, &junk);
                s
            }] {
                if let Err(e) = parse(&t) {
                    prop_assert!(!e.contains('\n'), "{e}");
                }
            }
        }
    }
}
