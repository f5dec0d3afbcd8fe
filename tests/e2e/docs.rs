//! The documentation cannot drift from the binary: every configuration key (the shipped file's and
//! `--check-config`'s) is in the configuration reference with its default, every metric family the
//! binary exports is described on the operations page, every relative link in README.md and docs/
//! resolves (the file and the heading), and `--help` says where the manual is.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::*;
use crate::operations::described_metric_families;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every leaf key of a TOML document as a dotted path, with its value. Tables under `models` are
/// named per model, so they are documented as `models.NAME.<key>`.
fn leaves(prefix: &str, table: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
    for (key, value) in table {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        let path = match path.strip_prefix("models.") {
            Some(rest) => match rest.split_once('.') {
                Some((_, field)) => format!("models.NAME.{field}"),
                None => path,
            },
            None => path,
        };
        match value {
            toml::Value::Table(inner) => leaves(&path, inner, out),
            other => out.push((path, other.clone())),
        }
    }
}

/// The reference's table rows: key (first cell, without backquotes) -> the default cell.
fn reference_rows() -> Vec<(String, String)> {
    read(&repo("docs/configuration.md"))
        .lines()
        .filter_map(|line| {
            let mut cells = line.strip_prefix('|')?.split('|').map(str::trim);
            let key = cells.next()?.trim_matches('`').to_string();
            let default = cells.next()?.to_string();
            Some((key, default))
        })
        .collect()
}

/// How a default is written in the reference: the value as TOML would write it, without the
/// quotes of a string. Long texts (prompts, phrase lists) are described instead, so they are not
/// compared.
fn written(value: &toml::Value) -> Option<String> {
    let text = match value {
        toml::Value::String(s) if s.is_empty() => "\"\"".to_string(),
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    (text.len() <= 60).then_some(text)
}

fn assert_documented(source: &str, keys: &[(String, toml::Value)]) {
    let rows = reference_rows();
    let mut missing = Vec::new();
    for (key, value) in keys {
        match rows.iter().find(|(row, _)| row == key) {
            None => missing.push(format!("{key}: no row in docs/configuration.md")),
            Some((_, default)) => {
                if let Some(text) = written(value)
                    && !default.contains(&format!("`{text}`"))
                {
                    missing.push(format!("{key}: default `{text}` not in its row ({default})"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "{source}:\n{}", missing.join("\n"));
}

#[test]
fn every_key_of_the_shipped_configuration_is_in_the_reference_with_its_default() {
    let shipped: toml::Table = read(&repo("config/compactor.toml")).parse().unwrap();
    let mut keys = Vec::new();
    leaves("", &shipped, &mut keys);
    assert!(keys.len() >= 60, "{keys:?}");
    assert_documented("config/compactor.toml", &keys);
}

#[test]
fn every_key_check_config_prints_is_in_the_reference_with_its_default() {
    let (code, stdout, stderr) =
        run_binary(&["--config", repo("config/compactor.toml").to_str().unwrap(), "--check-config"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let effective: toml::Table = stdout.parse().unwrap();
    let mut keys = Vec::new();
    leaves("", &effective, &mut keys);
    // The built-in models table is printed too: one model's keys stand for all of them.
    let mut seen = BTreeSet::new();
    keys.retain(|(key, _)| seen.insert(key.clone()));
    keys.retain(|(key, _)| !key.starts_with("models.NAME."));
    assert!(keys.len() >= 60, "{keys:?}");
    assert_documented("--check-config", &keys);
}

#[tokio::test]
async fn every_metric_family_the_binary_exports_is_on_the_operations_page() {
    let (_fake, proxy) = ProxyProcess::with_fake("").await;
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    let mut families: BTreeSet<String> = described_metric_families().into_iter().collect();
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            families.insert(rest.split(' ').next().unwrap().to_string());
        }
    }
    assert!(families.len() >= 20, "{families:?}");
    let page = read(&repo("docs/operations.md"));
    let missing: Vec<_> = families.iter().filter(|family| !page.contains(&format!("`{family}"))).collect();
    assert!(missing.is_empty(), "families not described in docs/operations.md: {missing:?}");
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped, spaces
/// as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// Every `](target)` of a Markdown text outside code blocks.
fn links(markdown: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for part in line.split("](").skip(1) {
            if let Some(end) = part.find(')') {
                out.push(part[..end].to_string());
            }
        }
    }
    out
}

fn markdown_pages() -> Vec<PathBuf> {
    let mut pages = vec![repo("README.md")];
    for entry in std::fs::read_dir(repo("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

#[test]
fn every_relative_link_in_the_readme_and_the_manual_resolves() {
    let pages = markdown_pages();
    assert!(pages.len() >= 9, "{pages:?}");
    let mut broken = Vec::new();
    for page in &pages {
        let text = read(page);
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match link.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", page.display()));
                continue;
            }
            if let Some(anchor) = anchor
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&target)).contains(anchor)
            {
                broken.push(format!("{}: {link} (no such heading)", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_door_that_names_both_commands_and_the_manual() {
    let readme = read(&repo("README.md"));
    assert!(readme.lines().count() <= 250, "README.md has {} lines", readme.lines().count());
    for needle in
        ["cargo run --release", "scripts/test", "docs/README.md", "ANTHROPIC_BASE_URL", "config/compactor.toml"]
    {
        assert!(readme.contains(needle), "README.md lacks {needle}");
    }
}

#[test]
fn help_says_what_the_binary_does_how_it_is_configured_and_where_the_manual_is() {
    let (code, stdout, stderr) = run_binary(&["--help"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    for needle in
        ["reverse proxy", "--config", "--check-config", "healthcheck", "COMPACTOR_", "config/compactor.toml", "docs/"]
    {
        assert!(stdout.contains(needle), "--help lacks {needle}:\n{stdout}");
    }
}
