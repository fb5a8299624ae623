//! `batchd submit`'s check of an OpenAI job's endpoint before anything is enqueued (a job of the built-in `openai`
//! instance or of a named OpenAI-kind one, `[providers.<name>]`): a named endpoint must be one of the instance's
//! `endpoints` (the list the daemon accepts), and a model that serves one endpoint only (an embeddings or a
//! moderation model) gets that one: inferred when no endpoint was named with `--model`, demanded of a job file, and
//! any other refused (the API would answer every item with an error, or the job would go to chat completions).

use crate::settings::Settings;

/// The one endpoint a model serves, by the prefix of its OpenAI name.
const SINGLE_ENDPOINT: [(&str, &str); 3] = [
    ("text-embedding-", "/v1/embeddings"),
    ("omni-moderation-", "/v1/moderations"),
    ("text-moderation-", "/v1/moderations"),
];

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// The endpoint (or none) is fine as it is.
    Fine,
    /// No endpoint was named, and the model serves this one only.
    Only(&'static str),
}

/// Checks `endpoint` (as named by `--endpoint` or the job's `endpoint`) for `model` against the endpoints of the
/// OpenAI-kind instance it routes to ([`Settings::openai_endpoints`]); any other model is fine. `Err` says what is
/// wrong and what to give instead.
pub fn check(model: &str, endpoint: Option<&str>, settings: &Settings) -> Result<Checked, String> {
    let Some((instance, _)) = model.split_once('/') else {
        return Ok(Checked::Fine);
    };
    match settings.openai_endpoints(instance) {
        Some((allowed, setting)) => check_against(model, endpoint, &allowed, &setting),
        None => Ok(Checked::Fine),
    }
}

/// [`check`] against `allowed`, the endpoints `setting` lists (`openai.endpoints`).
fn check_against(model: &str, endpoint: Option<&str>, allowed: &[String], setting: &str) -> Result<Checked, String> {
    let Some((_, name)) = model.split_once('/') else {
        return Ok(Checked::Fine);
    };
    if let Some(endpoint) = endpoint
        && !allowed.iter().any(|known| known == endpoint)
    {
        let near = allowed.iter().find(|known| close(known, endpoint));
        let hint = near.map(|known| format!("; did you mean {known}?")).unwrap_or_default();
        return Err(format!(
            "endpoint {endpoint:?} is not one OpenAI batches accept ({setting}: {}){hint}",
            allowed.join(", ")
        ));
    }
    let Some(only) = SINGLE_ENDPOINT.iter().find(|(prefix, _)| name.starts_with(prefix)).map(|(_, only)| *only) else {
        return Ok(Checked::Fine);
    };
    match endpoint {
        None => Ok(Checked::Only(only)),
        Some(endpoint) if endpoint == only => Ok(Checked::Fine),
        Some(endpoint) => Err(format!("model {model} serves {only} only, not {endpoint}")),
    }
}

/// Whether two endpoints differ by a letter or two (a typo): one is a prefix of the other, or they share all but
/// their last two characters.
fn close(known: &str, given: &str) -> bool {
    let (short, long) = if known.len() <= given.len() { (known, given) } else { (given, known) };
    long.starts_with(short) && long.len() - short.len() <= 2
        || known.len() == given.len()
            && known.len() > 2
            && known.get(..known.len() - 2).is_some_and(|head| given.starts_with(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> Vec<String> {
        ["/v1/responses", "/v1/chat/completions", "/v1/embeddings"].map(str::to_owned).to_vec()
    }

    /// [`check_against`] `allowed` as `openai.endpoints`.
    fn check(model: &str, endpoint: Option<&str>, allowed: &[String]) -> Result<Checked, String> {
        check_against(model, endpoint, allowed, "openai.endpoints")
    }

    #[test]
    fn each_openai_kind_instance_is_checked_against_its_own_endpoints() {
        let mut settings = Settings::load_from(None, &Default::default()).expect("defaults");
        let section: crate::settings::InstanceSection =
            toml::from_str("kind = \"openai\"\nendpoints = [\"/v1/chat/completions\"]").expect("section");
        settings.providers.insert("groq".to_owned(), section);
        let checked = super::check("groq/llama-3.1-8b-instant", Some("/v1/embeddings"), &settings);
        assert_eq!(
            checked,
            Err("endpoint \"/v1/embeddings\" is not one OpenAI batches accept (providers.groq.endpoints: \
                 /v1/chat/completions)"
                .to_owned())
        );
        assert_eq!(super::check("openai/gpt-4o", Some("/v1/embeddings"), &settings), Ok(Checked::Fine));
        assert_eq!(super::check("gemini/gemini-2.5-flash", Some("/x"), &settings), Ok(Checked::Fine), "not OpenAI's");
    }

    #[test]
    fn endpoints_are_checked_inferred_and_demanded() {
        let allowed = allowed();
        let settings = Settings::load_from(None, &Default::default()).expect("defaults");
        assert_eq!(super::check("@cf/baai/bge-m3", Some("/anything"), &settings), Ok(Checked::Fine), "not ours");
        assert_eq!(check("openai/gpt-4o-mini", None, &allowed), Ok(Checked::Fine));
        assert_eq!(check("openai/gpt-4o-mini", Some("/v1/responses"), &allowed), Ok(Checked::Fine));
        assert_eq!(
            check("openai/text-embedding-3-small", Some("/v1/embedding"), &allowed),
            Err("endpoint \"/v1/embedding\" is not one OpenAI batches accept (openai.endpoints: /v1/responses, \
                 /v1/chat/completions, /v1/embeddings); did you mean /v1/embeddings?"
                .to_owned())
        );
        assert_eq!(check("openai/text-embedding-3-small", None, &allowed), Ok(Checked::Only("/v1/embeddings")));
        assert_eq!(
            check("openai/text-embedding-3-small", Some("/v1/chat/completions"), &allowed),
            Err("model openai/text-embedding-3-small serves /v1/embeddings only, not /v1/chat/completions".to_owned())
        );
        assert!(check("openai/gpt-4o", Some("/v2/chat"), &allowed).unwrap_err().ends_with("/v1/embeddings)"));
    }
}
