//! Reading a provider's replies as text: what every provider's client needs and no provider owns (the server's
//! bytes turned into one bounded line for an error message, `Retry-After` in both of its forms, a streamed JSONL
//! download split into lines).

use std::time::{Duration, SystemTime};

/// `text` with runs of whitespace and control characters collapsed to one space (a server's bytes must not
/// forge log lines or drive a terminal), cut to `max_chars` characters (marked with `…`).
pub fn one_line(text: &str, max_chars: usize) -> String {
    let collapsed = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if collapsed.chars().count() <= max_chars {
        return collapsed;
    }
    let mut cut: String = collapsed.chars().take(max_chars).collect();
    cut.push('…');
    cut
}

/// Reads a `Retry-After` value: delay seconds (`120`) or an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`, or one of
/// the two obsolete formats RFC 9110 §5.6.7 asks recipients to accept); a date in the past means "now". `None` when
/// the value is neither.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Splits a reply that arrives in pieces into its lines (without the `\n`), keeping only the unfinished line.
#[derive(Debug, Default)]
pub struct LineSplitter {
    /// The start of a line whose end has not arrived yet.
    partial: Vec<u8>,
}

impl LineSplitter {
    /// Hands every line that `bytes` completes to `line`.
    pub fn feed(&mut self, bytes: &[u8], mut line: impl FnMut(&[u8])) {
        let mut rest = bytes;
        while let Some(at) = rest.iter().position(|byte| *byte == b'\n') {
            if self.partial.is_empty() {
                line(&rest[..at]);
            } else {
                self.partial.extend_from_slice(&rest[..at]);
                line(&self.partial);
                self.partial.clear();
            }
            rest = &rest[at + 1..];
        }
        self.partial.extend_from_slice(rest);
    }

    /// Hands the last line, one without a closing `\n`, to `line` (when there is one).
    pub fn finish(self, mut line: impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            line(&self.partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn retry_after_accepts_seconds_and_http_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_700); // Sun, 06 Nov 1994 08:48:20 GMT
        assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now), Some(Duration::from_secs(77)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now), Some(Duration::ZERO));
        let leap_day = UNIX_EPOCH + Duration::from_secs(1_582_977_000); // Sat, 29 Feb 2020 11:50:00 GMT
        assert_eq!(parse_retry_after("Sat, 29 Feb 2020 12:00:00 GMT", leap_day), Some(Duration::from_secs(600)));
        assert_eq!(parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now), Some(Duration::ZERO), "the epoch itself");
        // The obsolete RFC 850 and asctime forms, which RFC 9110 asks recipients to read too.
        assert_eq!(parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now), Some(Duration::from_secs(77)));
        assert_eq!(parse_retry_after("Sun Nov  6 08:49:37 1994", now), Some(Duration::from_secs(77)));
        for bad in [
            "",
            "-5",
            "1.5",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 1994 25:00:00 GMT",
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Sun, 31 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn a_body_in_pieces_is_split_into_its_lines() {
        let mut lines: Vec<String> = Vec::new();
        let mut splitter = LineSplitter::default();
        for piece in [&b"a\nb"[..], b"c", b"\n\nd\n", b"e"] {
            splitter.feed(piece, |line| lines.push(String::from_utf8_lossy(line).into_owned()));
        }
        splitter.finish(|line| lines.push(String::from_utf8_lossy(line).into_owned()));
        assert_eq!(lines, ["a", "bc", "", "d", "e"]);
    }

    #[test]
    fn messages_are_one_bounded_line() {
        assert_eq!(one_line("a\n\tb\u{7}c ", 10), "a b c");
        assert_eq!(one_line("abcdef", 3), "abc…");
    }
}
