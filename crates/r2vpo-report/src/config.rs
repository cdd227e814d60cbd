//! TOML configs with `--set key.path=value` overrides, for every command's
//! config and for library users who build one the way the CLI does.
//!
//! A config is a serde struct whose defaults are the paper's values. It is
//! built in three layers — the *serialised* default config, then the TOML
//! file merged into it table by table, then each `--set` in order — and the
//! fully resolved result is written into every run
//! folder so a run can be repeated from its folder alone. Unknown keys are
//! errors (the structs deny them), and every error names the file and the
//! dotted key at fault.

use std::path::Path;

use serde::{de::DeserializeOwned, Serialize};
use toml::{Table, Value};

/// What went wrong building a config; every message names the file, the
/// `--set` or the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        message: String,
    },
    /// The file is not valid TOML.
    #[error("{path}: invalid TOML: {message}")]
    Toml {
        /// The file.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// A `--set` is malformed or does not fit the config's shape, or a value
    /// does not deserialise (the message names the `--set`, the file or the
    /// key).
    #[error("{0}")]
    Invalid(String),
}

/// Merges `over` into `base`: tables recursively, any other value replaces.
pub fn merge(base: &mut Table, over: Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(Value::Table(b)), Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Loads a config of type `T` from an optional TOML file plus overrides.
///
/// Layers start from `T::default()` serialised, so a partial nested table
/// keeps the *parent's* defaults for the keys it omits (`--set
/// eval.data.count=50` keeps the eval split; plain serde would fill the
/// table from `DataConfig`'s own defaults).
pub fn load<T: DeserializeOwned + Serialize + Default>(file: Option<&Path>, sets: &[String]) -> Result<T, ConfigError> {
    let mut table = Table::try_from(T::default())
        .map_err(|e| ConfigError::Invalid(format!("cannot serialise the default config: {e}")))?;
    let source = match file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| ConfigError::Read { path: p.display().to_string(), message: e.to_string() })?;
            let over: Table = toml::from_str(&text)
                .map_err(|e| ConfigError::Toml { path: p.display().to_string(), message: e.to_string() })?;
            merge(&mut table, over);
            p.display().to_string()
        }
        None => "defaults".to_string(),
    };
    for s in sets {
        apply_override(&mut table, s)?;
    }
    let de = Value::Table(table);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        ConfigError::Invalid(match culprit(sets, &path, &inner.to_string()) {
            Some(set) => format!("--set {set}: key `{path}`: {inner}"),
            None if path == "." => format!("{source}: {inner}"),
            None => format!("{source}: key `{path}`: {inner}"),
        })
    })
}

/// The last `--set` that wrote the key an error is about: the key itself, a
/// key below it that the message names (an unknown field), or a table that
/// holds it. `None` blames the file (or the defaults).
fn culprit<'a>(sets: &'a [String], path: &str, message: &str) -> Option<&'a str> {
    let key = |s: &'a String| s.split_once('=').map_or(s.as_str(), |(k, _)| k).trim();
    sets.iter()
        .rev()
        .find(|s| {
            let k = key(s);
            let field = k.rsplit('.').next().unwrap_or(k);
            k == path
                || path.starts_with(&format!("{k}."))
                || (k.starts_with(&format!("{path}.")) || path == ".") && message.contains(&format!("`{field}`"))
        })
        .map(String::as_str)
}

/// Applies one `key.path=value` override to `table`. The value is parsed as a
/// TOML value (`0.2`, `true`, `"x"`, `[1, 2]`); anything that does not parse
/// as one is taken as a bare string, so `--set objective.kind=clip` works
/// without quotes.
pub fn apply_override(table: &mut Table, spec: &str) -> Result<(), ConfigError> {
    let Some((key, raw)) = spec.split_once('=') else {
        return Err(ConfigError::Invalid(format!("--set `{spec}`: expected KEY.PATH=VALUE")));
    };
    let key = key.trim();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(ConfigError::Invalid(format!("--set `{spec}`: empty key segment in `{key}`")));
    }
    let value = parse_value(raw.trim());
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().expect("split yields at least one part");
    let mut cur = table;
    for (i, p) in parts.iter().enumerate() {
        let entry = cur.entry(p.to_string()).or_insert_with(|| Value::Table(Table::new()));
        cur = match entry {
            Value::Table(t) => t,
            other => {
                return Err(ConfigError::Invalid(format!(
                    "--set `{spec}`: `{}` is a {}, not a table",
                    parts[..=i].join("."),
                    other.type_str()
                )))
            }
        };
    }
    cur.insert(last.to_string(), value);
    Ok(())
}

