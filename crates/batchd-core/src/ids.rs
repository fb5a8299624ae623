//! Identifier newtypes, parsed once at the boundary so invalid values cannot travel further.
//!
//! A `JobId` is safe inside a Redis key and a log line; a `ModelName` is safe inside a URL path;
//! a `RequestId` is whatever opaque token the Batch API returned, bounded in length.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest accepted job id, in bytes.
pub const MAX_JOB_ID_LEN: usize = 200;
/// Longest accepted model name, in bytes.
pub const MAX_MODEL_LEN: usize = 200;
/// Longest accepted remote request id, in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 200;

/// Why an identifier was refused; the message names the rule that was broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidId(String);

impl InvalidId {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A job's identity: 1–200 characters of `[A-Za-z0-9._:-]`, chosen by the producer or defaulted to
/// the ingress stream entry id. Two entries with the same id are one job.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    /// Parses a producer-supplied id.
    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        if raw.is_empty() {
            return Err(InvalidId::new("must not be empty"));
        }
        // Characters first: past this check a character is a byte, so the length below is exact in both units.
        if let Some(bad) = raw.chars().find(|c| !is_job_id_char(*c)) {
            return Err(InvalidId::new(format!("contains {bad:?}; allowed characters are A-Z a-z 0-9 . _ : -")));
        }
        if raw.len() > MAX_JOB_ID_LEN {
            return Err(InvalidId::new(format!("is {} characters long, the maximum is {MAX_JOB_ID_LEN}", raw.len())));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is a pack's id ([`PACK_PREFIX`]): a remote batch batchd filled from many jobs, with a ledger of
    /// its own and no result entry. Producers cannot use such ids (the job decoder refuses them).
    pub fn is_pack(&self) -> bool {
        self.0.starts_with(PACK_PREFIX)
    }
}

/// What a pack's id starts with ([`JobId::is_pack`]).
pub const PACK_PREFIX: &str = "pack:";

/// A packed chunk's `c<i>:pack` while it waits in its packing queue (then: the id of the pack that carries it).
pub const PACK_QUEUED: &str = "queued";

/// What separates a pack member's item count from its chunk in the pack's members list (`<n_items>:<job#chunk>`).
pub const PACK_MEMBER_SEPARATOR: &str = ":";

fn is_job_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for JobId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// A model name, which also picks the provider that runs it (LiteLLM's convention): a Workers AI name such as
/// `@cf/baai/bge-m3` (a scope starting with `@`, then two or more segments) is Cloudflare's; any other name is
/// `<provider>/<model>` (`openai/gpt-4o-mini`, `anthropic/claude-sonnet-4-5`), the provider in `[a-z0-9-]`. Every
/// segment is `[A-Za-z0-9._-]`, none of them `.` or `..`, so nothing in it can escape the URL path it is placed in
/// (no `?`, `#`, `%`, `\` or whitespace).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ModelName(String);

impl ModelName {
    /// Parses a model name.
    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        if raw.is_empty() {
            return Err(InvalidId::new("must not be empty"));
        }
        if raw.len() > MAX_MODEL_LEN {
            return Err(InvalidId::new(format!("is longer than {MAX_MODEL_LEN} bytes")));
        }
        let segments: Vec<&str> = raw.split('/').collect();
        let expected = "expected the shape @cf/<author>/<model>, openai/<model> or anthropic/<model>";
        let scoped = raw.starts_with('@');
        if (scoped && segments.len() < 3) || (!scoped && segments.len() < 2) {
            return Err(InvalidId::new(format!("{raw:?} is not a model name; {expected}")));
        }
        if !scoped && !is_provider_name(segments[0]) {
            return Err(InvalidId::new(format!(
                "{raw:?} does not start with a provider name (lower-case letters, digits, _ and -, at most \
                 {MAX_PROVIDER_LEN}); {expected}"
            )));
        }
        for (position, segment) in segments.iter().enumerate() {
            let body = if position == 0 { &segment[1..] } else { segment };
            if body.is_empty() {
                return Err(InvalidId::new(format!("{raw:?} has an empty path segment; {expected}")));
            }
            if *segment == "." || *segment == ".." {
                return Err(InvalidId::new(format!(
                    "{raw:?} contains the path segment {segment:?}, which is not allowed"
                )));
            }
            if let Some(bad) = body.chars().find(|c| !is_model_char(*c)) {
                return Err(InvalidId::new(format!(
                    "{raw:?} contains {bad:?}; allowed characters are A-Z a-z 0-9 . _ - and / between segments"
                )));
            }
        }
        Ok(Self(raw.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path segments (`["@cf", "baai", "bge-m3"]`), each safe to percent-encode into a URL path.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The provider the model routes to: [`CLOUDFLARE`] for a scoped name (`@cf/...`, `@hf/...`), else the
    /// name's first segment (`openai`, `anthropic`, ...).
    pub fn provider(&self) -> &str {
        if self.0.starts_with('@') { CLOUDFLARE } else { self.0.split_once('/').map_or("", |(provider, _)| provider) }
    }

    /// The name the provider knows the model by: the whole name for Cloudflare, what follows the provider's
    /// segment otherwise (`openai/gpt-4o-mini` → `gpt-4o-mini`).
    pub fn remote_name(&self) -> &str {
        if self.0.starts_with('@') { &self.0 } else { self.0.split_once('/').map_or(self.0.as_str(), |(_, rest)| rest) }
    }
}

/// The provider name of Workers AI's scoped model names (`@cf/...`, `@hf/...`).
pub const CLOUDFLARE: &str = "cloudflare";

/// Longest provider name, in bytes.
pub const MAX_PROVIDER_LEN: usize = 32;

/// Whether `name` can name a provider: 1 to [`MAX_PROVIDER_LEN`] of `[a-z0-9_-]` (a named instance's name,
/// `[providers.<name>]`, may hold `_`: it is part of an environment variable's name, where `-` cannot be).
pub fn is_provider_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_PROVIDER_LEN
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn is_model_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ModelName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// The Batch API's id for one submitted batch (a UUID in practice; treated as an opaque printable token).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct RequestId(String);

impl RequestId {
    /// Parses a request id returned by the API.
    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        if raw.is_empty() || raw.len() > MAX_REQUEST_ID_LEN {
            return Err(InvalidId::new(format!("request id must be 1-{MAX_REQUEST_ID_LEN} bytes, got {}", raw.len())));
        }
        if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(InvalidId::new("request id contains whitespace or control characters"));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// What separates the job id from the chunk index in a [`ChunkRef`]'s text (`<job_id>#<index>`). The storage
/// scripts build schedule members with the same separator (generated into their prelude from this constant).
pub const MEMBER_SEPARATOR: &str = "#";

/// One chunk of one job: the unit that is submitted and polled. Rendered as `<job_id>#<index>`, the member
/// of the schedule sorted set (`#` cannot occur in a job id, so the split is unambiguous).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChunkRef {
    /// The job the chunk belongs to.
    pub job_id: JobId,
    /// Position of the chunk within the job, from 0.
    pub index: u32,
}

impl ChunkRef {
    /// The chunk `index` of `job_id`.
    pub fn new(job_id: JobId, index: u32) -> Self {
        Self { job_id, index }
    }

    /// Parses the `<job_id>#<index>` form.
    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        let (job, index) = raw
            .rsplit_once(MEMBER_SEPARATOR)
            .ok_or_else(|| InvalidId::new(format!("{raw:?} is not a chunk reference (<job_id>#<index>)")))?;
        let index =
            index.parse().map_err(|_| InvalidId::new(format!("{raw:?} has a chunk index that is not a number")))?;
        Ok(Self { job_id: JobId::parse(job)?, index })
    }
}

impl fmt::Display for ChunkRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{MEMBER_SEPARATOR}{}", self.job_id, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_follow_the_documented_alphabet() {
        assert!(JobId::parse("inv-42").is_ok());
        assert!(JobId::parse("1700000000000-0").is_ok());
        assert!(JobId::parse("a.b_c:d-e").is_ok());
        assert_eq!(JobId::parse("").unwrap_err().to_string(), "must not be empty");
        assert_eq!(
            JobId::parse("a b").unwrap_err().to_string(),
            "contains ' '; allowed characters are A-Z a-z 0-9 . _ : -"
        );
        assert!(JobId::parse("x#1").is_err());
        assert!(JobId::parse("{tag}").is_err());
        assert!(JobId::parse(&"a".repeat(200)).is_ok());
        assert_eq!(
            JobId::parse(&"a".repeat(201)).unwrap_err().to_string(),
            "is 201 characters long, the maximum is 200"
        );
    }

