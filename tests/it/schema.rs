//! The ledger schema has one source, batchd-core (a "tidy" test, no Redis).
//!
//! The storage scripts get every ledger field name, job and chunk state, script verdict and the `job#chunk` member
//! format from Rust: `batchd_queue::store` generates a Lua local for each into every script's prelude. This test
//! keeps it that way. It reads every Lua file and fails on a quoted string that is a schema name (a field, a
//! state, a verdict, a separator of the member or per-chunk field format), on an upper-case name a script uses
//! that the prelude does not define, and on a field constant in `ledger.rs` that the generated lists leave out.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use batchd_core::ledger::field;
use batchd_core::{ChunkState, JobState};
use batchd_queue::store::{SCRIPT_NAMES, script_source};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the tests crate sits in the workspace").to_owned()
}

/// Every Lua file of the storage scripts (the prelude included), with its text.
fn lua_files() -> Vec<(String, String)> {
    let dir = workspace_root().join("crates/batchd-queue/src/lua");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "lua"))
        .map(|path| {
            let name = path.file_name().expect("file name").to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).expect("read lua file"))
        })
        .collect();
    files.sort();
    assert!(files.len() > SCRIPT_NAMES.len(), "every script and the prelude are found in {}", dir.display());
    files
}

/// A Lua source split into its string literals (line, decoded text) and its code with strings and comments blanked.
#[derive(Debug, Default)]
struct Lexed {
    literals: Vec<(usize, String)>,
    code: String,
}

/// The closing bracket of a long bracket (`[[`, `[=[`, ...) starting at `at`, if one starts there.
fn long_bracket(chars: &[char], at: usize) -> Option<(usize, String)> {
    if chars.get(at) != Some(&'[') {
        return None;
    }
    let level = chars[at + 1..].iter().take_while(|c| **c == '=').count();
    (chars.get(at + 1 + level) == Some(&'[')).then(|| (at + 2 + level, format!("]{}]", "=".repeat(level))))
}

fn lex(source: &str) -> Lexed {
    let chars: Vec<char> = source.chars().collect();
    let mut lexed = Lexed::default();
    let mut line = 1;
    let mut i = 0;
    let find = |from: usize, closing: &str| -> usize {
        let closing: Vec<char> = closing.chars().collect();
        (from..chars.len()).find(|&k| chars[k..].starts_with(&closing)).map_or(chars.len(), |k| k + closing.len())
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '-' && chars.get(i + 1) == Some(&'-') {
            let end = match long_bracket(&chars, i + 2) {
                Some((_, closing)) => find(i + 2, &closing),
                None => (i..chars.len()).find(|&k| chars[k] == '\n').unwrap_or(chars.len()),
            };
            line += chars[i..end].iter().filter(|c| **c == '\n').count();
            lexed.code.extend(chars[i..end].iter().map(|c| if *c == '\n' { '\n' } else { ' ' }));
            i = end;
        } else if c == '\'' || c == '"' {
            let start_line = line;
            let mut text = String::new();
            let mut k = i + 1;
            while k < chars.len() && chars[k] != c {
                if chars[k] == '\\' && k + 1 < chars.len() {
                    k += 1;
                    text.push(match chars[k] {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                } else {
                    if chars[k] == '\n' {
                        line += 1;
                    }
                    text.push(chars[k]);
                }
                k += 1;
            }
            lexed.literals.push((start_line, text));
            lexed.code.push_str(" \"\" ");
            i = k + 1;
        } else if let Some((body, closing)) = long_bracket(&chars, i) {
            let end = find(body, &closing);
            let text: String = chars[body..end.saturating_sub(closing.len()).max(body)].iter().collect();
            lexed.literals.push((line, text));
            line += chars[i..end].iter().filter(|c| **c == '\n').count();
            lexed.code.push_str(" \"\" ");
            i = end;
        } else {
            if c == '\n' {
                line += 1;
            }
            lexed.code.push(c);
            i += 1;
        }
    }
    lexed
}

/// The Lua locals generated from Rust into every script: `(name, string value)` (a non-string local has no
/// value), read from the text Redis runs.
fn generated_locals() -> Vec<(String, Option<String>)> {
    let text = script_source(SCRIPT_NAMES[0]).expect("a script");
    let prelude_file = std::fs::read_to_string(workspace_root().join("crates/batchd-queue/src/lua/prelude.lua"))
        .expect("read prelude.lua");
    let generated = &text[..text.find(&prelude_file).expect("the prelude follows the generated names")];
    generated
        .lines()
        .filter_map(|line| line.strip_prefix("local "))
        .map(|rest| {
            let rest = rest.strip_prefix("function ").unwrap_or(rest);
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let value = rest
                .strip_prefix(&format!("{name} = '"))
                .and_then(|value| value.strip_suffix('\''))
                .filter(|value| !value.contains(['\'', '\\']))
                .map(str::to_owned);
            (name, value)
        })
        .collect()
}

/// What batchd-core says the schema is: every name a script must not write itself.
fn core_schema() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = BTreeSet::new();
    names.extend(field::JOB_FIELDS.iter().chain(&field::CHUNK_FIELDS).map(|(_, name)| (*name).to_owned()));
    names.extend(JobState::ALL.iter().map(|state| state.as_str().to_owned()));
    names.extend(ChunkState::ALL.iter().map(|state| state.as_str().to_owned()));
    names.insert(batchd_core::job::JOB_FIELD.to_owned());
    names
}

/// Whether a literal is a piece of the per-chunk field format `c<index>:<name>`: the prefix or the separator
/// alone, the separator followed by a name (`':state'`), or a whole field (`'c0:state'`).
fn builds_chunk_field(literal: &str) -> bool {
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let after_separator = literal.strip_prefix(field::CHUNK_SEPARATOR);
    let after_prefix = literal.strip_prefix(field::CHUNK_PREFIX);
    literal == field::CHUNK_PREFIX
        || after_separator.is_some_and(|rest| rest.is_empty() || rest.starts_with(is_name_char))
        || after_prefix
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()) && rest.contains(field::CHUNK_SEPARATOR))
}

