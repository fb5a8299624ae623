//! An item's top-level `external_reference`, the one contract for it whatever the provider.
//!
//! `external_reference` is a Workers AI field: that API echoes each item's reference in the item's response. The
//! other providers (OpenAI, Anthropic) have no such field: sent, it would reach their endpoint as an unknown body
//! parameter. So for them batchd finds each item's reference at take-in ([`find`]), keeps it in the chunk's ledger
//! ([`ChunkReferences`], keyed by the item's index in the job, so a split chunk's items keep theirs), leaves it out
//! of what it sends ([`strip`]: the rest of the item byte for byte) and echoes it on the item's response when the
//! job's result is assembled ([`echo`]), whether the item succeeded, failed, was not run or is missing.
//!
//! Two decisions, the same on both sides (what is stripped is what is echoed):
//! - only the item's **top level** counts: a member named `external_reference` inside another value is the item's
//!   own data and passes through;
//! - a key is compared as JSON reads it, after unescaping: `"external\u005freference"` is that member too (the API
//!   would read it as that parameter). A reference of `null` is stripped and, as Workers AI's `null`, means none.
//!
//! An item with the member twice has both stripped; the last one is echoed (what a JSON reader keeps).

use std::borrow::Cow;

use serde_json::value::RawValue;

use crate::JobOutput;

/// The member's name.
pub const MEMBER: &str = "external_reference";

/// Most bytes of references one chunk keeps in the ledger ([`ChunkReferences::as_str`]): a job whose references
/// for one batch take more is refused at take-in (`invalid_job`), before anything is sent. 4 MiB is about 80,000
/// references the size of a UUID.
pub const MAX_CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// One top-level member of an object's text: where it starts and ends (key to value), where its value is, and
/// whether its key is [`MEMBER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Member {
    /// Offset of the key's opening quote.
    start: usize,
    /// Offset just past the value.
    end: usize,
    /// Offset of the value's first byte.
    value_start: usize,
    /// Whether the key is [`MEMBER`].
    is_reference: bool,
}

/// Walks the top-level members of a JSON object's text, without building anything; `None` as soon as the text is
/// not an object (the job decoder has checked every item, so this only guards against misuse).
struct Members<'a> {
    /// The text.
    bytes: &'a [u8],
    /// Where the next member (or the closing brace) is looked for.
    at: usize,
    /// Whether the walk is over (the closing brace was reached, or the text was not an object).
    done: bool,
}

impl<'a> Members<'a> {
    fn new(text: &'a str) -> Self {
        let bytes = text.as_bytes();
        let open = skip_ws(bytes, 0);
        let done = bytes.get(open) != Some(&b'{');
        Self { bytes, at: open + 1, done }
    }

    /// The next member, `Ok(None)` at the closing brace, `Err(())` for text that is not an object.
    fn next_member(&mut self) -> Result<Option<Member>, ()> {
        if self.done {
            return Ok(None);
        }
        let bytes = self.bytes;
        let mut at = skip_ws(bytes, self.at);
        if bytes.get(at) == Some(&b',') {
            at = skip_ws(bytes, at + 1);
        }
        match bytes.get(at) {
            Some(b'}') => {
                self.done = true;
                return Ok(None);
            }
            Some(b'"') => {}
            _ => return Err(()),
        }
        let start = at;
        let key_end = string_end(bytes, start).ok_or(())?;
        let colon = skip_ws(bytes, key_end);
        if bytes.get(colon) != Some(&b':') {
            return Err(());
        }
        let value_start = skip_ws(bytes, colon + 1);
        let end = value_end(bytes, value_start).ok_or(())?;
        self.at = end;
        Ok(Some(Member { start, end, value_start, is_reference: key_is_reference(&bytes[start..key_end]) }))
    }
}

/// Whether a key's text (with its quotes) reads as [`MEMBER`].
fn key_is_reference(key: &[u8]) -> bool {
    let inner = &key[1..key.len() - 1];
    if !inner.contains(&b'\\') {
        return inner == MEMBER.as_bytes();
    }
    // Escaped: read it as JSON does (bounded by the key's length).
    std::str::from_utf8(key)
        .ok()
        .and_then(|key| serde_json::from_str::<String>(key).ok())
        .is_some_and(|key| key == MEMBER)
}

