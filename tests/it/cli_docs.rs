//! `docs/cli.md` against the binary: every command's `--help`, found by walking the help's own "Commands:"
//! sections, is in the document verbatim. `BATCHD_UPDATE_DOCS=1 cargo nextest run -p batchd-tests docs_cli_md`
//! rewrites the blocks instead, and fails so that an update run is never mistaken for a check.

use batchd_tests::World;

use crate::cli_json::subcommands;
use crate::cli_ops::{batchd, run, text};

/// Every command path of the CLI (`[]`, `["submit"]`, `["dead", "list"]`, ...), found from the "Commands:" sections
/// of the help itself, so a new command cannot be left out of docs/cli.md.
async fn command_paths(world: &World) -> Vec<Vec<String>> {
    let mut paths: Vec<Vec<String>> = vec![Vec::new()];
    let mut index = 0;
    while index < paths.len() {
        let path = paths[index].clone();
        let help = help_text(world, &path).await;
        for name in subcommands(&help) {
            paths.push(path.iter().cloned().chain([name]).collect());
        }
        index += 1;
    }
    paths
}

async fn help_text(world: &World, path: &[String]) -> String {
    let mut command = batchd(world);
    command.args(path).arg("--help");
    let output = run(command).await;
    assert!(output.status.success(), "{path:?} --help: {}", text(&output.stderr));
    text(&output.stdout).lines().map(str::trim_end).collect::<Vec<_>>().join("\n")
}

/// docs/cli.md holds each command's `--help` verbatim, in a ```text block that starts with `$ batchd ... --help`.
/// With BATCHD_UPDATE_DOCS=1 the blocks are rewritten from the binary (and missing ones appended) instead, and the
/// test fails, so a run in update mode never counts as a pass.
#[tokio::test]
async fn docs_cli_md_matches_every_commands_help() {
    let world = World::new().await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    let doc = std::fs::read_to_string(&path).expect("docs/cli.md");
    let update = std::env::var_os("BATCHD_UPDATE_DOCS").is_some();
    let mut blocks: std::collections::HashMap<String, String> = Default::default();
    for command in command_paths(&world).await {
        let prompt = format!(
            "$ {}",
            ["batchd"]
                .into_iter()
                .chain(command.iter().map(String::as_str))
                .chain(["--help"])
                .collect::<Vec<_>>()
                .join(" ")
        );
        blocks.insert(prompt, help_text(&world, &command).await);
    }
    // Rebuild the document: each known block gets the binary's text; compare with what is there.
    let mut rebuilt = String::new();
    let mut seen = std::collections::HashSet::new();
    let mut lines = doc.lines().peekable();
    let mut stale = Vec::new();
    while let Some(line) = lines.next() {
        rebuilt.push_str(line);
        rebuilt.push('\n');
        if line != "```text" {
            continue;
        }
        let is_help = |next: &&&str| next.starts_with("$ batchd") && next.ends_with(" --help");
        let Some(prompt) = lines.peek().filter(is_help).map(|s| s.to_string()) else { continue };
        let mut documented = Vec::new();
        lines.next();
        for body in lines.by_ref() {
            if body == "```" {
                break;
            }
            documented.push(body);
        }
        let actual =
            blocks.get(&prompt).unwrap_or_else(|| panic!("docs/cli.md documents `{prompt}`, which is not a command"));
        if documented.join("\n") != *actual {
            stale.push(prompt.clone());
        }
        seen.insert(prompt.clone());
        rebuilt.push_str(&format!("{prompt}\n{actual}\n```\n"));
    }
    let mut missing: Vec<&String> = blocks.keys().filter(|prompt| !seen.contains(*prompt)).collect();
    missing.sort();
    if update {
        for prompt in &missing {
            let title = prompt.trim_start_matches("$ ").trim_end_matches(" --help");
            rebuilt.push_str(&format!("\n## `{title}`\n\n```text\n{prompt}\n{}\n```\n", blocks[*prompt]));
        }
        std::fs::write(&path, rebuilt).expect("write docs/cli.md");
        // Fails even so: a run with BATCHD_UPDATE_DOCS set rewrites the document and checks nothing, and must never
        // pass as a check (set by accident in CI, it would hide every drift).
        panic!(
            "BATCHD_UPDATE_DOCS is set: docs/cli.md was rewritten from --help (stale: {stale:?}, missing: \
             {missing:?}) and nothing was checked; review the diff and run again without it"
        );
    }
    assert!(
        stale.is_empty() && missing.is_empty(),
        "docs/cli.md has drifted from --help (stale: {stale:?}, missing: {missing:?}); regenerate the blocks with \
         BATCHD_UPDATE_DOCS=1 cargo nextest run -p batchd-tests docs_cli_md"
    );
}
