//! `docs/architecture.md` stays true (a "tidy" test, no Redis): its crate arrows are the workspace's dependencies
//! as `cargo metadata` reports them, and its code map names every file under `crates/*/src` and no file that does
//! not exist. A failure says exactly which lines or names to add or remove.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const DOC: &str = "docs/architecture.md";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the tests crate sits in the workspace").to_owned()
}

fn read_doc() -> String {
    std::fs::read_to_string(workspace_root().join(DOC)).unwrap_or_else(|e| panic!("read {DOC}: {e}"))
}

/// The lines of a level-2 section (`## <title>`), up to the next level-2 heading.
fn section<'a>(doc: &'a str, title: &str) -> Vec<&'a str> {
    let heading = format!("## {title}");
    let lines: Vec<&str> = doc.lines().collect();
    let start = lines
        .iter()
        .position(|line| line.trim_end() == heading)
        .unwrap_or_else(|| panic!("{DOC} has no section `{heading}`"));
    lines[start + 1..].iter().take_while(|line| !line.starts_with("## ")).copied().collect()
}

/// Every dependency of a workspace crate on another, as `a -> b` (`a -> b (dev)`, `a -> b (build)`), from
/// `cargo metadata`.
fn metadata_arrows() -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("run {cargo} metadata: {e}"));
    assert!(output.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let members: BTreeSet<&str> = packages.iter().filter_map(|package| package["name"].as_str()).collect();
    let mut arrows = BTreeSet::new();
    for package in packages {
        let from = package["name"].as_str().expect("package name");
        for dependency in package["dependencies"].as_array().expect("dependencies") {
            let to = dependency["name"].as_str().expect("dependency name");
            if !members.contains(to) {
                continue;
            }
            let kind = match dependency["kind"].as_str() {
                Some("dev") => " (dev)",
                Some("build") => " (build)",
                _ => "",
            };
            arrows.insert(format!("{from} -> {to}{kind}"));
        }
    }
    arrows
}

/// The arrows of the first fenced block of the section "Crate dependencies".
fn documented_arrows(doc: &str) -> BTreeSet<String> {
    let lines = section(doc, "Crate dependencies");
    let open = lines.iter().position(|line| line.starts_with("```")).expect("a fenced block of crate arrows");
    let block = lines[open + 1..].iter().take_while(|line| !line.starts_with("```"));
    block
        .map(|line| line.trim())
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (from, to) = line.split_once("->").unwrap_or_else(|| panic!("{DOC}: `{line}` is not `a -> b`"));
            format!("{} -> {}", from.trim(), to.trim())
        })
        .collect()
}

/// Every file under `crates/<crate>/src`, as `crates/<crate>/src/<path>`.
fn source_files() -> BTreeSet<String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                out.insert(path.strip_prefix(root).expect("under the root").to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let root = workspace_root();
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(root.join("crates")).expect("read crates/") {
        let src = entry.expect("dir entry").path().join("src");
        if src.is_dir() {
            walk(&src, &root, &mut files);
        }
    }
    files
}

/// What a code-map line calls a file: a backticked path ending in a source extension.
fn is_file_name(token: &str) -> bool {
    let extension_ok = [".rs", ".lua", ".css", ".js"].iter().any(|ext| token.ends_with(ext));
    extension_ok && !token.contains(['*', ' ']) && token.chars().all(|c| c.is_ascii_graphic())
}

/// The files the code map names: in a top-level bullet that names `crates/<crate>` (with its nested bullets and
/// wrapped lines), every backticked file name is a path inside that crate's `src/`. Returns each file with the
/// line of the section where its crate's bullet starts.
fn documented_files(doc: &str) -> BTreeMap<String, usize> {
    let mut bullets: Vec<(usize, String)> = Vec::new();
    for (number, line) in section(doc, "Code map").into_iter().enumerate() {
        if line.starts_with("- ") {
            bullets.push((number + 1, String::new()));
        }
        if let Some((_, text)) = bullets.last_mut() {
            text.push(' ');
            text.push_str(line.trim());
        }
    }
    let mut named = BTreeMap::new();
    for (number, text) in bullets {
        let tokens: Vec<&str> = text.split('`').skip(1).step_by(2).collect();
        let Some(krate) = tokens.first().and_then(|first| first.strip_prefix("crates/")) else { continue };
        for token in tokens.iter().skip(1).filter(|token| is_file_name(token)) {
            named.entry(format!("crates/{}/src/{token}", krate.trim_end_matches('/'))).or_insert(number);
        }
    }
    named
}