fn skip_ws(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Offset just past the string that opens at `start` (a `"`), escapes skipped.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start + 1;
    loop {
        match bytes.get(at)? {
            b'"' => return Some(at + 1),
            b'\\' => at += 2,
            _ => at += 1,
        }
    }
}

/// Offset just past the value that starts at `start`.
fn value_end(bytes: &[u8], start: usize) -> Option<usize> {
    match bytes.get(start)? {
        b'"' => string_end(bytes, start),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut at = start;
            loop {
                match bytes.get(at)? {
                    b'"' => {
                        at = string_end(bytes, at)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(at + 1);
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
        }
        _ => {
            let mut at = start;
            while !matches!(bytes.get(at), None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')) {
                at += 1;
            }
            (at > start).then_some(at)
        }
    }
}

/// Cheap first look: an item that holds neither the member's name nor any escape cannot have the member.
fn may_have(item: &str) -> bool {
    item.contains(MEMBER) || item.contains('\\')
}

/// The text of the item's top-level `external_reference` value, byte for byte (the last one when it has two);
/// `None` when it has none, when it is `null`, or when the item is not a JSON object.
pub fn find(item: &str) -> Option<&str> {
    if !may_have(item) {
        return None;
    }
    let mut members = Members::new(item);
    let mut found = None;
    while let Ok(Some(member)) = members.next_member() {
        if member.is_reference {
            found = Some(&item[member.value_start..member.end]);
        }
    }
    found.filter(|value| *value != "null")
}

/// The item without its top-level `external_reference` member(s) and the separating comma, everything else byte
/// for byte (whitespace and member order untouched): borrowed when it has none. One pass over the item, whatever
/// it holds. An item that is not a JSON object is returned as it is.
pub fn strip(item: &str) -> Cow<'_, str> {
    if !may_have(item) {
        return Cow::Borrowed(item);
    }
    let mut members = Members::new(item);
    let mut out: Option<String> = None;
    // End of the previous member (stripped or not), and whether a member has been kept yet.
    let mut previous_end: Option<usize> = None;
    let mut kept_any = false;
    loop {
        let member = match members.next_member() {
            Ok(Some(member)) => member,
            Ok(None) => break,
            Err(()) => return Cow::Borrowed(item),
        };
        if member.is_reference {
            // The text so far: the opening brace and the members kept before this one, without a separator.
            out.get_or_insert_with(|| {
                let mut text = String::with_capacity(item.len());
                text.push_str(&item[..previous_end.unwrap_or(member.start)]);
                text
            });
        } else {
            if let Some(text) = &mut out {
                // A member kept after a stripped one: the separator right before it, unless it is now the first.
                if kept_any {
                    text.push_str(&item[previous_end.unwrap_or(member.start)..member.start]);
                }
                text.push_str(&item[member.start..member.end]);
            }
            kept_any = true;
        }
        previous_end = Some(member.end);
    }
    match out {
        Some(mut text) => {
            text.push_str(&item[previous_end.unwrap_or(item.len())..]);
            Cow::Owned(text)
        }
        None => Cow::Borrowed(item),
    }
}

/// One chunk's references as the ledger keeps them: `[[<index in the job>,<reference>],...]`, each reference byte
/// for byte as the producer wrote it, only the items that have one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkReferences {
    /// The JSON text.
    text: String,
    /// How many items have one.
    count: usize,
}

impl ChunkReferences {
    /// The references of `items` (each with its index in the job); `None` when none has one.
    pub fn collect<'a>(items: impl IntoIterator<Item = (usize, &'a str)>) -> Option<Self> {
        let mut text = String::new();
        let mut count = 0;
        for (index, item) in items {
            let Some(value) = find(item) else {
                continue;
            };
            text.push(if count == 0 { '[' } else { ',' });
            text.push('[');
            text.push_str(&index.to_string());
            text.push(',');
            text.push_str(value);
            text.push(']');
            count += 1;
        }
        if count == 0 {
            return None;
        }
        text.push(']');
        Some(Self { text, count })
    }

    /// The JSON text the ledger keeps.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// How many items have a reference.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Reads a chunk's stored references back: `(index in the job, reference)` pairs; `None` when the text is not
    /// what [`ChunkReferences::collect`] writes.
    pub fn read(text: &str) -> Option<Vec<(usize, Box<RawValue>)>> {
        serde_json::from_str(text).ok()
    }
}

