//! Every `r2vpo` command shown in README.md and docs/ still means something.
//!
//! Docs rot silently when a flag is renamed or a config key moves, so each
//! command line in a fenced code block is checked against the binary:
//! - its subcommand and flags parse (the line is run with `--help` appended:
//!   clap refuses an unknown flag or subcommand before it reaches the help);
//! - files it names under `configs/` exist;
//! - for run commands, its `--config` and `--set` overrides resolve and
//!   validate, through `r2vpo config show` exactly as the run would;
//! - the short read-only commands (`config show`, `llm verify`,
//!   `control info`) are run for real and must succeed.
//!
//! Lines with placeholders (`…`, `<run>`, `$VAR`, globs) are checked only as
//! far as the placeholders allow: they are skipped whole, and the test prints
//! how many lines it checked and skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Splits a shell command line into words: single and double quotes, and
/// backslash escapes inside double quotes (enough for the docs' commands).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    cur.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => cur.extend(chars.next()),
                        c => cur.push(c),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// `r2vpo …` command lines from the fenced code blocks of one Markdown file,
/// with continuation lines joined, trailing comments and `&` removed.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            continue;
        }
        let mut l = format!("{pending}{}", line.trim());
        pending.clear();
        if let Some(head) = l.strip_suffix('\\') {
            pending = format!("{head} ");
            continue;
        }
        if let Some(i) = l.find("  #").or_else(|| l.find(" # ")) {
            l.truncate(i);
        }
        let l = l.trim().trim_end_matches('&').trim();
        // Several commands on a line (`r2vpo serve … & r2vpo serve …`).
        for part in l.split(" & ") {
            // Environment assignments before the command (`RAYON_NUM_THREADS=2 r2vpo …`).
            let mut part = part.trim();
            while let Some((word, rest)) = part.split_once(' ') {
                let is_env = word.split_once('=').is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                });
                if !is_env {
                    break;
                }
                part = rest.trim_start();
            }
            if let Some((launch, inner)) = part.strip_prefix("r2vpo launch ").and_then(|p| p.split_once(" -- ")) {
                // `r2vpo launch … -- <command>`: the launch's own flags, and
                // the command it starts as a command of its own.
                out.push(format!("r2vpo launch {launch}"));
                out.push(format!("r2vpo {inner}"));
            } else if part.starts_with("r2vpo ") {
                out.push(part.to_string());
            } else if part.starts_with("torchrun ") || part.starts_with("srun ") {
                // A launcher's command: the r2vpo command it starts
                // (`torchrun … --no-python r2vpo …`, `srun …/r2vpo …`).
                let words: Vec<&str> = part.split_whitespace().collect();
                if let Some(i) = words.iter().position(|w| *w == "r2vpo" || w.ends_with("/r2vpo")) {
                    out.push(format!("r2vpo {}", words[i + 1..].join(" ")));
                }
            }
        }
    }
    out
}

fn placeholder(line: &str) -> bool {
    ["…", "<", "$", "*", "─", "[--", "/path/to/", "path/to/", "|"].iter().any(|p| line.contains(p))
}

/// The config kind `config show` resolves for a run command, if it is one.
fn config_kind(words: &[String]) -> Option<&'static str> {
    let sub: Vec<&str> = words.iter().map(String::as_str).filter(|w| !w.starts_with('-')).take(2).collect();
    match sub.as_slice() {
        ["llm", "train" | "learn"] => Some("llm-train"),
        ["llm", "eval"] => Some("llm-eval"),
        ["control", "train" | "compare"] => Some("control"),
        ["toy", "train" | "compare"] => Some("toy"),
        _ => None,
    }
}

fn run(args: &[String]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_r2vpo")).args(args).current_dir(repo()).output().expect("run r2vpo")
}

#[test]
fn every_documented_command_parses_and_resolves() {
    let root = repo();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);

    let (mut checked, mut skipped, mut failures) = (0, Vec::new(), Vec::new());
    for file in &files {
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        for line in commands(&std::fs::read_to_string(file).unwrap()) {
            if placeholder(&line) {
                skipped.push(format!("{name}: {line}"));
                continue;
            }
            checked += 1;
            let mut words = shell_words(&line);
            words.remove(0); // `r2vpo`
            let fail = |why: String| format!("{name}: `{line}`\n    {why}");

            let mut with_help = words.clone();
            with_help.push("--help".into());
            let out = run(&with_help);
            if !out.status.success() {
                failures.push(fail(format!("does not parse: {}", String::from_utf8_lossy(&out.stderr).trim())));
                continue;
            }
            for w in words.iter().filter(|w| w.starts_with("configs/")) {
                if !root.join(w).exists() {
                    failures.push(fail(format!("names {w}, which does not exist")));
                }
            }
            // Run commands: the same --config and --set through `config show`.
            if let Some(kind) = config_kind(&words) {
                let mut show = vec!["config".to_string(), "show".into(), kind.into()];
                let mut it = words.iter();
                while let Some(w) = it.next() {
                    if w == "--config" || w == "--set" {
                        show.push(w.clone());
                        show.extend(it.next().cloned());
                    }
                }
                let out = run(&show);
                if !out.status.success() {
                    failures.push(fail(format!(
                        "its config does not resolve: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
            }
            // The short read-only commands run for real.
            let head: Vec<&str> = words.iter().map(String::as_str).filter(|w| !w.starts_with('-')).take(2).collect();
            if matches!(head.as_slice(), ["config", "show"] | ["llm", "verify"] | ["control", "info"]) {
                let out = run(&words);
                if !out.status.success() {
                    failures.push(fail(format!("fails: {}", String::from_utf8_lossy(&out.stderr).trim())));
                }
            }
        }
    }
    println!("checked {checked} documented commands; skipped {} with placeholders:", skipped.len());
    for s in &skipped {
        println!("  {s}");
    }
    assert!(failures.is_empty(), "documented commands that no longer work:\n{}", failures.join("\n"));
    // The docs hold dozens of commands; a handful means the extraction broke.
    assert!(checked >= 25, "only {checked} documented commands were found to check");
}

#[test]
fn shell_words_follow_the_quoting_the_docs_use() {
    assert_eq!(
        shell_words(r#"a --set 'k=["x", "y"]' --set q="\"r\"" b"#),
        ["a", "--set", r#"k=["x", "y"]"#, "--set", r#"q="r""#, "b"]
    );
}

/// The r2vpo command a launcher starts is taken from its line.
#[test]
fn launcher_lines_yield_their_r2vpo_command() {
    let md = "```\ntorchrun --standalone --nproc-per-node 8 --no-python r2vpo dist check\n\
              srun target/torch/release/r2vpo dist check --iters 3\nsrun hostname\n```\n";
    assert_eq!(commands(md), vec!["r2vpo dist check", "r2vpo dist check --iters 3"]);
    let md = "```\nr2vpo launch --nproc-per-node 2 -- llm train --config c.toml\n```\n";
    assert_eq!(commands(md), vec!["r2vpo launch --nproc-per-node 2", "r2vpo llm train --config c.toml"]);
}