#[test]
fn the_crate_arrows_match_cargo_metadata() {
    let actual = metadata_arrows();
    let documented = documented_arrows(&read_doc());
    let add: Vec<&String> = actual.difference(&documented).collect();
    let remove: Vec<&String> = documented.difference(&actual).collect();
    assert!(
        add.is_empty() && remove.is_empty(),
        "{DOC}, section \"Crate dependencies\", drifted from `cargo metadata`:\n{}{}",
        add.iter().map(|arrow| format!("  add the line:    {arrow}\n")).collect::<String>(),
        remove.iter().map(|arrow| format!("  remove the line: {arrow}\n")).collect::<String>(),
    );
}

#[test]
fn the_code_map_names_every_source_file_and_only_those() {
    let files = source_files();
    let named = documented_files(&read_doc());
    let unnamed: Vec<&String> = files.iter().filter(|file| !named.contains_key(*file)).collect();
    let missing: Vec<(&String, &usize)> = named.iter().filter(|(file, _)| !files.contains(*file)).collect();
    let crate_of = |file: &str| file.split('/').take(2).collect::<Vec<_>>().join("/");
    let src_path = |file: &str| file.splitn(4, '/').nth(3).unwrap_or(file).to_owned();
    assert!(
        unnamed.is_empty() && missing.is_empty(),
        "{DOC}, section \"Code map\", drifted from the tree:\n{}{}",
        unnamed
            .iter()
            .map(|file| format!(
                "  add `{}` (a line saying what it is for) under the bullet `{}`\n",
                src_path(file),
                crate_of(file)
            ))
            .collect::<String>(),
        missing
            .iter()
            .map(|(file, line)| format!(
                "  remove or correct `{}` in the bullet `{}` (from line {line} of the section): no {file}\n",
                src_path(file),
                crate_of(file)
            ))
            .collect::<String>(),
    );
}

#[test]
fn the_code_map_reader_follows_the_crate_bullets() {
    let doc = "## Code map\n\n- `crates/a` — x.\n  - `lib.rs` and `m/n.rs`; `lua/*.lua` is a glob, `x\n    y`, \
               `z.rs`.\n- `tests/` — `it/main.rs`.\n\n## Crate dependencies\n\n```text\na -> b\nc ->  d (dev)\n```\n";
    let named: Vec<String> = documented_files(doc).into_keys().collect();
    assert_eq!(named, ["crates/a/src/lib.rs", "crates/a/src/m/n.rs", "crates/a/src/z.rs"]);
    let arrows: Vec<String> = documented_arrows(doc).into_iter().collect();
    assert_eq!(arrows, ["a -> b", "c -> d (dev)"]);
}

/// What builds or sends a Redis command in Rust source.
const REDIS_COMMAND_MARKERS: [&str; 4] = ["redis::cmd(", "redis::pipe(", "AsyncCommands", ".query_async("];

/// The crates that may send Redis commands to batchd's keys: the storage alone.
const REDIS_SPEAKERS: [&str; 1] = ["crates/batchd-queue/"];

/// Every source line outside the storage crate that builds or sends a Redis command, as `file:line: text`.
fn redis_commands_outside_storage() -> Vec<String> {
    let root = workspace_root();
    let mut found = Vec::new();
    for file in source_files() {
        if !file.ends_with(".rs") || REDIS_SPEAKERS.iter().any(|speaker| file.starts_with(speaker)) {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&file)).unwrap_or_else(|e| panic!("read {file}: {e}"));
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if REDIS_COMMAND_MARKERS.iter().any(|marker| code.contains(marker)) {
                found.push(format!("{file}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn only_the_storage_crate_sends_redis_commands() {
    let found = redis_commands_outside_storage();
    assert!(
        found.is_empty(),
        "{DOC}, \"Who sends Redis commands\": only batchd-queue sends Redis commands; move these into \
         crates/batchd-queue (inspect.rs, results.rs, ingress.rs or store/) and call them:\n  {}",
        found.join("\n  ")
    );
    // The check finds what it looks for: the storage crate itself is full of commands.
    let storage = std::fs::read_to_string(workspace_root().join("crates/batchd-queue/src/inspect.rs")).expect("read");
    assert!(REDIS_COMMAND_MARKERS.iter().any(|marker| storage.contains(marker)));
}
