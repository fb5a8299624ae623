//! What batchd keeps of a remote batch in the chunk's ledger: the provider's batch id and, for providers that
//! need them, the ids of the files and the URL of the results. Read leniently and bounded: the ledger is
//! writable by anyone who can write to Redis.

use batchd_core::RequestId;
use serde::{Deserialize, Serialize};

/// Longest file id or URL kept in a remote record, in bytes.
pub const MAX_REMOTE_REF_LEN: usize = 2048;

/// A remote batch as the ledger records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteBatch {
    /// The batch's id at the provider (Cloudflare's request id), once it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<RequestId>,
    /// The uploaded input file (OpenAI), so a resumed submit reuses it and it is deleted at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_file: Option<String>,
    /// The file of the batch's successful results (OpenAI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    /// The file of the batch's failed items (OpenAI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_file: Option<String>,
    /// Where the results are read (Anthropic's `results_url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results_url: Option<String>,
    /// The provider's own mark of which chunk the batch is and when its first create began (Anthropic: the
    /// custom-id prefix and a time), recorded before a create so an interrupted one can be recognised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

impl RemoteBatch {
    /// A batch known by its id alone (Cloudflare's request id).
    pub fn with_id(id: RequestId) -> Self {
        Self { id: Some(id), ..Self::default() }
    }

    /// Whether the record holds more than the id (so the ledger keeps it as a record of its own).
    pub fn has_refs(&self) -> bool {
        self.input_file.is_some()
            || self.output_file.is_some()
            || self.error_file.is_some()
            || self.results_url.is_some()
            || self.tag.is_some()
    }

    /// The record as the ledger stores it (JSON of the references; the id is stored in its own field).
    pub fn refs_json(&self) -> String {
        let refs = Self { id: None, ..self.clone() };
        serde_json::to_string(&refs).expect("a remote record always serialises")
    }

    /// The record from the ledger's id field and references field; `None` when the references are not a record
    /// batchd wrote (unreadable, or a reference over [`MAX_REMOTE_REF_LEN`]).
    pub fn from_ledger(id: Option<RequestId>, refs_json: Option<&str>) -> Option<Self> {
        let mut remote = match refs_json {
            None | Some("") => Self::default(),
            Some(text) if text.len() > 6 * MAX_REMOTE_REF_LEN => return None,
            Some(text) => serde_json::from_str::<Self>(text).ok()?,
        };
        let refs = [&remote.input_file, &remote.output_file, &remote.error_file, &remote.results_url, &remote.tag];
        if refs.iter().any(|value| value.as_ref().is_some_and(|value| value.len() > MAX_REMOTE_REF_LEN)) {
            return None;
        }
        remote.id = id;
        Some(remote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_the_ledger_fields() {
        let remote = RemoteBatch {
            id: Some(RequestId::parse("batch_1").expect("id")),
            input_file: Some("file-abc".into()),
            ..RemoteBatch::default()
        };
        assert!(remote.has_refs());
        assert_eq!(remote.refs_json(), r#"{"input_file":"file-abc"}"#);
        assert_eq!(RemoteBatch::from_ledger(remote.id.clone(), Some(&remote.refs_json())), Some(remote));
    }

    #[test]
    fn a_hostile_record_is_refused_not_trusted() {
        assert_eq!(RemoteBatch::from_ledger(None, Some("not json")), None);
        let long = format!(r#"{{"output_file":"{}"}}"#, "x".repeat(MAX_REMOTE_REF_LEN + 1));
        assert_eq!(RemoteBatch::from_ledger(None, Some(&long)), None);
        assert_eq!(RemoteBatch::from_ledger(None, None), Some(RemoteBatch::default()));
    }
}
