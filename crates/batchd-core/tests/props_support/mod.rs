//! What the property tests of batchd-core (`tests/decode_props.rs`) and batchd-cloudflare (`src/proptests.rs`,
//! which includes this file by path) share: their proptest configuration, which refuses to run fewer than
//! [`MIN_CASES`] cases, and JSON written as text, so numbers can be out of every Rust type's range, keys can repeat
//! and values can be pretty-printed.

use proptest::test_runner::Config;

/// The fewest cases a property may run: `PROPTEST_CASES=0` (or 1) would pass every property without testing it.
pub const MIN_CASES: u32 = 32;

/// The proptest configuration: `cases` unless `PROPTEST_CASES` says otherwise, never fewer than [`MIN_CASES`]
/// (panics instead); no regression files in the tree.
pub fn config(cases: u32) -> Config {
    let mut config = Config { failure_persistence: None, ..Config::default() };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    assert!(
        config.cases >= MIN_CASES,
        "PROPTEST_CASES={} runs too few cases to test anything; the minimum is {MIN_CASES}",
        config.cases
    );
    config
}

/// A JSON value as text-level parts, so numbers can be out of every Rust type's range and keys can repeat.
#[derive(Debug, Clone)]
pub enum Json {
    Null,
    Bool(bool),
    /// A JSON number exactly as written.
    Number(String),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Renders the value; `pretty` puts newlines and indentation inside arrays and objects.
    pub fn render(&self, pretty: bool, out: &mut String) {
        let separator = if pretty { ",\n  " } else { "," };
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(value) => out.push_str(if *value { "true" } else { "false" }),
            Json::Number(text) => out.push_str(text),
            Json::String(text) => out.push_str(&json_string(text)),
            Json::Array(items) => {
                out.push('[');
                for (position, item) in items.iter().enumerate() {
                    if position > 0 {
                        out.push_str(separator);
                    }
                    item.render(pretty, out);
                }
                out.push(']');
            }
            Json::Object(members) => {
                out.push_str(if pretty { "{\n  " } else { "{" });
                for (position, (key, value)) in members.iter().enumerate() {
                    if position > 0 {
                        out.push_str(separator);
                    }
                    out.push_str(&json_string(key));
                    out.push_str(if pretty { " : " } else { ":" });
                    value.render(pretty, out);
                }
                out.push_str(if pretty { "\n}" } else { "}" });
            }
        }
    }

    /// The rendered value.
    pub fn to_text(&self, pretty: bool) -> String {
        let mut out = String::new();
        self.render(pretty, &mut out);
        out
    }
}

/// `text` as a JSON string literal.
pub fn json_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serialises")
}