/// Puts each reference on the response of its item (`output.responses` in request order, one per item, as the
/// assembled result has them), whatever the response says; a reference whose index has no response is dropped.
pub fn echo(output: &mut JobOutput, references: Vec<(usize, Box<RawValue>)>) {
    for (index, reference) in references {
        if let Some(response) = output.responses.get_mut(index).filter(|response| response.index == index) {
            response.external_reference = Some(reference);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ItemResponse;

    /// Strips and checks that the rest is the item with the member removed, as text.
    fn stripped(item: &str) -> String {
        let out = strip(item).into_owned();
        serde_json::from_str::<serde_json::Value>(&out).unwrap_or_else(|e| panic!("{out:?} is not JSON: {e}"));
        out
    }

    #[test]
    fn the_member_is_removed_with_its_comma_wherever_it_is() {
        assert_eq!(stripped(r#"{"external_reference":"q1","text":"a"}"#), r#"{"text":"a"}"#, "first");
        assert_eq!(stripped(r#"{"text":"a","external_reference":"q1"}"#), r#"{"text":"a"}"#, "last");
        assert_eq!(stripped(r#"{"a":1,"external_reference":"q1","b":2}"#), r#"{"a":1,"b":2}"#, "middle");
        assert_eq!(stripped(r#"{"external_reference":"q1"}"#), "{}", "only");
        assert_eq!(stripped(r#"{ "external_reference" : {"k":[1,"}"]} }"#), "{  }", "only, with whitespace");
    }

    #[test]
    fn whitespace_and_order_elsewhere_are_untouched() {
        let item = "{\n  \"b\" : 2,\n  \"external_reference\": \"x\",\n  \"a\":[1, 2]\n}";
        assert_eq!(stripped(item), "{\n  \"b\" : 2,\n  \"a\":[1, 2]\n}");
        let item = "{ \"z\":1.50 ,  \"external_reference\" :\t\"x\" }";
        assert_eq!(stripped(item), "{ \"z\":1.50 }");
        let item = "{\"external_reference\":1,  \"z\" : true}";
        assert_eq!(stripped(item), "{\"z\" : true}");
    }

    #[test]
    fn a_nested_member_and_lookalikes_stay() {
        for item in [
            r#"{"input":{"external_reference":"inner"}}"#,
            r#"{"contexts":[{"text":"a","external_reference":"c1"}]}"#,
            r#"{"text":"\"external_reference\":\"x\""}"#,
            r#"{"external_reference_2":"x","external_referenc":"y"}"#,
            r#"{"text":"a\\"}"#,
        ] {
            assert!(matches!(strip(item), Cow::Borrowed(_)), "{item}");
            assert_eq!(find(item), None, "{item}");
        }
    }

    #[test]
    fn an_escaped_key_is_the_member_as_json_reads_it() {
        let item = r#"{"text":"a","external\u005freference":"q1"}"#;
        assert_eq!(stripped(item), r#"{"text":"a"}"#);
        assert_eq!(find(item), Some(r#""q1""#));
        let item = r#"{"\u0065xternal_reference":{"id":7},"text":"a\"b"}"#;
        assert_eq!(stripped(item), r#"{"text":"a\"b"}"#);
        assert_eq!(find(item), Some(r#"{"id":7}"#));
    }

    #[test]
    fn the_value_is_found_byte_for_byte_and_null_means_none() {
        assert_eq!(find(r#"{"external_reference" : {"a" : [1, 2.50]} , "x":1}"#), Some(r#"{"a" : [1, 2.50]}"#));
        assert_eq!(find(r#"{"x":1,"external_reference":-1.5e3}"#), Some("-1.5e3"));
        assert_eq!(find(r#"{"external_reference":"é \" ,}"}"#), Some(r#""é \" ,}""#));
        assert_eq!(find(r#"{"external_reference":null}"#), None);
        assert_eq!(stripped(r#"{"external_reference":null,"a":1}"#), r#"{"a":1}"#);
        assert_eq!(find(r#"{"external_reference":false}"#), Some("false"));
    }

    #[test]
    fn a_repeated_member_is_stripped_every_time_and_the_last_is_the_reference() {
        let item = r#"{"external_reference":1,"a":1,"external_reference":2,"external_reference":3,"b":2}"#;
        assert_eq!(stripped(item), r#"{"a":1,"b":2}"#);
        assert_eq!(find(item), Some("3"));
        assert_eq!(stripped(r#"{"external_reference":1,"external_reference":2}"#), "{}");
    }

    #[test]
    fn an_item_without_the_member_or_not_an_object_is_left_as_it_is() {
        for item in [r#"{"text":"a"}"#, "{}", "{ }", "[1,2]", r#""external_reference""#, "{\"external_reference\":"] {
            assert_eq!(strip(item), item);
        }
        assert_eq!(find(r#"["external_reference",1]"#), None);
    }

    #[test]
    fn stripping_is_linear_in_the_item() {
        // 20,000 repeats of the member: one pass, not one per repeat.
        let mut item = String::from("{");
        for i in 0..20_000 {
            item.push_str(&format!("\"external_reference\":{i},"));
        }
        item.push_str("\"a\":1}");
        let started = std::time::Instant::now();
        assert_eq!(stripped(&item), r#"{"a":1}"#);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn chunk_references_keep_job_indices_and_values_byte_for_byte() {
        let items = [
            r#"{"text":"a","external_reference":"q1"}"#,
            r#"{"text":"b"}"#,
            r#"{"external_reference" : {"k" : [1, 2]}}"#,
            r#"{"external_reference":null}"#,
        ];
        let references = ChunkReferences::collect(items.iter().enumerate().map(|(i, item)| (i + 10, *item)))
            .expect("two items have one");
        assert_eq!(references.as_str(), r#"[[10,"q1"],[12,{"k" : [1, 2]}]]"#);
        assert_eq!(references.count(), 2);
        let read = ChunkReferences::read(references.as_str()).expect("readable");
        let read: Vec<(usize, &str)> = read.iter().map(|(index, value)| (*index, value.get())).collect();
        assert_eq!(read, [(10, r#""q1""#), (12, r#"{"k" : [1, 2]}"#)]);
        assert_eq!(ChunkReferences::collect([(0, r#"{"text":"a"}"#)]), None);
        assert!(ChunkReferences::read("not json").is_none());
    }

    #[test]
    fn echo_puts_each_reference_on_its_items_response_whatever_it_says() {
        let raw = |text: &str| RawValue::from_string(text.to_owned()).expect("json");
        let mut output = JobOutput {
            responses: vec![
                ItemResponse {
                    index: 0,
                    success: true,
                    result: Some(raw("1")),
                    error: None,
                    external_reference: None,
                    resent: false,
                },
                ItemResponse::failure(1, Some(raw(r#"{"code":"server_error"}"#))),
                ItemResponse::failure(2, Some(raw(r#"{"code":"not_run"}"#))),
                ItemResponse::failure(3, Some(raw(r#"{"code":"missing"}"#))),
                ItemResponse::failure(4, None),
            ],
            usage: serde_json::json!({}),
            failed_batches: Vec::new(),
        };
        let references =
            vec![(0, raw(r#""s""#)), (1, raw(r#"{"o":1}"#)), (2, raw("2")), (3, raw("[3]")), (9, raw("9"))];
        echo(&mut output, references);
        let echoed: Vec<Option<&str>> =
            output.responses.iter().map(|response| response.external_reference.as_deref().map(RawValue::get)).collect();
        assert_eq!(echoed, [Some(r#""s""#), Some(r#"{"o":1}"#), Some("2"), Some("[3]"), None]);
    }
}