#[test]
fn the_generated_prelude_defines_every_name_batchd_core_has() {
    let generated: BTreeSet<String> = generated_locals().into_iter().filter_map(|(_, value)| value).collect();
    let missing: Vec<String> = core_schema().difference(&generated).cloned().collect();
    assert!(missing.is_empty(), "script_constants in store/scripts.rs generates no Lua local for {missing:?}");
    let text = script_source(SCRIPT_NAMES[0]).expect("a script");
    for function in ["is_terminal", "is_finished", "chunk_field", "member"] {
        assert!(text.contains(&format!("local function {function}(")), "the prelude defines {function}");
    }
}

#[test]
fn no_script_writes_a_schema_name_itself() {
    let mut forbidden = core_schema();
    forbidden.extend(generated_locals().into_iter().filter_map(|(_, value)| value));
    // Field names with an underscore are never English: a message naming one must take it from the prelude too.
    let compound: Vec<&String> = forbidden.iter().filter(|name| name.contains('_')).collect();
    let mut stray = Vec::new();
    for (file, source) in lua_files() {
        for (line, literal) in lex(&source).literals {
            let why = if forbidden.contains(&literal) {
                Some("is a schema name")
            } else if builds_chunk_field(&literal) {
                Some("builds a per-chunk field (use chunk_field)")
            } else if literal.contains(batchd_core::ids::MEMBER_SEPARATOR) {
                Some("builds a schedule member (use member)")
            } else if compound.iter().any(|name| {
                literal.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|word| word == name.as_str())
            }) {
                Some("names a ledger field")
            } else {
                None
            };
            if let Some(why) = why {
                stray.push(format!("{file}:{line}: '{literal}' {why}"));
            }
        }
    }
    assert!(
        stray.is_empty(),
        "Lua literals that must come from batchd-core (use the F_/C_/JOB_/CHUNK_/verdict locals generated by \
         script_constants in crates/batchd-queue/src/store/scripts.rs; add a missing name to batchd-core and to the \
         generator):\n{}",
        stray.join("\n")
    );
}

#[test]
fn every_upper_case_name_a_script_uses_is_generated_from_rust() {
    let mut defined: BTreeSet<String> = generated_locals().into_iter().map(|(name, _)| name).collect();
    defined.extend(["KEYS".to_owned(), "ARGV".to_owned()]);
    let mut unknown = BTreeSet::new();
    for (file, source) in lua_files() {
        let code = lex(&source).code;
        for word in code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let upper = word.len() > 1
                && word.starts_with(|c: char| c.is_ascii_uppercase())
                && word.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if upper && !defined.contains(word) {
                unknown.insert(format!("{file}: {word}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "upper-case names used in scripts but not generated by script_constants in \
         crates/batchd-queue/src/store/scripts.rs (Redis would fail on them at run time):\n{}",
        unknown.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn every_ledger_field_constant_is_in_the_generated_lists() {
    let path = workspace_root().join("crates/batchd-core/src/ledger.rs");
    let source = std::fs::read_to_string(&path).expect("read ledger.rs");
    let listed: BTreeSet<&str> = field::JOB_FIELDS.iter().chain(&field::CHUNK_FIELDS).map(|(_, name)| *name).collect();
    let mut left_out = Vec::new();
    for line in source.lines() {
        let Some(rest) = line.trim().strip_prefix("pub const ") else { continue };
        let Some((name, value)) = rest.split_once(": &str = \"") else { continue };
        let value = value.trim_end_matches("\";");
        if ["CHUNK_PREFIX", "CHUNK_SEPARATOR"].contains(&name) {
            continue;
        }
        if !listed.contains(value) {
            left_out.push(format!("{name} = {value:?}"));
        }
    }
    assert!(
        left_out.is_empty(),
        "ledger field constants missing from field::JOB_FIELDS or field::CHUNK_FIELDS in {} (the scripts' \
         prelude is generated from those lists): {left_out:?}",
        path.display()
    );
}

#[test]
fn chunk_field_pieces_are_recognised_and_messages_are_not() {
    for piece in ["c", ":", ":state", "c0:state", "c12:"] {
        assert!(builds_chunk_field(piece), "{piece}");
    }
    for message in [": requests must be a JSON array", ": ", "chunk ", "cancelled"] {
        assert!(!builds_chunk_field(message), "{message}");
    }
}

#[test]
fn the_lexer_finds_literals_and_skips_comments() {
    let lexed =
        lex("-- 'state' in a comment\nlocal a = 'c' .. \"x\\\"y\" -- trailing 'done'\n--[[ 'long' ]] b = [[raw]]");
    assert_eq!(
        lexed.literals,
        [(2, "c".to_owned()), (2, "x\"y".to_owned()), (3, "raw".to_owned())],
        "{:?}",
        lexed.code
    );
    assert!(!lexed.code.contains("state") && lexed.code.contains("local a ="));
}
