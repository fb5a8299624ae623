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

/// The Markdown files a reader finds commands in: README.md, docs/ and deploy/.
fn documents() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs"), root.join("deploy")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// A command line split into words as a shell would (quotes, backslashes), up to the first `|`, `;`, `&`, `>`,
/// `<` or `#` outside quotes; `<placeholder>` and `…` words stand for a value.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                in_word = true;
                for inner in chars.by_ref() {
                    if inner == c {
                        break;
                    }
                    word.push(inner);
                }
            }
            '\\' => {
                if let Some(next) = chars.next() {
                    word.push(next);
                    in_word = true;
                }
            }
            // `list|show` inside a word names alternatives; a `|` after a space is a pipe.
            '|' if in_word => word.push(c),
            '|' | ';' | '&' | '>' | '<' if !(c == '<' && in_word) => {
                if c == '<' && !in_word {
                    // A placeholder: `<id>`, `<when it started>`.
                    for inner in chars.by_ref() {
                        if inner == '>' {
                            break;
                        }
                    }
                    word.push('x');
                    in_word = true;
                    continue;
                }
                break;
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words.into_iter().map(|word| if word == "…" || word == "..." { "x".to_owned() } else { word }).collect()
}

/// Every `batchd ...` command shown in the docs, with where: command lines in code blocks (`$ batchd ...` in a
/// text block, `batchd ...` in a shell block), and inline code that names a command (`` `batchd dead list` ``).
/// The first are whole commands; the second may leave out required values.
fn shown_commands() -> Vec<(String, Vec<String>, bool)> {
    let mut shown = Vec::new();
    for path in documents() {
        let text = std::fs::read_to_string(&path).expect("read a document");
        let name = path.display().to_string();
        let mut fence: Option<String> = None;
        for (number, line) in text.lines().enumerate() {
            let place = format!("{name}:{}", number + 1);
            if let Some(language) = line.trim_start().strip_prefix("```") {
                fence = match fence {
                    Some(_) => None,
                    None => Some(language.trim().to_owned()),
                };
                continue;
            }
            if let Some(language) = &fence {
                let trimmed = line.trim_start();
                let (prompted, rest) = match trimmed.strip_prefix("$ ") {
                    Some(rest) => (true, rest),
                    None => (false, trimmed),
                };
                let shell = matches!(language.as_str(), "" | "sh" | "bash" | "shell" | "console");
                let words = shell_words(rest);
                let is_batchd = words.first().is_some_and(|word| word == "batchd" || word.ends_with("/batchd"));
                if is_batchd && (prompted || shell) {
                    shown.push((place, words, true));
                }
                continue;
            }
            for span in line.split('`').skip(1).step_by(2) {
                if span.starts_with("batchd ") {
                    shown.push((place.clone(), shell_words(span), false));
                }
            }
        }
    }
    shown
}

/// Checks a command named in prose: its subcommands exist (`a|b` alternatives each), and each option it names is
/// one of that command's (or a global one); values may be left out.
fn check_mention(words: &[String]) -> Result<(), String> {
    use clap::CommandFactory as _;
    let mut root = batchd::cli::command::Cli::command();
    root.build();
    let mut command = &root;
    let mut words = words.iter().skip(1).peekable();
    while let Some(word) = words.next() {
        if let Some(flag) = word.strip_prefix('-') {
            let flag = flag.split('=').next().unwrap_or_default();
            let arg = command.get_arguments().find(|arg| match flag.strip_prefix('-') {
                Some(long) => arg.get_long() == Some(long),
                None => flag.chars().count() == 1 && arg.get_short() == flag.chars().next(),
            });
            let Some(arg) = arg else {
                return Err(format!("`{}` has no option {word}", command.get_name()));
            };
            if arg.get_action().takes_values() && !word.contains('=') {
                words.next();
            }
        } else if command.has_subcommands() {
            let mut alternatives = word.split('|');
            let first = alternatives.next().unwrap_or_default();
            for other in alternatives {
                if command.find_subcommand(other).is_none() {
                    return Err(format!("`{}` has no command {other}", command.get_name()));
                }
            }
            command = command
                .find_subcommand(first)
                .ok_or_else(|| format!("`{}` has no command {first}", command.get_name()))?;
        }
    }
    Ok(())
}

/// Every `batchd ...` command the docs show parses with the real command line (the clap definition the binary
/// uses): whole command lines in code blocks parse as they are, commands named in prose name existing commands
/// and options. So a runbook cannot tell an operator to type `-n` or `tail --status failed` again.
#[test]
fn every_batchd_command_shown_in_the_docs_parses() {
    use clap::Parser as _;
    let shown = shown_commands();
    assert!(shown.len() > 50, "the docs show many commands: {}", shown.len());
    assert!(shown.iter().any(|(place, _, _)| place.contains("runbooks.md")), "runbooks.md is read");
    let mut wrong = Vec::new();
    for (place, words, whole) in &shown {
        let outcome = if *whole {
            let mut args = words.clone();
            args[0] = "batchd".into();
            match batchd::cli::command::Cli::try_parse_from(&args) {
                Ok(_) => Ok(()),
                Err(error)
                    if matches!(
                        error.kind(),
                        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                    ) =>
                {
                    Ok(())
                }
                Err(error) => Err(error.render().to_string().lines().next().unwrap_or_default().to_owned()),
            }
        } else {
            check_mention(words)
        };
        if let Err(why) = outcome {
            wrong.push(format!("{place}: `{}`: {why}", words.join(" ")));
        }
    }
    assert!(wrong.is_empty(), "commands in the docs that the CLI refuses:\n{}", wrong.join("\n"));
}

#[test]
fn shell_words_split_like_a_shell() {
    assert_eq!(
        shell_words("batchd pause --reason \"deploy freeze\" # why"),
        ["batchd", "pause", "--reason", "deploy freeze"]
    );
    assert_eq!(shell_words("batchd status <id> --json"), ["batchd", "status", "x", "--json"]);
    assert_eq!(shell_words("batchd completions bash > /etc/x"), ["batchd", "completions", "bash"]);
    assert_eq!(shell_words("batchd dead list|show"), ["batchd", "dead", "list|show"]);
    assert!(check_mention(&shell_words("batchd dead list|show|retry|purge")).is_ok());
    assert!(check_mention(&shell_words("batchd tail --status failed")).is_err());
    assert!(check_mention(&shell_words("batchd --namespace x jobs --state failed")).is_ok());
}