    #[test]
    fn model_names_cannot_escape_the_url_path() {
        for good in [
            "@cf/baai/bge-m3",
            "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
            "@hf/thebloke/x",
            "openai/gpt-4o-mini",
            "anthropic/claude-sonnet-4-5",
        ] {
            assert!(ModelName::parse(good).is_ok(), "{good}");
        }
        assert_eq!(
            ModelName::parse("@cf/../../accounts").unwrap_err().to_string(),
            "\"@cf/../../accounts\" contains the path segment \"..\", which is not allowed"
        );
        for bad in [
            "bge-m3",
            "@cf/baai",
            "@cf//bge",
            "@cf/baai/bge?x=1",
            "@cf/baai/bge#frag",
            "@cf/baai/b%2e%2e",
            "@cf/baai/ bge",
            "@/baai/bge",
            "@cf/baai/bge/",
            "@cf/baai\\bge/x",
            "OpenAI/gpt-4o",
            "openai/",
            "openai/../x",
            "/gpt-4o",
        ] {
            assert!(ModelName::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn a_model_name_routes_to_its_provider() {
        let route = |name: &str| {
            let model = ModelName::parse(name).expect("valid");
            (model.provider().to_owned(), model.remote_name().to_owned())
        };
        assert_eq!(route("@cf/baai/bge-m3"), (CLOUDFLARE.to_owned(), "@cf/baai/bge-m3".to_owned()));
        assert_eq!(route("@hf/thebloke/x"), (CLOUDFLARE.to_owned(), "@hf/thebloke/x".to_owned()));
        assert_eq!(route("openai/gpt-4o-mini"), ("openai".to_owned(), "gpt-4o-mini".to_owned()));
        assert_eq!(route("anthropic/claude-sonnet-4-5"), ("anthropic".to_owned(), "claude-sonnet-4-5".to_owned()));
        assert_eq!(route("openai/ft/gpt-4o/x"), ("openai".to_owned(), "ft/gpt-4o/x".to_owned()));
    }

    #[test]
    fn chunk_refs_round_trip() {
        let chunk = ChunkRef::new(JobId::parse("inv-42").unwrap(), 3);
        assert_eq!(chunk.to_string(), "inv-42#3");
        assert_eq!(ChunkRef::parse("inv-42#3").unwrap(), chunk);
        assert!(ChunkRef::parse("inv-42").is_err());
        assert!(ChunkRef::parse("inv-42#x").is_err());
        assert!(MEMBER_SEPARATOR.chars().all(|c| !is_job_id_char(c)), "the separator cannot occur in a job id");
    }
}