fn parse_value(raw: &str) -> Value {
    match toml::from_str::<Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| Value::String(raw.to_string())),
        Err(_) => Value::String(raw.to_string()),
    }
}

/// What a resolved config came from, for errors of its validation: the
/// file (or the defaults) and, only when there are any, the `--set`s, so a
/// bad `--set` value is not blamed on the file alone.
pub fn source(file: Option<&Path>, sets: &[String]) -> String {
    let base = file.map_or("defaults".to_string(), |p| p.display().to_string());
    if sets.is_empty() {
        format!("config {base}")
    } else {
        format!("config {base} with --set {}", sets.join(" --set "))
    }
}

/// The resolved config as TOML text, for writing into a run folder.
pub fn to_toml<T: Serialize>(cfg: &T) -> Result<String, ConfigError> {
    toml::to_string_pretty(cfg)
        .map_err(|e| ConfigError::Invalid(format!("cannot serialise the resolved config as TOML: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Inner {
        eps: f64,
        name: String,
        list: Vec<u32>,
    }
    impl Default for Inner {
        fn default() -> Self {
            Self { eps: 0.2, name: "a".into(), list: vec![1] }
        }
    }
    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Outer {
        seed: u64,
        inner: Inner,
    }

    fn sets(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn layers_defaults_file_and_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "seed = 3\n[inner]\neps = 0.5\n").unwrap();
        let c: Outer = load(Some(&p), &sets(&["inner.name=clip", "inner.list=[4, 5]", "seed=7"])).unwrap();
        assert_eq!(c, Outer { seed: 7, inner: Inner { eps: 0.5, name: "clip".into(), list: vec![4, 5] } });
        let d: Outer = load(None, &[]).unwrap();
        assert_eq!(d, Outer::default());
    }

    #[test]
    fn errors_name_the_key_and_file() {
        let e = load::<Outer>(None, &sets(&["inner.epz=0.1"])).unwrap_err().to_string();
        assert!(e.contains("inner") && e.contains("epz"), "{e}");
        let e = load::<Outer>(None, &sets(&["inner.eps=\"x\""])).unwrap_err().to_string();
        assert!(e.contains("inner.eps"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, "seed = [").unwrap();
        let e = load::<Outer>(Some(&p), &[]).unwrap_err().to_string();
        assert!(e.contains("bad.toml"), "{e}");
        let e = load::<Outer>(None, &sets(&["seed.x=1"])).unwrap_err().to_string();
        assert!(e.contains("seed"), "{e}");
        assert!(load::<Outer>(None, &sets(&["noequals"])).is_err());
        // A bad --set is blamed on the --set, a bad file key on the file.
        std::fs::write(&p, "[inner]\neps = 0.1\n").unwrap();
        let e = load::<Outer>(Some(&p), &sets(&["inner.epz=0.1"])).unwrap_err().to_string();
        assert!(e.starts_with("--set inner.epz=0.1") && !e.contains("bad.toml"), "{e}");
        std::fs::write(&p, "[inner]\nepz = 0.1\n").unwrap();
        let e = load::<Outer>(Some(&p), &sets(&["seed=3"])).unwrap_err().to_string();
        assert!(e.starts_with(&p.display().to_string()) && !e.contains("--set"), "{e}");
    }

    #[test]
    fn resolved_config_round_trips() {
        let c: Outer = load(None, &sets(&["inner.eps=0.28"])).unwrap();
        let text = to_toml(&c).unwrap();
        let back: Outer = toml::from_str(&text).unwrap();
        assert_eq!(back, c);
    }
}
